"""The data path of ``spectrace view`` over a live server's records: every stage, per
forward mode, whole run and last N steps, graph replays, token rows, draft steps, and
``--follow`` folding in what the server appends.

Traces are real records (spectrace.records) written as JSONL, by ``write_trace`` as the
other viewer tests do, and through the recorder's JSONL sink where a live file grows.
Expected statistics are computed here from the records' own numbers, independently of
the viewer: numel-weighted mean, pooled population std, largest absmax.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import pytest

from spectrace.cli.view import main as view_main
from spectrace.records import Call, Capture, Finding, Header, TensorMeta, TensorStats, Weights
from spectrace.viewers import accumulate
from spectrace.viewers.loader import TraceFollower, load_traces
from spectrace.viewers.model import ViewBuilder, ViewFilter, build_view
from spectrace.viewers.render import make_console, render_view
from tests.helpers import paths
from tests.helpers.traces import T0, write_trace
from tests.viewers.test_viewer import follow_json

REPO = paths.ROOT
TRACE = "trace-node1-4242-rank0.jsonl"
H, VOCAB, DRAFT_VOCAB, LAYERS = 64, 512, 128, 6
BOUNDS = [0, 2, 4]  # embedding output, after block 1, after block 3
DRAFT_STEPS = 3


# ----------------------------------------------------------------------- records
def live_header(pid: int = 4242, rank: int = 0) -> Header:
    return Header(spectrace_version="0.1.0", pid=pid, host="node1", rank=rank, started_unix=T0)


def live_capture(boundaries: list[int] | None = None, enabled: bool = True) -> Capture:
    bounds = BOUNDS if boundaries is None else boundaries
    return Capture(
        module="target",
        requested_ids=[b - 1 for b in bounds] if bounds else [-1, 1, 3],
        boundaries=bounds,
        num_layers=LAYERS,
        hidden_size=H,
        rule="sglang_llama",
        enabled=enabled,
    )


def tm(arg: str, shape: list[int], mean: float, std: float, absmax: float | None = None, nan: int = 0) -> TensorMeta:
    stats = TensorStats(mean=mean, std=std, absmax=4 * std if absmax is None else absmax, nan=nan, inf=0, numel=math.prod(shape))
    return TensorMeta(arg=arg, shape=shape, dtype="torch.bfloat16", device="cuda:0", stats=stats)


class Live:
    """A live EAGLE-3 server's call records, cycle by cycle: target verify (embedding,
    layers, aux concat chunks, norm, logits), draft extend (fc, layer, norm, logits), then
    a multi-step draft decode. ``drift`` scales the draft's std with the step."""

    def __init__(self, *, fc: bool = True, drift: float = 0.0, replay_every: int = 2, fc_width: int | None = None) -> None:
        self.fc = fc
        self.drift = drift
        self.replay_every = replay_every
        self.fc_width = fc_width  # an fc that is recorded but handed this width
        self.step = 0
        self.seq = 0
        self.cycle = 0

    def _call(self, role: str, module: str, mode: str, tokens: int, ins: list[TensorMeta], outs: list[TensorMeta], **kw: object) -> Call:
        self.seq += 1
        return Call(
            step=self.step,
            seq=self.seq,
            module=module,
            module_type=module.rsplit(".", 1)[-1],
            root=module.split(".", 1)[0],
            inputs=ins,
            outputs=outs,
            role=role,
            forward_mode=mode,
            tokens=tokens,
            t_unix=T0 + 1 + self.seq * 0.001,
            **kw,  # type: ignore[arg-type]
        )

    def cycles(self, n: int) -> list[Call]:
        out: list[Call] = []
        for _ in range(n):
            out += self._cycle()
        return out

    def _cycle(self) -> list[Call]:
        c = self.cycle
        self.cycle += 1
        replay = c % self.replay_every == 1
        g = {"graph_replay": replay, "graph": "cuda_graph_runner bs=4" if replay else None}
        tokens = (4, 8, 12)[c % 3]  # varying rows: a weighted mean differs from a mean of means
        calls = [
            self._call(
                "target.embed", "target.model.embed_tokens", "TARGET_VERIFY", tokens, [], [tm("output", [tokens, H], 0.001, 0.02)], **g
            )
        ]
        for k in range(LAYERS):
            resid = tm("output.residual_stream", [tokens, H], 0.01 * k + 0.001 * c, 0.3 * (k + 1) + 0.01 * (c % 4))
            calls.append(self._call(f"target.layer[{k}]", f"target.model.layers.{k}", "TARGET_VERIFY", tokens, [], [resid], **g))
        chunks = [
            tm(f"output.chunk[{i}]", [tokens, H], 0.002 * (i + 1), (0.02, 0.9, 1.35)[i] * (1 + 0.02 * (c % 3))) for i in range(len(BOUNDS))
        ]
        if self.fc:
            calls.append(self._call("target.aux_concat", "target.model.aux_concat", "TARGET_VERIFY", tokens, [], chunks, **g))
        calls.append(
            self._call("target.norm", "target.model.norm", "TARGET_VERIFY", tokens, [], [tm("output", [tokens, H], 0.0, 1.0)], **g)
        )
        calls.append(
            self._call(
                "target.lm_head",
                "target.lm_head",
                "TARGET_VERIFY",
                tokens,
                [],
                [tm("output", [tokens, VOCAB], -1.0, 2.5 + 0.1 * (c % 2))],
                **g,
            )
        )
        self.step += 1
        scale = 1 + self.drift * self.step
        if self.fc or self.fc_width:
            width = self.fc_width or 3 * H
            fc_in = tm("input[0]", [tokens, width], 0.001, 0.8 + 0.05 * (c % 2))
            calls.append(
                self._call(
                    "draft.fc", "draft.model.fc", "DRAFT_EXTEND", tokens, [fc_in], [tm("output", [tokens, H], 0.0, 0.2 * scale)], **g
                )
            )
        calls += self._draft("DRAFT_EXTEND", tokens, scale, None, g)
        self.step += 1
        for ds in range(DRAFT_STEPS):
            calls += self._draft("DECODE", 4, scale * (1 + 0.1 * ds), ds, g)
            self.step += 1
        return calls

    def _draft(self, mode: str, tokens: int, scale: float, ds: int | None, g: dict[str, object]) -> list[Call]:
        def call(role: str, module: str, out: TensorMeta) -> Call:
            return self._call(role, module, mode, tokens, [], [out], draft_step=ds, **g)

        return [
            call("draft.layer", "draft.model.midlayer", tm("output.residual_stream", [tokens, H], 0.05, 1.1 * scale)),
            call("draft.norm", "draft.model.norm", tm("output", [tokens, H], 0.0, 1.0 * scale)),
            call("draft.lm_head", "draft.lm_head", tm("output", [tokens, DRAFT_VOCAB], -0.2, 2.0 * scale)),
        ]


def d2t_weights() -> Weights:
    names = ["model.fc.weight", "model.midlayer.self_attn.qkv_proj.weight", "lm_head.weight", "hot_token_id"]
    return Weights(module="draft", offered=names, written=names, source="draft/model.safetensors")


def live_trace(tmp_path: Path, calls: list[Call], *, capture: Capture | None = None, extra: list[object] = ()) -> Path:  # type: ignore[assignment]
    write_trace(tmp_path / "run" / TRACE, [live_header(), capture or live_capture(), d2t_weights(), *extra, *calls])
    return tmp_path / "run"


# --------------------------------------------------------------------- expected
def combine(metas: list[TensorMeta]) -> dict[str, float]:
    """Statistics of the union of the tensors, from first principles."""
    n = sum(m.stats.numel for m in metas)
    mean = sum(m.stats.numel * m.stats.mean for m in metas) / n
    second = sum(m.stats.numel * (m.stats.std**2 + m.stats.mean**2) for m in metas) / n
    return {"mean": mean, "std": math.sqrt(second - mean * mean), "absmax": max(m.stats.absmax for m in metas), "numel": n}


def out_of(c: Call, arg: str | None = None) -> list[TensorMeta]:
    return [m for m in c.outputs if arg is None or m.arg == arg]


def assert_stats(got: dict[str, object] | object, want: dict[str, float]) -> None:
    if not isinstance(got, dict):
        got = got.model_dump()  # type: ignore[attr-defined]
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-9, abs=1e-12)
    assert got["std"] == pytest.approx(want["std"], rel=1e-9)
    assert got["absmax"] == pytest.approx(want["absmax"])
    assert got["numel"] == want["numel"]


def plain(view: object) -> str:
    buf = io.StringIO()
    make_console(buf, width=80, plain=True).print(render_view(view))  # type: ignore[arg-type]
    return buf.getvalue()


def view_json(path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    assert view_main([str(path), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def mode_rows(stage: dict) -> dict[str, dict]:
    return {m["label"]: m for m in stage["modes"]}


# ----------------------------------------------------------------------- tests
def test_per_mode_statistics_are_the_numel_weighted_combination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = Live().cycles(9)
    data = view_json(live_trace(tmp_path, calls), capsys=capsys)
    layer = data["datapath"]["layer"]
    assert [m["label"] for m in layer["modes"]] == ["DRAFT_EXTEND", "DECODE"]  # data-flow order
    for mode, row in mode_rows(layer).items():
        mine = [c for c in calls if c.role == "draft.layer" and c.forward_mode == mode]
        run = row["run"]
        assert run["records"] == len(mine)
        assert run["graph_replay"] == sum(c.graph_replay for c in mine) and run["eager"] == len(mine) - run["graph_replay"]
        assert run["rows"] == sum(c.tokens for c in mine)
        assert_stats(run["output"], combine([m for c in mine for m in out_of(c)]))
        assert run["output"]["records"] == len(mine)
    # The weighting matters: the mean of the per-record means and stds is not what is shown.
    layer2 = [c for c in calls if c.role == "target.layer[2]"]
    got = data["datapath"]["captures"][0]["layers"][1]["modes"][0]["run"]["output"]  # boundary 2 is layer[1] ...
    assert got["std"] == pytest.approx(combine([m for c in calls if c.role == "target.layer[1]" for m in out_of(c)])["std"])
    want = combine([m for c in layer2 for m in out_of(c)])
    naive_std = sum(c.outputs[0].stats.std for c in layer2) / len(layer2)
    naive_mean = sum(c.outputs[0].stats.mean for c in layer2) / len(layer2)
    assert abs(want["std"] - naive_std) > 1e-3 and abs(want["mean"] - naive_mean) > 1e-4
    tlm = data["datapath"]["target_lm_head"]["modes"][0]["run"]["output"]
    lm = [c for c in calls if c.role == "target.lm_head"]
    assert_stats(tlm, combine([m for c in lm for m in out_of(c)]))
    # The modes partition the stage; the total is all of them combined.
    total = layer["total"]["run"]
    assert total["records"] == sum(m["run"]["records"] for m in layer["modes"]) == layer["calls"]
    assert_stats(total["output"], combine([m for c in calls if c.role == "draft.layer" for m in out_of(c)]))
    assert layer["agg"]["std"] == pytest.approx(total["output"]["std"])
    # Target logits and draft logits, each at its own width; d2t maps between them.
    dp = data["datapath"]
    assert dp["target_lm_head"]["out_shapes"][0][-1] == VOCAB and dp["lm_head"]["out_shapes"][0][-1] == DRAFT_VOCAB
    assert (dp["draft_vocab"], dp["target_vocab"], dp["d2t"]["status"]) == (DRAFT_VOCAB, VOCAB, "loaded")
    assert [m["label"] for m in dp["target_lm_head"]["modes"]] == ["TARGET_VERIFY"]


def test_draft_steps_split_the_multi_step_draft(tmp_path: Path) -> None:
    calls = Live().cycles(6)
    dp = build_view(load_traces(live_trace(tmp_path, calls))).datapath
    for stage, role in ((dp.layer, "draft.layer"), (dp.norm, "draft.norm"), (dp.lm_head, "draft.lm_head")):
        assert [s.draft_step for s in stage.draft_steps] == list(range(DRAFT_STEPS))
        for s in stage.draft_steps:
            mine = [c for c in calls if c.role == role and c.draft_step == s.draft_step]
            assert s.run.records == len(mine) == 6
            assert_stats(s.run.output, combine([m for c in mine for m in out_of(c)]))
    assert dp.fc.draft_steps == [] and dp.aux.draft_steps == []  # no draft step on those records


def test_last_n_steps_window_differs_from_the_whole_run_when_values_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = Live(drift=0.05).cycles(12)
    path = live_trace(tmp_path, calls)
    data = view_json(path, "--window", "10", capsys=capsys)
    dp = data["datapath"]
    last_step = max(c.step for c in calls)
    recent = [c for c in calls if c.step > last_step - 10]
    assert dp["window_steps"] == 10 and (dp["window_first_step"], dp["window_last_step"]) == (last_step - 9, last_step)
    for mode in ("DRAFT_EXTEND", "DECODE"):
        row = mode_rows(dp["norm"])[mode]
        want_run = combine([m for c in calls if c.role == "draft.norm" and c.forward_mode == mode for m in out_of(c)])
        mine = [c for c in recent if c.role == "draft.norm" and c.forward_mode == mode]
        assert mine and row["window"]["records"] == len(mine) < row["run"]["records"]
        assert_stats(row["run"]["output"], want_run)
        assert_stats(row["window"]["output"], combine([m for c in mine for m in out_of(c)]))
        assert row["window"]["output"]["std"] > 1.1 * row["run"]["output"]["std"]  # drifted up
    # The default window (32 steps) is larger than this run's 10-step tail.
    default = view_json(path, capsys=capsys)["datapath"]
    assert default["window_steps"] == 32
    assert mode_rows(default["norm"])["DECODE"]["window"]["records"] > mode_rows(dp["norm"])["DECODE"]["window"]["records"]
    assert view_main([str(path), "--window", "0"]) == 2


def test_aux_concat_chunks_and_capture_boundaries(tmp_path: Path) -> None:
    calls = Live().cycles(5)
    dp = build_view(load_traces(live_trace(tmp_path, calls))).datapath
    aux = [c for c in calls if c.role == "target.aux_concat"]
    # Only chunks were written: together they are the concat output, combined exactly.
    assert dp.aux.status == "called" and dp.aux.out_shapes[0][-1] == 3 * H
    assert_stats(dp.aux.total.run.output, combine([m for c in aux for m in c.outputs]))
    assert [(ch.index, ch.boundary, ch.width) for ch in dp.aux.chunks] == [(0, 0, H), (1, 2, H), (2, 4, H)]
    for ch in dp.aux.chunks:
        assert_stats(ch.total.run.output, combine([m for c in aux for m in out_of(c, f"output.chunk[{ch.index}]")]))
        assert [m.label for m in ch.modes] == ["TARGET_VERIFY"]
    assert dp.aux.chunks[0].flags and "below" in dp.aux.chunks[0].flags[0]  # the embedding chunk's scale
    assert not dp.aux.chunks[1].flags and not dp.aux.chunks[2].flags
    # Boundary b is target.layer[b-1]'s residual stream (b = 0: the embedding output).
    (cap,) = dp.captures
    assert [(b.boundary, b.role) for b in cap.layers] == [(0, "target.embed"), (2, "target.layer[1]"), (4, "target.layer[3]")]
    for b in cap.layers:
        mine = [c for c in calls if c.role == b.role]
        assert b.module == mine[0].module and b.total.run.records == len(mine)
        assert_stats(b.total.run.output, combine([m for c in mine for m in out_of(c)]))


def test_aux_concat_with_its_full_output_uses_it(tmp_path: Path) -> None:
    calls = Live().cycles(3)
    for c in calls:
        if c.role == "target.aux_concat":
            tokens = c.outputs[0].shape[0]
            c.outputs.insert(0, tm("output", [tokens, 3 * H], 0.5, 7.0))
    dp = build_view(load_traces(live_trace(tmp_path, calls))).datapath
    assert dp.aux.total.run.output.std == pytest.approx(7.0) and dp.aux.total.run.output.mean == pytest.approx(0.5)
    assert len(dp.aux.chunks) == 3


def test_fc_in_and_out_and_its_widths(tmp_path: Path) -> None:
    calls = Live().cycles(4)
    dp = build_view(load_traces(live_trace(tmp_path, calls))).datapath
    fc = [c for c in calls if c.role == "draft.fc"]
    assert dp.fc.status == "called" and dp.fc.in_shapes[0][-1] == 3 * H and dp.fc.out_shapes[0][-1] == H
    assert_stats(dp.fc.total.run.input, combine([c.inputs[0] for c in fc]))
    assert_stats(dp.fc.total.run.output, combine([m for c in fc for m in out_of(c)]))
    w = dp.fc.widths
    assert (w.in_widths, w.in_features, w.hidden, w.verdict) == ([3 * H], 3 * H, H, "ok")


def test_fc_bypass_shows_an_fc_input_as_wide_as_hidden(tmp_path: Path) -> None:
    # The live bug: the target captures nothing, the draft gets H-wide hidden states and
    # its fc never runs; the engine's check says so in a finding.
    bypass = Finding(
        code="fc_bypass",
        severity="error",
        message="the target handed the draft 64-wide hidden states, fc expects 192",
        module="draft.model.fc",
        evidence={"seen_width": H, "fc_in_features": 3 * H},
        fix="capture the aux layers",
    )
    calls = Live(fc=False).cycles(4)
    path = live_trace(tmp_path / "a", calls, capture=live_capture([], enabled=False), extra=[bypass])
    view = build_view(load_traces(path))
    dp = view.datapath
    assert dp.fc.status == "bypassed" and dp.fc.calls == 0 and dp.aux.status == "disabled"
    assert (dp.fc.widths.in_widths, dp.fc.widths.hidden, dp.fc.widths.in_features, dp.fc.widths.verdict) == ([H], H, 3 * H, "bypass")
    text = plain(view)
    assert "fc  BYPASSED" in text and "input width 64 = hidden 64, fc in_features 192: fc BYPASSED" in text
    assert dp.layer.status == "called"  # the draft still ran, on the wrong input

    # Recorded the other way: an fc call that was handed the H-wide states.
    calls = Live(fc=False, fc_width=H).cycles(4)
    dp = build_view(load_traces(live_trace(tmp_path / "b", calls))).datapath
    assert dp.fc.calls == 4 and dp.fc.in_shapes[0][-1] == H
    assert dp.fc.widths.verdict == "bypass" and dp.fc.status == "bypassed"
    assert "input width 64 = hidden 64" in plain(build_view(load_traces(tmp_path / "b" / "run")))


def test_stages_without_records_stay_not_seen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = [c for c in Live().cycles(3) if c.role and c.role.startswith("target.")]
    path = live_trace(tmp_path, calls)
    dp = view_json(path, capsys=capsys)["datapath"]
    for name in ("fc", "layer", "norm", "lm_head"):
        assert dp[name]["status"] == "not seen" and dp[name]["calls"] == 0 and dp[name]["modes"] == [] and dp[name]["total"] is None
    assert dp["aux"]["status"] == "called" and dp["target_lm_head"]["status"] == "called"
    assert view_main([str(path), "--no-pager"]) == 0
    text = capsys.readouterr().out
    for label in ("fc", "decoder layer", "norm", "lm_head"):
        assert f"── {label}  not seen\n" in text, label


def test_graph_capture_records_count_but_carry_no_statistics(tmp_path: Path) -> None:
    live = Live()
    calls = live.cycles(2)
    captured = [
        c.model_copy(update={"graph_capture": True, "graph_replay": False, "step": live.step + i}, deep=True) for i, c in enumerate(calls)
    ]
    for c in captured:
        for m in c.outputs:
            m.stats = None
    dp = build_view(load_traces(live_trace(tmp_path, calls + captured))).datapath
    run = dp.norm.total.run
    assert run.graph_capture == sum(1 for c in captured if c.role == "draft.norm") and run.records == 2 * run.graph_capture
    assert run.output.records == run.records - run.graph_capture  # statistics from the others only
    assert run.eager + run.graph_replay + run.graph_capture == run.records


def test_nan_shows_in_the_row_and_as_an_anomaly_of_the_window(tmp_path: Path) -> None:
    live = Live()
    calls = live.cycles(6)
    last = [c for c in calls if c.role == "draft.lm_head"][-1]
    last.outputs[0].stats = TensorStats(mean=None, std=None, absmax=None, nan=7, inf=0, numel=last.outputs[0].stats.numel)
    view = build_view(load_traces(live_trace(tmp_path, calls)), ViewFilter(window_steps=4))
    lm = view.datapath.lm_head
    assert lm.total.run.output.nan == 7 and lm.total.window.output.nan == 7
    assert lm.total.run.output.records == lm.calls  # still counted: it had statistics
    assert "nan x7" in lm.anomalies and "nan x7 in the last 4 steps" in lm.anomalies
    decode = next(line for line in plain(view).splitlines() if "DECODE" in line and line.rstrip().endswith("!"))
    assert decode


def test_rendered_data_path_is_one_screen_of_aggregates(tmp_path: Path) -> None:
    calls = Live().cycles(40)
    view = build_view(load_traces(live_trace(tmp_path, calls)))
    text = plain(view)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    path_lines = lines[lines.index(next(line for line in lines if line.startswith("EAGLE-3 data path"))) :]
    path_lines = path_lines[: path_lines.index("")]
    assert len(path_lines) <= 45  # 40 cycles, ~1000 records: aggregated, never listed
    assert "whole run │ last 32 steps" in path_lines[0]
    assert path_lines[1].split() == ["mode", "recs", "graph", "rows", "mean", "std", "absmax", "│", "std", "absmax"]
    # Every bar sits in the same column: the rows line up under the heading.
    bars = {line.index("│", 4) for line in path_lines[1:] if "│" in line[4:] and line[4:].count("│") == 1 and " │ " in line}
    assert len(bars) == 1
    dp = view.datapath
    row = next(line for line in path_lines if line.lstrip("│ ").startswith("TARGET_VERIFY"))
    verify = dp.aux.modes[0]
    assert row.lstrip("│ ").split()[1:4] == [str(verify.run.records), str(verify.run.graph_replay), str(verify.run.rows)]
    for needle in (
        "b0 embed",
        "b2 layer 1",
        "chunk 0 b0",
        "chunk 2 b4",
        "aux concat  x40  target.model.aux_concat  [4..12,192] bf16",
        "fc  x40  draft.model.fc  [4..12,192] -> [4..12,64] bf16",
        "input width 192 = fc in_features 192 (hidden 64 x 3)",
        "input (all)",
        "DRAFT_EXTEND",
        "DECODE",
        "draft steps std/absmax  0 x40",
        "target lm_head  x40",
        "d2t  loaded  (draft)  draft vocab 128 -> target vocab 512",
    ):
        assert needle in text, needle


def test_json_carries_what_the_screen_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = live_trace(tmp_path, Live().cycles(5))
    data = view_json(path, capsys=capsys)
    view = build_view(load_traces(path))
    assert data["datapath"] == json.loads(view.datapath.model_dump_json())
    dp = data["datapath"]
    for key in ("captures", "aux", "fc", "layer", "norm", "lm_head", "target_lm_head", "d2t", "window_steps", "steps_seen"):
        assert key in dp
    slice_keys = {"label", "forward_mode", "draft_step", "run", "window"}
    assert set(dp["layer"]["modes"][0]) == slice_keys
    assert set(dp["layer"]["modes"][0]["run"]) == {"records", "graph_replay", "graph_capture", "eager", "rows", "output", "input"}
    assert dp["captures"][0]["layers"][1]["total"]["run"]["records"] == 5
    assert dp["aux"]["chunks"][2]["boundary"] == 4


def test_ranks_combine_and_rank_filter_narrows(tmp_path: Path) -> None:
    a, b = Live().cycles(3), Live(drift=0.1).cycles(4)
    write_trace(tmp_path / "run" / "trace-node1-1-rank0.jsonl", [live_header(1, 0), live_capture(), *a])
    write_trace(tmp_path / "run" / "trace-node1-2-rank1.jsonl", [live_header(2, 1), live_capture(), *b])
    ts = load_traces(tmp_path / "run")
    both = build_view(ts).datapath.norm.total.run
    assert both.records == sum(1 for c in a + b if c.role == "draft.norm")
    assert_stats(both.output, combine([m for c in a + b if c.role == "draft.norm" for m in out_of(c)]))
    one = build_view(ts, ViewFilter(rank=1)).datapath.norm.total.run
    assert_stats(one.output, combine([m for c in b if c.role == "draft.norm" for m in out_of(c)]))
    # --step narrows the data path too.
    stepped = build_view(ts, ViewFilter(step_min=0, step_max=4)).datapath.norm.total.run
    assert stepped.records == sum(1 for c in a + b if c.role == "draft.norm" and c.step <= 4)


# ------------------------------------------------------------------------ follow
def _append(path: Path, calls: list[Call]) -> None:
    with open(path, "a") as fh:
        for c in calls:
            fh.write(c.model_dump_json() + "\n")


def test_builder_folds_in_only_what_was_appended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = Live(drift=0.05)
    path = live_trace(tmp_path, live.cycles(8)) / TRACE
    follower = TraceFollower(path.parent)
    follower.poll()
    builder = ViewBuilder(ViewFilter(window_steps=8))
    first = builder.build(follower.trace_set)

    fed: list[str] = []
    original = accumulate.PathAcc.feed

    def counting(self: object, c: Call, role: str) -> None:
        fed.append(role)
        original(self, c, role)  # type: ignore[arg-type]

    monkeypatch.setattr(accumulate.PathAcc, "feed", counting)
    more = live.cycles(3)
    _append(path, more)
    assert follower.poll()
    second = builder.build(follower.trace_set)
    assert len(fed) == len(more)  # the 8 cycles before were not read again
    assert not builder.build(follower.trace_set) or len(fed) == len(more)  # nothing new: nothing fed
    assert len(fed) == len(more)
    monkeypatch.setattr(accumulate.PathAcc, "feed", original)

    # The numbers moved with the appended records, and equal a build from scratch.
    n1, n2 = first.datapath.norm, second.datapath.norm
    assert n2.calls == n1.calls + sum(1 for c in more if c.role == "draft.norm")
    assert n2.total.window.output.std > n1.total.window.output.std
    assert n2.total.run.output.std != n1.total.run.output.std
    fresh = build_view(load_traces(path.parent), ViewFilter(window_steps=8))
    assert second.datapath.model_dump() == fresh.datapath.model_dump()
    assert second.modules == fresh.modules and second.header.steps_traced == fresh.header.steps_traced


def test_builder_starts_over_when_the_file_is_rewritten(tmp_path: Path) -> None:
    path = live_trace(tmp_path, Live().cycles(6)) / TRACE
    follower = TraceFollower(path.parent)
    follower.poll()
    builder = ViewBuilder()
    assert builder.build(follower.trace_set).datapath.norm.calls == 6 * (1 + DRAFT_STEPS)
    write_trace(path, [live_header(), live_capture(), *Live().cycles(1)])  # shorter: truncated and rewritten
    follower.poll()
    assert builder.build(follower.trace_set).datapath.norm.calls == 1 + DRAFT_STEPS


def test_follow_through_the_recorder_sink_updates_the_numbers(tmp_path: Path) -> None:
    """The live file as a server writes it (the recorder's JSONL sink), read by --follow's
    follower and builder between flushes."""
    from spectrace.recorder import Recorder
    from spectrace.settings import Settings

    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name=TRACE, rank=0)
    rec.emit(live_capture())
    live = Live(drift=0.1)

    def step_records(n: int) -> None:
        for c in live.cycles(n):
            rec.emit_step(c.step, [c], 0, 0)
        rec.flush()

    step_records(4)
    follower = TraceFollower(tmp_path)
    follower.poll()
    builder = ViewBuilder(ViewFilter(window_steps=6))
    before = builder.build(follower.trace_set).datapath
    step_records(4)
    assert follower.poll()
    after = builder.build(follower.trace_set).datapath
    assert after.layer.calls == 2 * before.layer.calls
    decode_before, decode_after = (next(m for m in d.layer.modes if m.label == "DECODE") for d in (before, after))
    assert decode_after.run.records == 2 * decode_before.run.records
    assert decode_after.window.output.std > decode_before.window.output.std  # the drift reached the window
    assert after.window_last_step > before.window_last_step
    rec.close()
    follower.poll()
    assert builder.build(follower.trace_set).header.processes[0].state == "closed"


def test_follow_json_stream_carries_the_data_path_as_it_grows(tmp_path: Path) -> None:
    import signal

    live = Live()
    path = live_trace(tmp_path, live.cycles(2)) / TRACE
    proc = follow_json(path.parent, "--window", "5")
    try:
        first = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert first["datapath"]["window_steps"] == 5
        assert first["datapath"]["fc"]["total"]["run"]["records"] == 2
        _append(path, live.cycles(3))
        records = 2
        while records < 5:  # the append may arrive over more than one poll
            records = json.loads(proc.stdout.readline())["datapath"]["fc"]["total"]["run"]["records"]  # type: ignore[union-attr]
        assert records == 5
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # a loaded CI machine may starve it for seconds
    assert proc.returncode == 0 and "Traceback" not in err


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_follow_redraws_the_data_path(tmp_path: Path) -> None:
    from tests.viewers.test_viewer import Tmux, _shell_cmd

    live = Live()
    path = live_trace(tmp_path, live.cycles(2)) / TRACE
    with Tmux("livepath") as t:
        t.send(_shell_cmd(str(path.parent), "--follow", "--interval", "0.1") + "; echo EXIT=$?", "Enter")
        screen = t.wait_for(r"fc  x2  ")
        assert "DRAFT_EXTEND" in screen and "whole run │ last 32 steps" in screen
        _append(path, live.cycles(5))
        screen = t.wait_for(r"fc  x7  ")
        assert "x28" in screen  # the draft layer: 7 cycles x (1 extend + 3 decode steps)
        t.send("C-c")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d")
        assert "Traceback" not in t.screen(history=True)


def test_tensor_parallel_ranks_count_each_verify_step_once(tmp_path: Path) -> None:
    """Every TP rank records the same verify steps: the merged view counts them once; two
    servers on one host (both rank 0) both count."""
    from spectrace.records import Acceptance

    steps = [Acceptance(step=s, accept_lengths=[3, 2], draft_tokens=3, accepted_per_position=[2, 2, 1]) for s in range(4)]
    for rank in (0, 1):
        write_trace(tmp_path / "tp" / f"trace-node1-{10 + rank}-rank{rank}.jsonl", [live_header(pid=10 + rank, rank=rank), *steps])
    view = build_view(load_traces(str(tmp_path / "tp")), ViewFilter())
    assert view.acceptance.requests == 8 and view.acceptance.steps == [0, 1, 2, 3]
    write_trace(tmp_path / "two" / "trace-node1-20-rank0.jsonl", [live_header(pid=20, rank=0), *steps])
    write_trace(tmp_path / "two" / "trace-node1-21-rank0.jsonl", [live_header(pid=21, rank=0), *steps])
    assert build_view(load_traces(str(tmp_path / "two")), ViewFilter()).acceptance.requests == 16

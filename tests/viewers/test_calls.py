"""``spectrace calls``: the per-call drill-down and the raw records for ``jq``.

Traces are real: the demo's fc-bypass scenario (the reference pipeline, traced), a tiny
Llama traced with every module hooked and an inf planted in one layer's weight, and a
live server's records (forward modes, token rows, draft steps, graph replays) written as
the viewer's live-path tests write them. What each command must print is computed here
from the trace file's own lines, not from the viewer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import spectrace as st
from spectrace.cli.calls import main as calls_main
from spectrace.cli.view import main as view_main
from spectrace.records import TensorStats
from spectrace.rules.globs import glob_match
from spectrace.viewers.render import dtype, shape, stats_text
from tests.helpers.models import tiny_llama
from tests.helpers.traces import write_trace
from tests.viewers.test_viewer_live_path import TRACE, Live, live_capture, live_header


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every module of a tiny Llama, layer 1's MLP down projection holding an inf."""
    out = tmp_path_factory.mktemp("poisoned")
    model = tiny_llama(layers=2)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    with st.trace(model, "**", directory=str(out)), torch.no_grad():
        model(torch.arange(1, 9).unsqueeze(0))
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("live")
    write_trace(out / TRACE, [live_header(), live_capture(), *Live().cycles(3)])
    return out


def raw_calls(folder: Path) -> list[dict]:
    """The call records of a folder's trace files, parsed from their lines."""
    out = []
    for path in sorted(folder.glob("trace-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if json.loads(line)["type"] == "call"]
    return out


def raw_lines(folder: Path) -> list[str]:
    out = []
    for path in sorted(folder.glob("trace-*.jsonl")):
        out += [line for line in path.read_text().splitlines() if json.loads(line)["type"] == "call"]
    return out


def calls(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = calls_main([*args, "--no-pager"])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ the text
def test_each_selected_call_shows_every_tensor_with_shape_dtype_and_statistics(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    want = [c for c in raw_calls(bypass) if c["step"] == 3 and c["role"] == "draft.layer"]
    assert want, "the demo's step 3 runs the draft layer"
    rc, out, err = calls(capsys, str(bypass), "--step", "3", "--role", "draft.layer", "--limit", "0")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{len(want)} calls"
    heads = [i for i, line in enumerate(lines) if line.startswith("step ")]
    assert [lines[i] for i in heads] == [f"step 3  call {c['seq']}  {c['module']}  {c['module_type']}" for c in want]
    for i, c in zip(heads, want):
        block = lines[i + 1 : i + 2 + len(c["inputs"]) + len(c["outputs"])]
        assert block[0] == "  role draft.layer"
        tensors = [("in", m) for m in c["inputs"]] + [("out", m) for m in c["outputs"]]
        for line, (side, m) in zip(block[1:], tensors):
            stats = stats_text(TensorStats(**m["stats"]) if m["stats"] else None)
            assert line.split() == [side, m["arg"], shape(m["shape"]), dtype(m["dtype"]), *stats.split()], line
    assert max(len(line) for line in lines) <= 80


def test_non_finite_counts_show_on_the_tensor_that_holds_them(poisoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = calls(capsys, str(poisoned), "--module", "model.layers.1.mlp.down_proj")
    assert rc == 0
    [out_line] = [line for line in out.splitlines() if line.startswith("  out ")]
    [record] = [c for c in raw_calls(poisoned) if c["module"] == "model.layers.1.mlp.down_proj"]
    bad = record["outputs"][0]["stats"]
    assert (bad["nan"] or 0) + (bad["inf"] or 0) > 0
    for word, n in (("nan", bad["nan"]), ("inf", bad["inf"])):
        assert (f"{word} {n}" in out_line) == bool(n)
    clean = [line for line in calls(capsys, str(poisoned), "--module", "model.layers.0")[1].splitlines() if line.startswith("  out ")]
    assert clean and not any(" nan " in line or " inf " in line for line in clean)


def test_forward_mode_tokens_draft_step_and_graph_replay_are_shown(live: Path, capsys: pytest.CaptureFixture[str]) -> None:
    want = [c for c in raw_calls(live) if c["role"] == "draft.norm" and c["draft_step"] == 1]
    rc, out, _ = calls(capsys, str(live), "--role", "draft.norm", "--limit", "0")
    assert rc == 0
    lines = out.splitlines()
    context = [(line.strip(), lines[i + 1].strip()) for i, line in enumerate(lines) if line.startswith("  role draft.norm")]
    assert len(context) == len([c for c in raw_calls(live) if c["role"] == "draft.norm"])
    assert max(len(line) for line in lines) <= 80
    for c in want:
        line = f"role draft.norm  mode DECODE  tokens {c['tokens']}  draft step 1"
        replay = f"CUDA graph replay ({c['graph']})" if c["graph_replay"] else None
        assert (line, replay) in context if replay else any(head == line for head, _ in context)
    assert any(c["graph_replay"] for c in want) and not all(c["graph_replay"] for c in want)


def test_the_default_limit_says_how_many_calls_it_left_out(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    total = len(raw_calls(bypass))
    rc, out, _ = calls(capsys, str(bypass), "--limit", "3")
    assert rc == 0
    assert sum(line.startswith("step ") for line in out.splitlines()) == 3
    assert out.splitlines()[-1] == f"{total - 3} more calls not shown (--limit N shows N, --limit 0 all)"
    rc, out, _ = calls(capsys, str(bypass))
    assert sum(line.startswith("step ") for line in out.splitlines()) == 100
    assert f"{total - 100} more calls not shown" in out


def test_calls_of_several_processes_name_their_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        live = Live()
        write_trace(tmp_path / f"trace-node1-{10 + rank}-rank{rank}.jsonl", [live_header(pid=10 + rank, rank=rank), *live.cycles(1)])
    rc, out, _ = calls(capsys, str(tmp_path), "--role", "draft.fc")
    assert rc == 0
    assert out.splitlines()[0] == "2 calls in 2 processes"
    assert [line.split("  ")[2] for line in out.splitlines() if line.startswith("step ")] == ["rank 0", "rank 1"]
    rc, out, _ = calls(capsys, str(tmp_path), "--role", "draft.fc", "--rank", "1")
    assert out.splitlines()[0] == "1 call" and "rank 1" not in out  # one call: no plural


# ------------------------------------------------------------------ raw records
@pytest.mark.parametrize(
    "args, keep",
    [
        ([], lambda c: True),
        (["--step", "2:4"], lambda c: 2 <= c["step"] <= 4),
        (["--module", "*layers.0"], lambda c: c["module"].endswith("layers.0")),
        (["--role", "draft.*", "--step", ":1"], lambda c: c["step"] <= 1 and glob_match(c["role"] or "", "draft.*")),
    ],
)
def test_jsonl_prints_the_selected_records_exactly_as_written(bypass: Path, capsys: pytest.CaptureFixture[str], args, keep) -> None:
    want = [line for line in raw_lines(bypass) if keep(json.loads(line))]
    rc, out, err = calls(capsys, str(bypass), *args, "--jsonl")
    assert (rc, err) == (0, "")
    assert out.splitlines() == want  # byte for byte, in the order the process made them
    rc, out, _ = calls(capsys, str(bypass), *args, "--json")
    assert rc == 0 and json.loads(out) == [json.loads(line) for line in want]


def test_jsonl_of_live_records_keeps_every_field(live: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = calls(capsys, str(live), "--role", "target.layer[*]", "--limit", "4", "--jsonl")
    want = [line for line in raw_lines(live) if json.loads(line)["role"].startswith("target.layer[")][:4]
    assert rc == 0 and out.splitlines() == want
    assert json.loads(out.splitlines()[0])["forward_mode"] == "TARGET_VERIFY"


def test_a_closed_pipe_ends_the_output_quietly(bypass: Path) -> None:
    """`spectrace calls TRACE --jsonl | head -1`: the reader leaves after one line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectrace", "calls", str(bypass), "--jsonl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the rest (megabytes) no longer fits the pipe
    err = proc.stderr.read().decode()
    # Every command ends alike on a closed pipe: SIGPIPE's default action (no traceback).
    assert proc.wait(timeout=120) in (0, -signal.SIGPIPE), err
    assert json.loads(first)["type"] == "call"
    assert err == ""


# ------------------------------------------------------------------ filters that match nothing
@pytest.mark.parametrize(
    "args",
    [["--module", "nonexistent"], ["--rank", "5"], ["--step", "5:2"], ["--step", "100000:"]],
)
def test_a_filter_that_matches_nothing_is_worded_as_view_words_it(
    bypass: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert view_main([str(bypass), *args, "--no-pager"]) == 2
    view_line = capsys.readouterr().err.strip().removeprefix("spectrace view: error: ")
    for extra in ([], ["--jsonl"]):
        rc, out, err = calls(capsys, str(bypass), *args, *extra)
        assert (rc, out) == (2, "")
        assert err.splitlines() == [f"spectrace calls: error: {view_line}"]


@pytest.mark.parametrize(
    "args, said",
    [
        (["--role", "nope"], "--role 'nope' matches no call (roles: draft.embed"),
        (["--role", "draft.nrm"], "--role 'draft.nrm' matches no call; did you mean 'draft.norm'? (roles: draft.embed"),
        (["--module", "*fc"], "no call matches --module '*fc' (it names findings or captures only)"),
        (
            ["--role", "draft.layer", "--module", "*embed_tokens"],
            "no call matches --module '*embed_tokens' and --role 'draft.layer' together",
        ),
        (["--limit", "-1"], "--limit: wants a whole number >= 0"),
        (["--jsonl", "--json"], "not allowed with argument"),
    ],
)
def test_other_empty_selections_and_bad_arguments_are_one_line(
    bypass: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    rc, out, err = calls(capsys, str(bypass), *args)
    assert (rc, out) == (2, "")
    assert said in err and (len(err.splitlines()) == 1 or err.startswith("usage:")), err


def test_a_missing_trace_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = calls(capsys, str(tmp_path / "nowhere"))
    assert (rc, out) == (2, "")
    # The whole path: its last part alone does not say where it was looked for.
    assert err.splitlines() == [f"spectrace calls: error: {tmp_path / 'nowhere'}: no such file or folder"]
    assert not os.path.exists(tmp_path / "nowhere")


def test_long_names_keep_their_line_and_control_characters_are_shown_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spectrace.records import Call, TensorMeta
    from tests.helpers.traces import header

    long = "target.model.model.layers.31.self_attn.qkv_proj.a_sub_module_with_a_long_name"
    hostile = "draft.model.\x1b]52;c;ZWNobyBoaQ==\x07fc"
    meta = TensorMeta(
        arg="input[0]", shape=[4, 192], dtype="torch.bfloat16", device="cuda:0", stats=TensorStats(mean=0.5, std=1.0, absmax=3.0)
    )
    write_trace(
        tmp_path / "trace-h-1.jsonl",
        [header(), *(Call(step=0, seq=i, module=m, module_type="QKVParallelLinear", inputs=[meta]) for i, m in enumerate((long, hostile)))],
    )
    rc, out, _ = calls(capsys, str(tmp_path))
    assert rc == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[2:5] == ["step 0  call 0", f"  {long}", "  type QKVParallelLinear"]
    assert "\x1b" not in out and "\x07" not in out
    [head] = [line for line in lines if line.startswith("step 0  call 1  ")]
    assert head.startswith("step 0  call 1  draft.model.\\x1b]52;c;ZWNobyBoaQ==") and head.endswith("fc  QKVParallelLinear")
    rc, out, _ = calls(capsys, str(tmp_path), "--jsonl")
    assert [json.loads(line)["module"] for line in out.splitlines()] == [long, hostile]  # JSON carries them as they are


def test_view_drills_down_per_call_and_prints_raw_records(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``view --calls`` and ``view --jsonl`` are ``spectrace calls`` with the view's filters."""
    assert view_main([str(bypass), "--calls", "--module", "draft.model.layers.0", "--step", "3:4"]) == 0
    as_view = capsys.readouterr().out
    rc, as_calls, _ = calls(capsys, str(bypass), "--module", "draft.model.layers.0", "--step", "3:4")
    assert rc == 0 and as_view == as_calls and "draft.model.layers.0" in as_view
    assert view_main([str(bypass), "--jsonl", "--module", "draft.model.layers.0", "--step", "3"]) == 0
    want = [line for line in raw_lines(bypass) if (r := json.loads(line))["module"] == "draft.model.layers.0" and r["step"] == 3]
    assert capsys.readouterr().out.splitlines() == want and want
    assert view_main([str(bypass), "--calls", "--module", "nonexistent"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1

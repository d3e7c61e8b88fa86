"""``spectrace export``: Chrome Trace Event Format JSON that ui.perfetto.dev and chrome://tracing open.

Traces are real: the demo's fc-bypass scenario (target and draft, acceptance, findings),
a tiny Llama traced with every module hooked (calls nested four deep), and live server
records of two ranks written as the viewer's live-path tests write them. Each output is
read back as JSON and held to the format's rules (required fields per phase, proper
nesting of complete events on a track) and to the records: one slice per call ending at
the call's time stamp, one per step, one counter point per verify step, one instant per
finding, all counted from the trace file's own lines.
"""

from __future__ import annotations

import json
import os
import stat
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import spectrace as st
from spectrace.cli.export import main as export_main
from spectrace.cli.view import main as view_main
from spectrace.records import Acceptance, Call, Finding, TensorMeta
from tests.helpers.models import tiny_llama
from tests.helpers.traces import T0, write_trace
from tests.viewers.test_viewer_live_path import Live, live_header

EPS = 0.002  # us: time stamps are whole nanoseconds written in microseconds


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nested")
    model = tiny_llama(layers=2)
    with st.trace(model, "**", directory=str(out)), torch.no_grad():
        model(torch.arange(1, 9).unsqueeze(0))
        model(torch.arange(1, 5).unsqueeze(0))
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    for rank in (0, 1):
        live = Live()
        calls = live.cycles(2)
        accept = [Acceptance(step=s, accept_lengths=[3, 1 + rank], draft_tokens=3) for s in sorted({c.step for c in calls})[::5]]
        write_trace(out / f"trace-node1-{10 + rank}-rank{rank}.jsonl", [live_header(pid=10 + rank, rank=rank), *calls, *accept])
    return out


def records(folder: Path, kind: str) -> list[dict]:
    out = []
    for path in sorted(folder.glob("trace-*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["type"] == kind:
                out.append(r)
    return out


def export(tmp_path: Path, trace: Path, *args: str, name: str = "out.json") -> dict:
    out = tmp_path / name
    assert export_main([str(trace), "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def check_format(doc: dict) -> None:
    """The Trace Event Format's required fields, per phase."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"], e
        assert e["ph"] in ("X", "i", "C", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], (int, float)), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert e["ts"] >= 0, e
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
            assert e["args"], e


def check_nesting(doc: dict) -> None:
    """Complete events of one track, in the file's order, nest: each starts no earlier than
    the one before, and lies inside the one open around it or after it (a viewer that
    reads them in order draws them as they ran)."""
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for events in tracks.values():
        stack: list[dict] = []
        for before, e in zip([None, *events], events):
            assert before is None or before["ts"] <= e["ts"], (before["name"], "after", e["name"])
            while stack and end(stack[-1]) <= e["ts"] + EPS:  # closed before e starts
                stack.pop()
            if stack:
                assert end(e) <= end(stack[-1]) + EPS, (e["name"], "overlaps", stack[-1]["name"])
            stack.append(e)


def x_events(doc: dict, cat: str | None = None, step: bool = False) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (e["cat"] == "step") == step and (cat is None or e["cat"] == cat)]


def end(e: dict) -> float:
    return e["ts"] + e["dur"]


# ------------------------------------------------------------------ the demo
def test_demo_export_has_one_slice_per_call_step_finding_and_verify_step(tmp_path: Path, bypass: Path) -> None:
    doc = export(tmp_path, bypass)
    check_format(doc)
    check_nesting(doc)
    calls, findings = records(bypass, "call"), records(bypass, "finding")
    accept_steps = {a["step"] for a in records(bypass, "acceptance") if a["accept_lengths"]}
    slices = x_events(doc)
    assert len(slices) == len(calls) == doc["otherData"]["counts"]["calls"]
    assert sorted(e["args"]["call"] for e in slices) == sorted(c["seq"] for c in calls)
    steps = x_events(doc, step=True)
    assert sorted(e["args"]["step"] for e in steps) == sorted({c["step"] for c in calls})
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(accept_steps) and {e["name"] for e in counters} == {"accept length"}
    instants = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert sorted(e["name"] for e in instants) == sorted(f["code"] for f in findings)
    assert doc["otherData"]["not_drawn"] == {k: 0 for k in doc["otherData"]["not_drawn"]}

    # One process; a track per root module, beside the steps and the findings.
    names = {(e["tid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {n for _, n in names} == {"steps", "findings", "target", "draft"}
    [header] = records(bypass, "header")
    assert {e["pid"] for e in doc["traceEvents"]} == {header["pid"]}
    by_tid = {n: tid for tid, n in names}
    for e in slices:
        assert e["tid"] == by_tid[e["args"]["module"].split(".")[0]]


def test_each_call_ends_at_its_time_stamp_and_lies_in_its_step(tmp_path: Path, bypass: Path) -> None:
    doc = export(tmp_path, bypass)
    t0 = doc["otherData"]["t0_unix"]
    by_seq = {c["seq"]: c for c in records(bypass, "call")}
    steps = {e["args"]["step"]: e for e in x_events(doc, step=True)}
    for e in x_events(doc):
        c = by_seq[e["args"]["call"]]
        assert end(e) == pytest.approx((c["t_unix"] - t0) * 1e6, abs=1.0)
        s = steps[c["step"]]
        assert s["ts"] - EPS <= e["ts"] and end(e) <= end(s) + EPS
    # the acceptance point of a verify step sits at the end of that step
    for e in (e for e in doc["traceEvents"] if e["ph"] == "C"):
        assert any(abs(end(s) - e["ts"]) <= EPS for s in steps.values())


def test_call_args_carry_every_tensor(tmp_path: Path, bypass: Path) -> None:
    doc = export(tmp_path, bypass)
    by_seq = {c["seq"]: c for c in records(bypass, "call")}
    for e in x_events(doc, cat="draft.layer")[:5]:
        c = by_seq[e["args"]["call"]]
        for side in ("inputs", "outputs"):
            got = e["args"][side]
            assert list(got) == [m["arg"] for m in c[side]]
            for m in c[side]:
                assert got[m["arg"]]["shape"] == "[" + ",".join(map(str, m["shape"])) + "]"
                assert got[m["arg"]]["dtype"] == m["dtype"]
                if m["stats"]:
                    for key in ("mean", "std", "absmax", "nan", "inf", "numel"):
                        assert got[m["arg"]].get(key) == m["stats"][key]
    fc = [e for e in doc["traceEvents"] if e["name"] == "fc_bypass"]
    assert fc and fc[0]["args"]["severity"] == "error" and fc[0]["args"]["fix"]


# ------------------------------------------------------------------ nesting
def test_sub_module_calls_nest_inside_their_parent(tmp_path: Path, nested: Path) -> None:
    doc = export(tmp_path, nested)
    check_format(doc)
    check_nesting(doc)
    slices = x_events(doc)
    assert len(slices) == len(records(nested, "call"))
    by_key = {(e["args"]["step"], e["args"]["module"]): e for e in slices}
    checked = 0
    for (step, module), e in by_key.items():
        parent = module.rsplit(".", 1)[0] if "." in module else None
        while parent is not None and (step, parent) not in by_key:
            parent = parent.rsplit(".", 1)[0] if "." in parent else None
        if parent is None:
            continue
        p = by_key[(step, parent)]
        assert p["tid"] == e["tid"]
        assert p["ts"] - EPS <= e["ts"] and end(e) <= end(p) + EPS, (module, parent)
        checked += 1
    assert checked > 20  # q_proj in self_attn in layers.0 in model, ...
    order = [e["args"]["module"] for e in slices if e["args"]["step"] == 0]
    assert order[:3] == ["model", "model.embed_tokens", "model.rotary_emb"]  # parent, then its children as they ran
    assert by_key[(0, "model.embed_tokens")]["dur"] == 0 and by_key[(0, "model.rotary_emb")]["ts"] == by_key[(0, "model")]["ts"]
    mlp = by_key[(0, "model.layers.0.mlp")]
    # down_proj is the MLP's last call: it ends last of its children, inside the MLP (how
    # long after it the MLP returns is the host's scheduling, not the exporter's doing)
    children = [e for (step, module), e in by_key.items() if step == 0 and module.startswith("model.layers.0.mlp.")]
    down = by_key[(0, "model.layers.0.mlp.down_proj")]
    assert len(children) >= 3 and end(down) == max(end(e) for e in children) and end(down) <= end(mlp) + EPS
    assert by_key[(0, "model.layers.0.mlp.gate_proj")]["ts"] == pytest.approx(mlp["ts"], abs=EPS)


# ------------------------------------------------------------------ processes, ranks, filters
def test_each_traced_process_is_one_process_named_by_rank(tmp_path: Path, ranks: Path) -> None:
    doc = export(tmp_path, ranks)
    check_format(doc)
    check_nesting(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {10: "node1 pid 10 rank 0", 11: "node1 pid 11 rank 1"}
    calls = records(ranks, "call")
    assert len(x_events(doc)) == len(calls)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert sorted((e["pid"], e["args"]["mean"]) for e in counters) == sorted(
        (10 + r, 2.0 + r / 2) for r in (0, 1) for _ in range(len(records(ranks, "acceptance")) // 2)
    )
    steps = x_events(doc, step=True)
    modes = {e["name"] for e in steps}
    assert {"step 0 TARGET_VERIFY", "step 1 DRAFT_EXTEND", "step 2 DECODE"} <= modes
    one = export(tmp_path, ranks, "--rank", "1", "--step", "2:4", name="one.json")
    assert {e["pid"] for e in one["traceEvents"]} == {11}
    assert {e["args"]["step"] for e in x_events(one)} == {2, 3, 4}
    assert min(e["ts"] for e in x_events(one)) == 0  # a window starts at its own first event, not at the process start


@pytest.mark.parametrize("args", [["--module", "nonexistent"], ["--rank", "5"], ["--step", "5:2"]])
def test_a_filter_that_matches_nothing_writes_nothing(
    tmp_path: Path, bypass: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert view_main([str(bypass), *args, "--no-pager"]) == 2
    said = capsys.readouterr().err.strip().removeprefix("spectrace view: error: ")
    assert export_main([str(bypass), "-o", str(tmp_path / "x.json"), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"spectrace export: error: {said}"]
    assert not (tmp_path / "x.json").exists()


# ------------------------------------------------------------------ what cannot be placed
def test_records_without_time_are_counted_and_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"

    def call(step: int, seq: int, t: float) -> Call:
        meta = TensorMeta(arg="output", shape=[2, 4], dtype="torch.float32", device="cpu")
        return Call(step=step, seq=seq, module=f"m.layers.{seq}", module_type="Linear", root="m", outputs=[meta], t_unix=t)

    write_trace(
        out / "trace-h-7.jsonl",
        [
            live_header(pid=7),
            call(0, 1, T0 + 1.0),
            call(0, 2, T0 + 1.5),
            call(1, 3, 0.0),  # no time stamp: an older writer
            Acceptance(step=0, accept_lengths=[2], draft_tokens=3),
            Acceptance(step=1, accept_lengths=[3], draft_tokens=3),
            Finding(code="fc_bypass", severity="error", message="m", fix="f", step=1),
            Finding(code="fc_bypass", severity="error", message="m", fix="f", step=0),
        ],
    )
    doc = export(tmp_path, out)
    err = capsys.readouterr().err.splitlines()
    check_format(doc)
    nd = doc["otherData"]["not_drawn"]
    assert (nd["calls_without_time"], nd["acceptance_steps_without_time"], nd["findings_without_time"]) == (1, 1, 1)
    assert err == [
        "spectrace export: warning: 1 call without a time stamp not drawn",
        "spectrace export: warning: acceptance of 1 step not drawn: no call of those steps has a time stamp",
        "spectrace export: warning: 1 finding without a time stamp or step not drawn",
    ]
    a, b = sorted(x_events(doc), key=lambda e: e["args"]["call"])
    assert (a["dur"], b["ts"], b["dur"]) == (0, a["ts"], pytest.approx(0.5e6, abs=1))  # the first call of a step: no duration
    [finding] = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert finding["ts"] == pytest.approx(end(b), abs=EPS)  # no time stamp of its own: the end of its step


# ------------------------------------------------------------------ writing the file
def test_an_existing_file_is_kept_without_force(tmp_path: Path, bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.json"
    target.write_text("mine\n")
    assert export_main([str(bypass), "-o", str(target)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"spectrace export: error: {target} exists; --force replaces it"]
    assert target.read_text() == "mine\n"
    assert export_main([str(bypass), "-o", str(target), "--force"]) == 0
    check_format(json.loads(target.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary file left


def test_force_replaces_a_link_or_fifo_and_never_writes_through(tmp_path: Path, bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (link, fifo):
        assert export_main([str(bypass), "-o", str(path)]) == 2  # exists: refused unopened (a FIFO would block)
        assert "exists; --force replaces it" in capsys.readouterr().err
        assert export_main([str(bypass), "-o", str(path), "--force"]) == 0
        assert stat.S_ISREG(os.lstat(path).st_mode)
        check_format(json.loads(path.read_text()))
    assert victim.read_text() == "keep\n"


@pytest.mark.parametrize("where", ["missing/out.json", "file.txt/out.json", "."])
def test_an_unwritable_path_is_one_line(tmp_path: Path, bypass: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert export_main([str(bypass), "-o", str(tmp_path / where)]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("spectrace export: error: "), err
    assert ("is a folder" in lines[0]) if where == "." else ("cannot write" in lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_dash_writes_to_standard_output(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_main([str(bypass), "-o", "-", "--step", "0"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    check_format(doc)
    assert {e["args"]["step"] for e in x_events(doc)} == {0}
    assert err.startswith("wrote standard output: 1 process, 1 step, ")


def test_processes_that_share_a_pid_or_have_no_header_stay_apart(tmp_path: Path) -> None:
    from spectrace.records import Header

    trace = tmp_path / "t"
    live = Live()
    calls = live.cycles(1)
    for host in ("node1", "node2"):  # two hosts, one pid
        h = Header(spectrace_version="0.1.0", pid=4242, host=host, rank=0 if host == "node1" else 1, started_unix=T0)
        write_trace(trace / f"trace-{host}-4242.jsonl", [h, *calls])
    write_trace(trace / "trace-x-1.jsonl", calls)  # no header line
    doc = export(tmp_path, trace)
    check_format(doc)
    check_nesting(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert len(procs) == 3 and 4242 in procs
    assert sorted(procs.values()) == ["node1 pid 4242 rank 0", "node2 pid 4242 rank 1", "trace-x-1.jsonl"]
    for pid in procs:
        assert len([e for e in x_events(doc) if e["pid"] == pid]) == len(calls)


def test_a_reader_that_leaves_early_ends_the_export_quietly(bypass: Path) -> None:
    """`spectrace export TRACE -o - | head -c 100`."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "spectrace", "export", str(bypass), "-o", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    # Quietly as `cat` ends: 0 when everything fit the pipe, else SIGPIPE (the shell's 141).
    assert proc.wait(timeout=120) in (0, -signal.SIGPIPE), err
    assert first.startswith(b'{"traceEvents":[')
    assert "Traceback" not in err and "Error" not in err

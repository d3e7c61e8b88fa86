"""A process that dies keeps its trace: records other than per-step ones are written
through, and the viewer and the diff say a trace was never closed instead of claiming
"records dropped 0".

The SGLang case runs the real SGLang 0.5.23 target under ``SPECTRACE=1`` in a child that
dies of SIGKILL right after ``set_eagle3_layers_to_capture``, as a server's process tree
does when its scheduler crashes at CUDA-graph capture.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Capture, Finding
from spectrace.settings import Settings
from spectrace.viewers.diff import diff_traces
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import build_view
from tests.helpers import paths

REPO = str(paths.ROOT)


def _lines(path: str) -> list[dict]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()]


def _capture() -> Capture:
    return Capture(module="target", requested_ids=[1, 3, 4], boundaries=[2, 4], num_layers=5, hidden_size=64, rule="test")


def test_every_record_but_per_step_ones_is_written_through(tmp_path):
    rec = Recorder(Settings(flush_seconds=3600, quiet=True), directory=str(tmp_path))
    rec.emit(_capture())
    (path,) = tmp_path.glob("*.jsonl")
    assert [r["type"] for r in _lines(str(path))] == ["header", "capture"]
    assert _lines(str(path))[1]["t_unix"] is not None  # the file's copy is stamped
    rec.emit(Finding(code="x", severity="info", message="m", fix="f"))
    assert [r["type"] for r in _lines(str(path))][-1] == "finding"
    rec.emit(Acceptance(step=0, accept_lengths=[2], draft_tokens=4))
    assert [r["type"] for r in _lines(str(path))][-1] == "finding"  # per-step: waits its interval
    rec.close()
    assert [r["type"] for r in _lines(str(path))][-2:] == ["acceptance", "counters"]


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from spectrace.recorder import Recorder
    from spectrace.records import Capture
    from spectrace.settings import Settings
    rec = Recorder(Settings(flush_seconds=3600, quiet=True), directory={folder!r})
    rec.emit(Capture(module="target", requested_ids=[1, 3, 4], boundaries=[2, 4], num_layers=5, hidden_size=64, rule="test"))
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _killed_trace(folder: Path) -> Path:
    script = folder.parent / "killed.py"
    script.write_text(KILLED.format(root=REPO, folder=str(folder)))
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return folder


def _closed_trace(folder: Path) -> Path:
    rec = Recorder(Settings(quiet=True), directory=str(folder))
    rec.emit(_capture())
    rec.close()
    return folder


def test_view_says_a_killed_trace_was_not_closed(tmp_path):
    folder = _killed_trace(tmp_path / "killed")
    view = build_view(load_traces(str(folder)))
    (proc,) = view.header.processes
    assert proc.state == "not closed" and proc.last_record is not None
    assert len(view.header.not_closed) == 1 and "crashed or was killed" in view.header.not_closed[0]
    assert view.datapath.captures  # the capture record written just before the kill is there
    out = subprocess.run([sys.executable, "-m", "spectrace", "view", str(folder)], cwd=REPO, capture_output=True, text=True)
    assert "not closed: the process crashed or was killed" in " ".join(out.stdout.split())
    assert "records dropped 0" not in out.stdout and "records dropped unknown" in out.stdout
    out = subprocess.run([sys.executable, "-m", "spectrace", "view", str(folder), "--json"], cwd=REPO, capture_output=True, text=True)
    header = json.loads(out.stdout)["header"]
    assert header["processes"][0]["state"] == "not closed" and header["not_closed"]


def test_view_of_a_closed_trace_says_nothing_of_it(tmp_path):
    view = build_view(load_traces(str(_closed_trace(tmp_path / "ok"))))
    assert view.header.processes[0].state == "closed" and not view.header.not_closed


def test_a_running_process_reads_open_not_crashed(tmp_path):
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path))  # this process: alive
    rec.emit(_capture())
    view = build_view(load_traces(str(tmp_path)))
    assert view.header.processes[0].state == "running"
    assert "still running" in view.header.not_closed[0]
    rec.close()


def test_diff_says_which_side_was_not_closed(tmp_path):
    a = load_traces(str(_closed_trace(tmp_path / "a")))
    b = load_traces(str(_killed_trace(tmp_path / "b")))
    result = diff_traces(a, b)
    assert not result.a_not_closed and len(result.b_not_closed) == 1
    assert "B not closed" in result.verdict
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "diff", str(tmp_path / "a"), str(tmp_path / "b")], cwd=REPO, capture_output=True, text=True
    )
    assert "B trace-" in out.stdout and "not closed" in out.stdout


SGLANG_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from tests.helpers import sglang_harness as sh
    cfg, hf = sh.tiny_hf_llama()
    sh.build_sglang_llama_target(cfg, hf, layer_ids=[0, 1, 2])  # spectrace records the capture here
    os.kill(os.getpid(), signal.SIGKILL)  # the server's process tree dies before any exit handler
    """
)


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_target_killed_after_capture_keeps_its_capture_record(tmp_path):
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    script = tmp_path / "serve.py"
    script.write_text(SGLANG_KILLED.format(root=REPO))
    folder = tmp_path / "traces"
    env = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(folder), "SPECTRACE_QUIET": "1"}
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    view = build_view(load_traces(str(folder)))
    assert [p.state for p in view.header.processes] == ["not closed"]
    (capture,) = view.datapath.captures
    assert capture.requested_ids == [0, 1, 2] and capture.boundaries == [1, 2, 3]


@pytest.mark.slow
def test_a_trace_its_code_never_closed_is_closed_at_exit(tmp_path):
    code = (
        "import torch, spectrace; from spectrace.eagle3.target import tiny_llama; "
        "m = tiny_llama(vocab_size=128, hidden_size=32, num_layers=2, intermediate_size=64); "
        f"t = spectrace.trace(m, directory={str(tmp_path)!r}); m(torch.randint(0, 128, (1, 4)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (proc,) = build_view(load_traces(str(tmp_path))).header.processes
    assert proc.state == "closed"


def test_a_trace_written_before_schema_2_still_reads_as_closed(tmp_path):
    """Older writers named the closing record "stats": it still closes the file."""
    header = Recorder(Settings(quiet=True)).header.model_copy(update={"schema_version": 1})
    lines = [header.model_dump_json(), '{"type":"stats","steps":3,"records_dropped":2}']
    (tmp_path / "trace-old-1.jsonl").write_text("\n".join(lines) + "\n")
    view = build_view(load_traces(str(tmp_path)))
    assert view.header.processes[0].state == "closed" and view.header.records_dropped == 2
    assert not load_traces(str(tmp_path)).problems

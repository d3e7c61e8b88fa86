"""Ctrl-C ends every command alike: one line, ``spectrace CMD: interrupted``, exit 130, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import spectrace.cli.view as view
from spectrace.cli import main
from spectrace.cli.errors import INTERRUPTED
from tests.helpers.traces import healthy_records, write_trace

ROOT = Path(__file__).resolve().parents[2]


def test_an_interrupt_inside_a_command_is_one_line_and_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trace(tmp_path / "trace-h-1-rank0.jsonl", healthy_records())

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(view, "build_view", interrupted)
    assert main(["view", str(tmp_path), "--no-pager"]) == INTERRUPTED == 130
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "spectrace view: interrupted\n")


def test_a_bug_of_ours_is_one_line_and_never_reads_as_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # view: 1 (its answers are 0, and 1 only under --fail-on); diff: 2, since 1 means "they differ".
    import spectrace.cli.diff as diff

    write_trace(tmp_path / "trace-h-1-rank0.jsonl", healthy_records())

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(view, "build_view", broken)
    monkeypatch.setattr(diff, "diff_traces", broken)
    assert main(["view", str(tmp_path), "--no-pager"]) == 1
    assert main(["diff", str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("internal error (RuntimeError: a bug); SPECTRACE_DEBUG=1" in line for line in err), err


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_on_a_running_command_leaves_no_traceback(tmp_path: Path) -> None:
    """A real SIGINT while the demo loads torch or runs its pipeline, wherever it lands."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectrace", "demo", "--bug", "healthy", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and err.rstrip().endswith("spectrace demo: interrupted"), err
    assert out == ""

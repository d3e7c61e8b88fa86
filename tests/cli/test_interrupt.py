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

"""A reader that goes away: every ``spectrace`` command ends alike, with no traceback.

Each command runs as users run it (``python -m spectrace`` in a child process) with its
stdout a pipe whose reader is already gone, as ``| head`` is once it has its lines: the
first write meets the closed pipe, whichever command makes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "spectrace", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env={**env, "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
        )
    finally:
        os.close(write)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real trace (a Linear-ReLU-Linear stack) for ``view`` and ``calls``."""
    import torch
    from torch import nn

    import spectrace

    out = tmp_path_factory.mktemp("pipes")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with spectrace.trace(model, modules="**", directory=str(out)), torch.no_grad():
        model(torch.ones(2, 8))
    return out


def assert_ended_quietly(proc: subprocess.CompletedProcess[str]) -> None:
    # SIGPIPE's default action: the child ends by the signal (a shell shows 141), and says nothing.
    assert proc.returncode == -signal.SIGPIPE, (proc.returncode, proc.stderr)
    assert proc.stderr == ""


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["settings"],
        ["audit", str(FIX / "speculators_tiny"), "--target-config", str(FIX / "target_llama_config.json")],
        ["audit", str(FIX / "speculators_tiny"), "--target-config", str(FIX / "target_llama_config.json"), "--json"],
    ],
    ids=["help", "version", "settings", "audit", "audit-json"],
)
def test_a_closed_pipe_ends_the_command_quietly(args: list[str]) -> None:
    assert_ended_quietly(run_into_closed_pipe(*args))


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
@pytest.mark.parametrize("command", ["view", "calls"])
def test_a_closed_pipe_ends_view_and_calls_quietly(command: str, trace_dir: Path) -> None:
    assert_ended_quietly(run_into_closed_pipe(command, str(trace_dir)))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
def test_a_closed_pipe_ends_the_demo_quietly(tmp_path: Path) -> None:
    proc = run_into_closed_pipe("demo", "--bug", "healthy", "--out", str(tmp_path))
    assert proc.returncode == -signal.SIGPIPE, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr  # its progress lines only
    assert os.listdir(tmp_path / "healthy")  # the trace was written before the table


def test_in_process_a_closed_pipe_gives_the_same_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller of ``main([...])`` keeps Python's handling of SIGPIPE, and gets the shell's status."""
    from spectrace import cli

    def closed(_argv: list[str]) -> int:
        raise BrokenPipeError

    monkeypatch.setitem(cli.COMMANDS, "closed", ("tests.cli.test_cli_pipes:_never", "a command whose reader went away"))
    monkeypatch.setattr(cli, "_load", lambda _target: closed)
    assert cli.main(["closed"]) == cli.CLOSED_PIPE_STATUS == 141

"""Long work shows progress on a terminal's stderr, and nothing at all in a pipe.

The commands run as users run them (``python -m spectrace``) with stderr a real
pseudo-terminal, then a pipe: a large trace's load draws rich's progress bar on the
terminal, and a piped stderr gets no progress text. The steps counter of
``compare-train`` is the same helper, driven here directly under a terminal.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spectrace.viewers.progress import LARGE_TRACE_BYTES
from tests.helpers.traces import healthy_records, write_trace

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"))},
    "PYTHONPATH": str(ROOT),
    "TERM": "xterm-256color",
    "COLUMNS": "100",
}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no pseudo-terminals")


@pytest.fixture(scope="module")
def large_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A healthy trace past the size at which loading shows a bar."""
    path = tmp_path_factory.mktemp("large") / "trace-h-1-rank0.jsonl"
    steps = 64
    while True:
        write_trace(path, healthy_records(steps=steps))
        if path.stat().st_size > LARGE_TRACE_BYTES:
            return path
        steps *= 2


def stderr_on_a_terminal(*argv: str) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with stderr a pseudo-terminal; (exit status, stdout, what the terminal got).

    stdout goes to a file: a pipe nobody reads while the terminal is drained would fill and
    stop the child."""
    master, slave = pty.openpty()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=slave, stdin=subprocess.DEVNULL, env=ENV)
        finally:
            os.close(slave)
        screen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not chunk:
                break
            screen += chunk
        os.close(master)
        code = proc.wait(timeout=120)
        out.seek(0)
        return code, out.read(), screen


def test_loading_a_large_trace_shows_progress_on_a_terminal(large_trace: Path) -> None:
    code, out, screen = stderr_on_a_terminal(sys.executable, "-m", "spectrace", "view", str(large_trace), "--json")
    assert code == 0, screen
    assert b"reading" in screen, screen[-2000:]
    assert out.lstrip().startswith(b"{")  # stdout is the view alone


@pytest.mark.parametrize("command", [["view", "--json"], ["export", "-o", "-"], ["calls", "--jsonl"]])
def test_a_piped_stderr_gets_no_progress(large_trace: Path, command: list[str]) -> None:
    name, *rest = command
    proc = subprocess.run([sys.executable, "-m", "spectrace", name, str(large_trace), *rest], capture_output=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert b"reading" not in proc.stderr and b"\x1b" not in proc.stderr, proc.stderr[:500]


def test_the_steps_counter_draws_on_a_terminal_only() -> None:
    script = (
        "from spectrace.viewers.progress import counter\n"
        "with counter('recomputing, step') as progress:\n"
        "    assert (progress is not None) == __import__('sys').stderr.isatty()\n"
        "    for i in range(3):\n"
        "        progress and progress(i + 1, 3)\n"
    )
    code, _, screen = stderr_on_a_terminal(sys.executable, "-c", script)
    assert code == 0 and b"recomputing, step" in screen and b"3/3" in screen, screen
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, env=ENV, timeout=60)
    assert piped.returncode == 0 and piped.stderr == b"", piped.stderr


def test_spectrace_load_shows_progress_on_a_terminal_only(large_trace: Path) -> None:
    # The notebook's spectrace.load() reads as the view does, and shows the same bar.
    script = f"import spectrace; t = spectrace.load({str(large_trace)!r}); print(len(t.findings))"
    code, out, screen = stderr_on_a_terminal(sys.executable, "-c", script)
    assert code == 0 and b"spectrace.load" in screen, screen[-2000:]
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, env=ENV, timeout=120)
    assert piped.returncode == 0 and b"spectrace.load" not in piped.stderr and b"\x1b" not in piped.stderr, piped.stderr[:500]

"""One error-line convention and one exit-code table for every ``spectrace`` command.

Bad input of any command is one line on stderr, ``spectrace CMD: error: WHAT``, and exit
status 2; a wrong argument adds ``(see spectrace CMD --help)``. Never argparse's usage block,
never a traceback (``SPECTRACE_DEBUG=1`` shows one for a bug of ours). Every line goes
through :func:`.terminal.write_line`: a file name cannot drive the terminal.

Exit status, every command:

====  ==============================================================================
0     done; nothing at or above the command's gate
1     the command's gate: a finding (audit, view --fail-on, fleet --fail-on,
      compare-train), traces that differ (diff), a divergence (replay); also a bug of
      ours, except in diff, where 1 is an answer and a bug of ours is 2
2     bad input: a wrong argument, nothing readable, a filter that matches nothing
130   interrupted (Ctrl-C): one line, no traceback
141   the reader of stdout went away (``| head``): no line at all, as ``cat`` ends
====  ==============================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

OK = 0
FOUND = 1
INTERNAL = 1
USAGE = 2
INTERRUPTED = 128 + 2  # what a shell reports for a process that SIGINT ended
CLOSED_PIPE = 128 + 13  # ... and for one that SIGPIPE ended


class UsageError(Exception):
    """Bad input: the message is the one line after ``spectrace CMD: error:``; exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """A wrong argument is one line (argparse would print its whole usage first)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def parser(prog: str, description: str, epilog: str, *, raw: bool = True) -> OneLineParser:
    """A command's parser: ``raw`` keeps the epilog's lines (its examples) as written."""
    return OneLineParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter,
    )


def say(line: str) -> None:
    """One line on stderr, escaped (:func:`.terminal.write_line`), never raising."""
    from ..viewers.terminal import write_line

    write_line(sys.stderr, line)


def silence_stdout() -> None:
    """After EPIPE, Python's flush at exit would raise again: point fd 1 at /dev/null."""
    with contextlib.suppress(Exception):  # a replaced stdout (pytest's capture) has no fd
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run(prog: str, body: Callable[[list[str]], int], argv: list[str], *, internal: int = INTERNAL) -> int:
    """Run a command's body; every way it can end becomes the table's exit status, with
    at most one line on stderr. ``internal``: the status of a bug of ours, where 1 already
    means an answer (``diff``: the traces differ) and must not be mistaken for one."""
    try:
        return int(body(argv) or 0)
    except UsageError as exc:
        say(f"{prog}: error: {exc}")
        return USAGE
    except SystemExit as exc:  # argparse's --help and --version (0)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        say(f"{prog}: error: {exc.code}")
        return USAGE
    except KeyboardInterrupt:
        say(f"{prog}: interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # in-process callers, SIGPIPE still ignored: the shell's status, no line
        silence_stdout()
        return CLOSED_PIPE
    except ModuleNotFoundError as exc:
        line = missing_package_line(exc)
        if line is None:  # one of spectrace's own modules: a bug of ours
            return _internal(prog, exc, internal)
        say(f"{prog}: error: {line}")
        return USAGE
    except Exception as exc:  # noqa: BLE001 - the user gets one line, not a traceback
        return _internal(prog, exc, internal)


# The optional packages a command may need, and the extra that installs each.
_EXTRAS = {
    "transformers": "demo",
    "prometheus_client": "metrics",
    "opentelemetry": "otlp",
    "speculators": "speculators",
    "specforge": "specforge",
    "sglang": "sglang",
    "vllm": "vllm",
}


def missing_package_line(exc: ModuleNotFoundError) -> str | None:
    """What to install, in one line, for a missing optional package; None for one of ours."""
    top = (exc.name or "").split(".")[0]
    if not top or top == "spectrace":
        return None
    extra = _EXTRAS.get(top)
    how = f"pip install 'spectrace[{extra}]'" if extra else f"pip install {top}"
    return f"this needs the Python package {top!r}, which is not installed here ({how})"


def _internal(prog: str, exc: BaseException, status: int) -> int:
    if os.environ.get("SPECTRACE_DEBUG"):
        traceback.print_exc()
    say(f"{prog}: error: internal error ({type(exc).__name__}: {exc}); SPECTRACE_DEBUG=1 shows the traceback")
    return status

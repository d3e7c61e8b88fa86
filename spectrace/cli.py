"""The ``spectrace`` command: one dispatcher, each sub-command in its own module.

Sub-commands load lazily so ``spectrace view`` never imports torch.

    $ spectrace demo
    $ spectrace view spectrace-demo/fc_bypass
    $ spectrace audit ./my-draft --target-config ./target/config.json

With no command it prints its usage and exits 2; ``spectrace --help`` prints it and exits 0.
A reader that goes away (``spectrace calls traces | head``) ends every command the same way:
no traceback, no message, exit status 141 (128 + SIGPIPE), as ``cat`` or ``grep`` end.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("spectrace.demo:main", "run the EAGLE-3 reference pipeline healthy and under every bug switch"),
    "view": ("spectrace.viewers.commands:view_main", "show a trace: findings first, then the data path"),
    "calls": ("spectrace.viewers.calls:calls_main", "every call of a trace: each tensor's shape, dtype, statistics; --jsonl for jq"),
    "export": ("spectrace.viewers.export:export_main", "write a trace as Chrome / Perfetto trace JSON (ui.perfetto.dev)"),
    "diff": ("spectrace.viewers.commands:diff_main", "compare two traces (train vs serve, good vs bad)"),
    "audit": ("spectrace.audit.command:main", "check a draft checkpoint against the serving engine before launch"),
    "fingerprint": ("spectrace.demo:fingerprint_main", "record the per-chunk statistics of the fused draft input"),
    "compare-train": ("spectrace.compare_train:main", "say by value which target boundary each served fused-input chunk is"),
    "replay": (
        "spectrace.replay.command:main",
        "run the served draft's kept inputs through its checkpoint; name the first module that diverges",
    ),
    "settings": ("spectrace.cli:settings_main", "print the SPECTRACE_* settings in effect"),
    "fleet": ("spectrace.fleet:main", "which instances report which root causes, from the Prometheus that scrapes them"),
}


SETTINGS_EXAMPLES = """examples:
  spectrace settings                          the settings a traced program gets here
  SPECTRACE_SAMPLE=4 spectrace settings       what a variable changes, before a long run

Every value comes from a SPECTRACE_* variable; a bad one is named on stderr with the
fallback that is shown.
"""


class _OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2 (argparse adds the whole usage)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def settings_parser() -> argparse.ArgumentParser:
    return _OneLineParser(
        prog="spectrace settings",
        description="Print the SPECTRACE_* settings in effect, one per line, secrets redacted.",
        epilog=SETTINGS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def settings_main(argv: list[str]) -> int:
    try:
        settings_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, its line already written)
        return exc.code if isinstance(exc.code, int) else 2
    from .settings import Settings

    print(Settings.from_env().describe())
    return 0


def _usage() -> str:
    lines = ["usage: spectrace COMMAND [ARGS]", "", "commands:"]
    width = max(len(name) for name in COMMANDS) + 1
    lines += [f"  {name:<{width}} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "Run 'spectrace COMMAND --help' for a command's options.", "Set SPECTRACE=1 to trace any Python program."]
    return "\n".join(lines)


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


CLOSED_PIPE_STATUS = 128 + 13  # what a shell reports for a process that SIGPIPE ended


def _die_quietly_on_closed_pipe() -> None:
    """Let a write to a closed stdout end the process, as it ends ``cat`` or ``grep``.

    Python ignores SIGPIPE and raises BrokenPipeError instead, wherever the write happens:
    at exit's final flush (a traceback no code can catch), inside rich, or inside a command
    that reports it its own way. Restoring the default action makes every command end alike,
    with no output at all. Only for a program run: a caller in-process keeps its own handler.
    """
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def _silence_stdout() -> None:
    # After EPIPE, Python's flush at exit would raise again: point fd 1 at /dev/null.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a replaced stdout (pytest's capture) has no fd
        pass


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        _die_quietly_on_closed_pipe()
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
        return status
    except BrokenPipeError:  # in-process callers (SIGPIPE still ignored): the same status
        _silence_stdout()
        return CLOSED_PIPE_STATUS


def _dispatch(argv: list[str]) -> int:
    if not argv:  # no command is a usage error: scripts must not take it for success
        sys.stderr.write(_usage() + "\n")
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "version"):
        from . import __version__

        print(f"spectrace {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"spectrace: error: unknown command {name!r}\n{_usage()}\n")
        return 2
    try:
        return int(_load(COMMANDS[name][0])(rest) or 0)
    except SystemExit as exc:  # argparse's --help and usage errors: main() returns, as its callers expect
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

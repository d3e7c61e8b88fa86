"""The ``spectrace`` command: one dispatcher, each sub-command in its own module of this package.

Only this package parses arguments and chooses exit statuses; the work is done by plain
functions elsewhere (``viewers/``, ``audit/``, ``replay/``, ...). Every command shares one
error-line convention and one exit-code table (:mod:`.errors`). Sub-commands load lazily
so ``spectrace view`` never imports torch.

    $ spectrace demo
    $ spectrace view spectrace-demo/fc_bypass
    $ spectrace audit ./my-draft --target-config ./target/config.json

With no command it prints its usage and exits 2; ``spectrace --help`` prints it and exits 0.
A reader that goes away (``spectrace calls traces | head``) ends every command the same way:
no traceback, no message, exit status 141 (128 + SIGPIPE), as ``cat`` or ``grep`` end.
Ctrl-C ends every command with one line, ``spectrace CMD: interrupted``, and exit status 130.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Callable

from .errors import CLOSED_PIPE, INTERRUPTED, USAGE, silence_stdout

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("spectrace.cli.demo:main", "run the EAGLE-3 reference pipeline healthy and under every bug switch"),
    "view": ("spectrace.cli.view:main", "show a trace: findings first, then the data path"),
    "calls": ("spectrace.cli.calls:main", "every call of a trace: each tensor's shape, dtype, statistics; --jsonl for jq"),
    "export": ("spectrace.cli.export:main", "write a trace as Chrome / Perfetto trace JSON (ui.perfetto.dev)"),
    "diff": ("spectrace.cli.diff:main", "compare two traces (train vs serve, good vs bad)"),
    "audit": ("spectrace.cli.audit:main", "check a draft checkpoint against the serving engine before launch"),
    "doctor": ("spectrace.cli.doctor:main", "run the engine's own classes on the draft and target, shrunk, on the CPU, traced"),
    "fingerprint": ("spectrace.cli.fingerprint:main", "record the per-chunk statistics of the fused draft input"),
    "compare-train": ("spectrace.cli.compare_train:main", "say by value which target boundary each served fused-input chunk is"),
    "replay": (
        "spectrace.cli.replay:main",
        "run the served draft's kept inputs through its checkpoint; name the first module that diverges",
    ),
    "probe": (
        "spectrace.cli.probe:main",
        "measure the served draft's agreement with its target under each candidate setting; say which it was trained with",
    ),
    "settings": ("spectrace.cli.settings:main", "print the SPECTRACE_* settings in effect"),
    "fleet": ("spectrace.cli.fleet:main", "which instances report which root causes, from the Prometheus that scrapes them"),
}

CLOSED_PIPE_STATUS = CLOSED_PIPE


def _usage() -> str:
    lines = ["usage: spectrace COMMAND [ARGS]", "", "commands:"]
    width = max(len(name) for name in COMMANDS) + 1
    lines += [f"  {name:<{width}} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "Run 'spectrace COMMAND --help' for a command's options.", "Set SPECTRACE=1 to trace any Python program."]
    return "\n".join(lines)


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]


def _die_quietly_on_closed_pipe() -> None:
    """Let a write to a closed stdout end the process, as it ends ``cat`` or ``grep``.

    Python ignores SIGPIPE and raises BrokenPipeError instead, wherever the write happens:
    at exit's final flush (a traceback no code can catch), inside rich, or inside a command
    that reports it its own way. Restoring the default action makes every command end alike,
    with no output at all. Only for a program run: a caller in-process keeps its own handler.
    """
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """The ``spectrace`` console script (and ``python -m spectrace``); returns the exit status."""
    if argv is None:
        _die_quietly_on_closed_pipe()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
        return status
    except BrokenPipeError:  # in-process callers (SIGPIPE still ignored): the same status
        silence_stdout()
        return CLOSED_PIPE
    except KeyboardInterrupt:  # before a command's own handling (loading it can take seconds)
        from .errors import say

        say(f"spectrace {args[0]}: interrupted" if args and args[0] in COMMANDS else "spectrace: interrupted")
        return INTERRUPTED


def _dispatch(argv: list[str]) -> int:
    if not argv:  # no command is a usage error: scripts must not take it for success
        sys.stderr.write(_usage() + "\n")
        return USAGE
    if argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "version"):
        from .. import __version__

        print(f"spectrace {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        from ..rules.globs import closest, did_you_mean

        hint = did_you_mean(closest(name, list(COMMANDS), n=2))
        sys.stderr.write(f"spectrace: error: unknown command {name!r}{' (' + hint + ')' if hint else ''}\n{_usage()}\n")
        return USAGE
    try:
        return int(_load(COMMANDS[name][0])(rest) or 0)
    except ModuleNotFoundError as exc:  # a command whose module needs an optional package
        from .errors import missing_package_line, say

        line = missing_package_line(exc)
        if line is None:
            raise
        say(f"spectrace {name}: error: {line}")
        return USAGE
    except SystemExit as exc:  # a command that exits itself: main() returns, as its callers expect
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return 1

"""The ``spectrace`` command: one dispatcher, each sub-command in its own module.

Sub-commands load lazily so ``spectrace view`` never imports torch.

    $ spectrace demo
    $ spectrace view spectrace-demo/fc_bypass
    $ spectrace audit ./my-draft --target-config ./target/config.json
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("spectrace.demo:main", "run the EAGLE-3 reference pipeline healthy and under every bug switch"),
    "view": ("spectrace.viewers.commands:view_main", "show a trace: findings first, then the data path"),
    "diff": ("spectrace.viewers.commands:diff_main", "compare two traces (train vs serve, good vs bad)"),
    "audit": ("spectrace.audit.command:main", "check a draft checkpoint against the serving engine before launch"),
    "fingerprint": ("spectrace.demo:fingerprint_main", "record the per-chunk statistics of the fused draft input"),
    "settings": ("spectrace.cli:settings_main", "print the SPECTRACE_* settings in effect"),
}


def settings_main(argv: list[str]) -> int:
    from .settings import Settings

    print(Settings.from_env().describe())
    return 0


def _usage() -> str:
    lines = ["usage: spectrace COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<12} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "Run 'spectrace COMMAND --help' for a command's options.", "Set SPECTRACE=1 to trace any Python program."]
    return "\n".join(lines)


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
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
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

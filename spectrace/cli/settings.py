"""``spectrace settings``: the SPECTRACE_* settings in effect, one per line, secrets redacted."""

from __future__ import annotations

import argparse

from .errors import OK, parser, run

EXAMPLES = """examples:
  spectrace settings                          the settings a traced program gets here
  SPECTRACE_SAMPLE=4 spectrace settings       what a variable changes, before a long run

Every value comes from a SPECTRACE_* variable; a bad one is named on stderr with the
fallback that is shown.
"""


def build_parser() -> argparse.ArgumentParser:
    return parser("spectrace settings", "Print the SPECTRACE_* settings in effect, one per line, secrets redacted.", EXAMPLES)


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace settings``; returns the exit status."""
    return run("spectrace settings", _settings, argv)


def _settings(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    from ..settings import Settings

    print(Settings.from_env().describe())
    return OK

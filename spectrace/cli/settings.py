"""``spectrace settings``: the SPECTRACE_* settings in effect, one per line, secrets redacted.

Exit 0 when every SPECTRACE_* value is good, 2 when one is bad (each named on stderr with its
fallback, then one line listing them), so that CI can run it as a check.
"""

from __future__ import annotations

import argparse

from .errors import OK, USAGE, parser, run, say

EXAMPLES = """examples:
  spectrace settings                          the settings a traced program gets here
  SPECTRACE_SAMPLE=4 spectrace settings       what a variable changes, before a long run

Every value comes from a SPECTRACE_* variable; a bad one is named on stderr with the
fallback that is shown, and the command exits 2 (a check for CI: 0 means every value is good).
"""


def build_parser() -> argparse.ArgumentParser:
    return parser("spectrace settings", "Print the SPECTRACE_* settings in effect, one per line, secrets redacted.", EXAMPLES)


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace settings``; returns the exit status."""
    return run("spectrace settings", _settings, argv)


def _settings(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    from ..settings import Settings, bad_values

    with bad_values() as bad:
        settings = Settings.from_env()
    print(settings.describe(), flush=True)
    if bad:  # the warnings above say each one and its fallback; a CI check must not pass on them
        say(f"spectrace settings: error: {len(bad)} bad value{'s' if len(bad) != 1 else ''}: {', '.join(bad)} (the fallbacks are shown)")
        return USAGE
    return OK

"""Old entry points of ``spectrace view`` and ``diff``, kept only until callers import ``spectrace.cli``."""

from __future__ import annotations


def view_main(argv: list[str]) -> int:
    from ..cli.view import main

    return main(argv)


def diff_main(argv: list[str]) -> int:
    from ..cli.diff import main

    return main(argv)

"""Old home of ``spectrace replay``, kept only until callers import ``spectrace.cli.replay``."""

from ..cli.replay import main

__all__ = ["main"]

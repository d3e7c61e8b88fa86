"""Old home of ``spectrace audit``, kept only until callers import ``spectrace.cli.audit``."""

from ..cli.audit import MAX_TABLE_FINDINGS, main

__all__ = ["MAX_TABLE_FINDINGS", "main"]

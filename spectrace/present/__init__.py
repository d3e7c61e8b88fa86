"""One findings presenter: the words of a finding in one place, for every screen and message.

:mod:`.findings` holds the words and the plain-text forms (a failing test, the exit
announcement, the audit, the notebook, compare-train) and JSON-able dicts;
:mod:`.renderables` lays the same words out for rich (the viewer, ``--follow``, the demo).
Reads records, rules and checks only: no torch, no hooks, no engines, no viewer.
"""

from .findings import (
    Block,
    Entry,
    announcement,
    blocks,
    brief_lines,
    entries,
    findings_headline,
    headline,
    heads,
    ranked,
    record_lines,
    root_cause_lines,
    stacked_lines,
    summary_lines,
    table_rows,
    to_dict,
    to_dicts,
)

__all__ = [
    "Block",
    "Entry",
    "announcement",
    "blocks",
    "brief_lines",
    "entries",
    "findings_headline",
    "headline",
    "heads",
    "ranked",
    "record_lines",
    "root_cause_lines",
    "stacked_lines",
    "summary_lines",
    "table_rows",
    "to_dict",
    "to_dicts",
]

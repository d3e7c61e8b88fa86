"""Findings as rich renderables: the viewer's findings section, the live screen's lines, the demo's.

The words come from :mod:`.findings`; this module only lays them out (badges, columns,
wrapping) and colours them. A trace's strings go in as :class:`~rich.text.Text`, never
as markup: a module named ``[bold]`` is shown as it is.

    >>> console.print(FindingsView(view.findings))          # spectrace view
    >>> lines = demo_summary(result.findings, width=80)      # spectrace demo
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from ..records import Finding
from .findings import (
    SEVERITY_STYLE,
    Block,
    blocks,
    cleared_text,
    cut_words,
    findings_headline,
    first_clause,
    fit_evidence,
    heads,
    modules_text,
    more_codes,
    more_consequences,
    orphan_fix_text,
    orphan_root_text,
    plus_more,
    ranked,
    severity_label,
    when,
)

MAX_ROOTS_SHOWN = 12  # root causes (and findings standing alone) the viewer draws in full
MAX_BENEATH_SHOWN = 8  # consequences drawn beneath one root
LABEL_COL = 8  # seen / where / cause / evidence / fix
VALUE_INDENT = 2 + 1 + LABEL_COL + 1  # where a row's value starts
VIEW_HINT = "--finding CODE or --json"  # where the rest of the findings is, in the viewer


def no_wrap(t: Text) -> Text:
    """One line, ``…`` where the screen ends."""
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def badge(severity: str) -> tuple[str, str]:
    """`` ERROR `` and its reversed colour (append it to a Text)."""
    return f" {severity_label(severity)} ", f"reverse {SEVERITY_STYLE.get(severity, '')}"


# ----------------------------------------------------------------------------- the viewer


class FindingsView:
    """Findings by root cause, errors first: what was seen, why, and the fix.

    A root cause (:mod:`spectrace.checks.root_causes` decides which) carries the one fix;
    its consequences follow beneath it in a line or two each (code, where, what was seen),
    with no fix of their own. A finding that follows from nothing is shown as a root.
    Reads the view's groups (``viewers.model.FindingGroup``) or judged records (:func:`.findings.entries`).
    """

    def __init__(self, findings: Sequence[Any], *, max_roots: int | None = None, max_beneath: int | None = None) -> None:
        self.findings = findings
        # A screen, not a log: past these, one line says how many more codes --json holds.
        self.max_roots = MAX_ROOTS_SHOWN if max_roots is None else max_roots
        self.max_beneath = MAX_BENEATH_SHOWN if max_beneath is None else max_beneath

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.findings:
            yield Text("Findings: none", style="green")
            return
        yield Text(findings_headline(self.findings), style="bold")
        width = options.max_width
        drawn = codes_drawn = 0
        for b in blocks(self.findings):
            if drawn >= self.max_roots:
                break
            drawn += 1
            f = b.head
            yield finding_head(f)
            grid = Table.grid(padding=(0, 1))
            grid.add_column(width=2)
            grid.add_column(style="dim", width=LABEL_COL, no_wrap=True)
            grid.add_column(ratio=1)
            for label, value, style in _rows(b, width):
                grid.add_row("", label, Text(value, style=style))
            if b.beneath:
                grid.add_row("", "then", Text(cleared_text(b.beneath), style="dim"))
            yield grid
            codes_drawn += 1 + min(len(b.beneath), self.max_beneath)
            for c in b.beneath[: self.max_beneath]:
                yield from consequence_lines(c)
            if len(b.beneath) > self.max_beneath:
                yield Text(more_consequences(len(b.beneath) - self.max_beneath, VIEW_HINT), style="dim")
        left = len(self.findings) - codes_drawn
        if left > 0:
            yield Text(more_codes(left, VIEW_HINT), style="bold yellow")


def _rows(b: Block[Any], width: int) -> list[tuple[str, str, str]]:
    """The rows under a head: seen, where, cause, evidence, then the fix (the root's, for an orphan)."""
    f = b.head
    rows = [("seen", f.message, "")]
    if f.modules:
        rows.append(("where", modules_text(f.modules), ""))
    if f.cause:
        rows.append(("cause", f.cause, ""))
    if f.evidence:
        rows.append(("evidence", fit_evidence(f.evidence, width - VALUE_INDENT), ""))
    if b.orphan:
        # Its root is hidden by --finding: the fix to apply is still the root's.
        rows.append(("root", orphan_root_text(f), "yellow"))
        rows.append(("fix", orphan_fix_text(f), "green"))
    else:
        rows.append(("fix", f.fix, "green"))
    return rows


def finding_head(f: Any) -> Text:
    """`` ERROR  code  3 times, steps 0..4  rank 0,1``."""
    head = Text()
    head.append(*badge(f.severity))
    head.append(f" {f.code}", style="bold")
    head.append(f"  {when(f)}")
    if f.ranks:
        head.append(f"  rank {','.join(map(str, sorted(f.ranks)))}")
    return head


def consequence_lines(c: Any) -> Iterable[Text]:
    """Two lines: severity, code, where and when; then what was seen, cut to the line."""
    head = Text("   ↳ ")
    head.append(severity_label(c.severity), style=SEVERITY_STYLE.get(c.severity, ""))
    head.append(f" {c.code}", style="bold")
    if c.also_from:
        head.append(f" (also from {', '.join(c.also_from)})", style="yellow")
    where = f"  {modules_text(c.modules)}," if c.modules else " "
    head.append(f"{where} {when(c)}", style="dim")
    if c.ranks:
        head.append(f"  rank {','.join(map(str, sorted(c.ranks)))}", style="dim")
    yield no_wrap(head)
    yield no_wrap(Text("       " + c.message))


# ----------------------------------------------------------------------------- the live screen


def finding_line(
    severity: str, code: str, where: str, message: str, *, live: bool = False, beneath: bool = False, new: bool = False
) -> Text:
    """One line of the live screen: ``[↳] [LIVE|NEW] ERROR code  where  message``, cut at the edge."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if beneath:
        t.append("   ↳")  # follows from the root above: cleared by its fix
    if live:
        t.append(" LIVE ", style="reverse bold yellow")
    elif new:
        t.append(" NEW ", style="reverse bold")  # seen in the last few seconds
    t.append(*badge(severity))
    t.append(f" {code}", style="bold")
    t.append(f"  {where}  ")
    t.append(message, style="dim")
    return t


def detail_line(label: str, value: str, style: str) -> Text:
    """``    label value`` on one line, cut at the edge."""
    t = Text(f"    {label:<5} ", style="dim", no_wrap=True, overflow="ellipsis")
    t.append(value, style=style)
    return t


def fix_row(value: str) -> Table:
    """``    fix   <the fix>``, wrapped under its own start, never cut."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=9, style="dim", no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row("    fix", Text(value, style="green"))
    return grid


# ----------------------------------------------------------------------------- the demo

# The demo's colours: an info finding is dim there (the viewer draws it blue).
DEMO_STYLE: Mapping[str, str] = {**SEVERITY_STYLE, "info": "dim"}
INDENT = "  "


def wrapped(label: str, text: str, width: int, indent: str = INDENT, limit: int | None = None) -> list[Text]:
    """``label text`` wrapped at ``width``, continuation lines under the text; never breaks
    a word, so an identifier or a path in a fix stays whole and can be copied."""
    lines = textwrap.wrap(
        f"{label}{text}",
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + " " * len(label),
        break_long_words=False,
        break_on_hyphens=False,
    )
    if limit is not None and len(lines) > limit:
        lines = lines[:limit]
        lines[-1] = lines[-1][: width - 1] + "…"
    return [Text(line) for line in lines]


def demo_summary(findings: Sequence[Finding], width: int) -> list[Text]:
    """The root cause in one line (its code, ``(+N more)`` other codes, the first clause of
    what was seen), then its whole fix."""
    first = heads(findings)[0]
    more = len({f.code for f in findings} - {first.code})
    line = Text(INDENT)
    line.append(first.code, style=DEMO_STYLE[first.severity])
    if more:
        line.append(plus_more(more), style="dim")
    line.append(": " + cut_words(first_clause(first.message, width), width - len(line) - 2))
    return [line, *wrapped("fix: ", first.fix, width)]


def demo_details(findings: Sequence[Finding], width: int) -> list[Text]:
    """Every code once, root causes first: what was seen, the cause, the fix, each whole (the
    summary is the short form; details never cut a value the user came for)."""
    lines: list[Text] = []
    for e in ranked(findings):
        head = Text(INDENT)
        head.append(f"{severity_label(e.severity)} {e.code}", style=DEMO_STYLE[e.severity])
        head.append(" (root cause)" if e.root is None else f" (follows from {e.root})", style="dim")
        lines.append(head)
        lines += wrapped("seen: ", e.message, width, INDENT * 2)
        if e.cause:
            lines += wrapped("cause: ", e.cause, width, INDENT * 2)
        lines += wrapped("fix: ", e.fix, width, INDENT * 2)
    return lines

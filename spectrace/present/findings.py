"""The wording of findings as plain text: one place for every screen and message.

A finding is said in many places (a failing test, the exit announcement on stderr, the
audit, the notebook, the viewer and its live screen, the demo, compare-train); each says
it in its own shape, but the words come from here: the severity as written, where it was
seen, what follows from it, how many more there are, the fix.

Two kinds of input are read alike (:class:`Shown`): a :class:`~spectrace.records.Finding`
judged by :func:`entries` (one :class:`Entry` per record, with its root cause from
:func:`spectrace.checks.root_causes.root_causes`, the catalogue's cause and the root's
fix), and the viewer's group of one code (``viewers.model.FindingGroup``), which already
carries the same fields.

    >>> from spectrace.rules.catalogue import finding
    >>> found = [finding("fc_bypass", "64-wide"), finding("aux_capture_disabled", "off", evidence={"enabled": False})]
    >>> root_cause_lines(found)[0]
    'ERROR aux_capture_disabled: off'

Torch-free, and free of the viewer, the hooks and the engines: records, rules and checks only.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ..checks.root_causes import Judgement, root_causes
from ..records import SEVERITY_RANK, Finding
from ..rules.catalogue import CATALOGUE

# The severity's colour on a rich screen (the viewer, follow, the audit).
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "blue"}
ANNOUNCE_TAIL = "==== (written to the trace; repeats are counted, not printed) ===="


# ----------------------------------------------------------------------------- the input


class Shown(Protocol):
    """What every presenter reads of a finding: a judged record (:class:`Entry`) or the view's group of one code."""

    @property
    def code(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def fix(self) -> str: ...
    @property
    def root(self) -> str | None: ...


class Counted(Shown, Protocol):
    """A finding seen ``count`` times between two steps (the view's group; an :class:`Entry` is seen once)."""

    @property
    def count(self) -> int: ...
    @property
    def first_step(self) -> int | None: ...
    @property
    def last_step(self) -> int | None: ...


@dataclass(frozen=True)
class Entry:
    """One finding record with its judgement, spelled as the view's group is (so one
    presenter reads both): ``root`` None for a root cause or a finding standing alone."""

    finding: Finding
    code: str
    severity: str
    message: str
    fix: str
    module: str | None = None
    step: int | None = None
    cause: str = ""  # the catalogue's meaning of the code
    evidence: Mapping[str, Any] = field(default_factory=dict)
    follows_from: str | None = None
    root: str | None = None
    how: str = ""
    root_fix: str | None = None  # the root's fix: the one to apply
    also_from: tuple[str, ...] = ()
    consequences: tuple[str, ...] = ()  # codes that follow from this one (a root's)

    @property
    def count(self) -> int:
        return 1

    @property
    def first_step(self) -> int | None:
        return self.step

    @property
    def last_step(self) -> int | None:
        return self.step

    @property
    def modules(self) -> list[str]:
        return [self.module] if self.module else []


def entries(findings: Sequence[Finding]) -> list[Entry]:
    """Each record judged (in the same order): its root, the root's fix, its consequences, the catalogue's cause."""
    judged = root_causes(findings)
    fix_of = {f.code: f.fix for f in findings if f.severity == "error"}
    below: dict[str, list[str]] = {}
    for j in judged:
        if j.root is not None and j.code not in below.setdefault(j.root, []):
            below[j.root].append(j.code)
    return [_entry(f, j, fix_of, below) for f, j in zip(findings, judged)]


def _entry(f: Finding, j: Judgement, fix_of: Mapping[str, str], below: Mapping[str, list[str]]) -> Entry:
    meaning = CATALOGUE[f.code].meaning if f.code in CATALOGUE else ""
    return Entry(
        f, f.code, f.severity, f.message, f.fix, f.module, f.step, meaning, f.evidence,
        j.follows_from, j.root, j.how, fix_of.get(j.root) if j.root else None, j.also,
        tuple(below.get(f.code, ())) if j.root is None else (),
    )  # fmt: skip


def ranked(findings: Sequence[Finding]) -> list[Entry]:
    """Every code once, root causes first, then by severity (errors first): the demo's details."""
    order = sorted(entries(findings), key=lambda e: (e.root is not None, SEVERITY_RANK.get(e.severity, 9)))
    seen: set[str] = set()
    out = []
    for e in order:
        if e.code not in seen:
            seen.add(e.code)
            out.append(e)
    return out


def heads(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that head a report, most severe first, one per code: those that follow
    from no other (:mod:`spectrace.checks.root_causes` decides)."""
    seen: set[str] = set()
    out: list[Finding] = []
    for e in sorted(entries(findings), key=lambda e: SEVERITY_RANK[e.severity]):
        if e.root is None and e.code not in seen:
            seen.add(e.code)
            out.append(e.finding)
    return out


# ----------------------------------------------------------------------------- grouping

S = TypeVar("S", bound=Shown)


@dataclass
class Block(Generic[S]):
    """A root cause (or a finding standing alone) and what follows from it, drawn beneath."""

    head: S
    beneath: list[S] = field(default_factory=list)

    @property
    def orphan(self) -> bool:
        """A consequence whose root is not shown (``--finding`` hid it): drawn as a head, the fix being the root's."""
        return self.head.root is not None


def blocks(items: Sequence[S], *, orphans: bool = True) -> list[Block[S]]:
    """``items`` (in their order) as blocks: each root with its consequences beneath.

    Only an error is a root. A consequence whose root is not among ``items`` is a block of
    its own when ``orphans`` (the viewer, which says whose fix clears it), left out otherwise.
    """
    roots = {i.code for i in items if i.severity == "error"}
    # Filed once (a trace can hold tens of thousands of codes): never a scan per root.
    below: dict[str, list[S]] = {}
    for c in items:
        if c.root is not None:
            below.setdefault(c.root, []).append(c)
    out: list[Block[S]] = []
    for i in items:
        if i.root is not None:
            if orphans and i.root not in roots:
                out.append(Block(i))
            continue
        out.append(Block(i, below.get(i.code, []) if i.severity == "error" else []))
    return out


# ----------------------------------------------------------------------------- words


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 sample``, ``2 samples``, ``0 samples``: the noun agrees with the count."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def times(n: int) -> str:
    """How often a finding was seen: ``once``, ``3 times``."""
    return "once" if n == 1 else f"{n} times"


def steps_text(first: int | None, last: int | None) -> str:
    """``step 3``, ``steps 3..9``, ``no step``."""
    if first is None:
        return "no step"
    return f"step {first}" if first == last else f"steps {first}..{last}"


def severity_label(severity: str) -> str:
    """The severity as written in every message: ``ERROR``."""
    return severity.upper()


def at(module: str | None) -> str:
    """`` at draft.model.fc`` (nothing without a module)."""
    return f" at {module}" if module else ""


def when(item: Counted) -> str:
    """``3 times, steps 0..4``; a finding made outside the forward steps (at load, at close) names no step."""
    where = steps_text(item.first_step, item.last_step) if item.first_step is not None else "outside any step"
    return f"{times(item.count)}, {where}"


def modules_text(modules: Sequence[str], shown: int = 3) -> str:
    """``a, b, c +2``: the first few modules a finding was seen at."""
    more = f" +{len(modules) - shown}" if len(modules) > shown else ""
    return ", ".join(modules[:shown]) + more


def headline(codes: int, errors: int, roots: int = 0, consequences: int = 0) -> str:
    """``Findings: 1 root cause, 2 consequences (3 codes, 2 errors)``; ``Findings: 2 codes, 1 error``
    when nothing follows from another; ``Findings: none`` with no code."""
    if not codes:
        return "Findings: none"
    counts = f"{plural(codes, 'code')}, {plural(errors, 'error')}"
    if not consequences:
        return f"Findings: {counts}"
    return f"Findings: {plural(roots, 'root cause')}, {plural(consequences, 'consequence')} ({counts})"


def findings_headline(items: Sequence[Shown]) -> str:
    """The viewer's headline: every code that follows from none counts as a root cause."""
    errors = sum(1 for i in items if i.severity == "error")
    consequences = sum(1 for i in items if i.root is not None)
    return headline(len(items), errors, len(items) - consequences, consequences)


def then_text(codes: Iterable[str]) -> str:
    """What follows from a root, cleared by its fix: ``acceptance_collapse, fc_bypass (cleared by this fix)``."""
    return f"{', '.join(codes)} (cleared by this fix)"


def cleared_text(beneath: Sequence[Any]) -> str:
    """The viewer's line above a root's consequences: ``2 consequences, cleared by this fix:``."""
    also = any(getattr(c, "also_from", None) for c in beneath)
    cleared = "those marked 'also from' need that fix too" if also else "cleared by this fix"
    return f"{plural(len(beneath), 'consequence')}, {cleared}:"


def orphan_root_text(item: Any) -> str:
    """A consequence shown without its root (hidden by ``--finding``): whose fix clears it."""
    return f"follows from {item.root} (not shown: --finding); {item.how}"


def orphan_fix_text(item: Any) -> str:
    return f"{item.root_fix or item.fix} (the fix of {item.root})"


def more_codes(n: int, where: str = "--finding CODE or --json") -> str:
    """``… 3 more codes: --finding CODE or --json``."""
    return f"… {plural(n, 'more code')}: {where}"


def more_consequences(n: int, where: str = "") -> str:
    """``   … 3 more consequences`` (``: where`` when given)."""
    return f"   … {n} more consequences" + (f": {where}" if where else "")


def plus_more(n: int) -> str:
    """`` (+2 more)``: other codes behind the one shown (nothing when none)."""
    return f" (+{n} more)" if n else ""


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, ``…`` where it was cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def cut_words(text: str, limit: int) -> str:
    """Like :func:`cut`, between words where one ends late enough: a half word reads as a typo."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 1, 0)]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip(" ,;:(") + "…"


def first_clause(message: str, limit: int = 90) -> str:
    """The message's first clause (up to ``; ``), cut to ``limit``: the whole is in the trace."""
    return cut(message.split("; ")[0], limit)


# ----------------------------------------------------------------------------- plain text


def record_lines(findings: Sequence[Finding]) -> list[str]:
    """Every record, two lines each (the long form of a failing assertion):
    ``  ERROR code at module (step 3): message`` then ``      fix: ...``."""
    if not findings:
        return ["Findings: none."]
    lines = [f"Findings ({len(findings)}):"]
    for f in findings:
        step = f" (step {f.step})" if f.step is not None else ""
        lines.append(f"  {severity_label(f.severity)} {f.code}{at(f.module)}{step}: {f.message}")
        lines.append(f"      fix: {f.fix}")
    return lines


def root_cause_lines(findings: Sequence[Finding], width: int = 116) -> list[str]:
    """Findings as a failing test shows them: each root cause (one per code and module, most
    severe first) with its module, what was seen and its one fix; what follows from it in
    one line beneath. Each line cut to ``width``."""
    items = entries(findings)
    lines: list[str] = []
    shown: set[tuple[str, str | None]] = set()
    for e in sorted(items, key=lambda e: SEVERITY_RANK.get(e.severity, 9)):
        if e.root is not None or (e.code, e.module) in shown:
            continue
        shown.add((e.code, e.module))
        lines.append(cut(f"{severity_label(e.severity)} {e.code}{at(e.module)}: {e.message}", width))
        lines.append(cut(f"  fix: {e.fix}", width))
        follows = sorted({g.code for g in items if g.root == e.code})
        if follows:
            lines.append(cut(f"  then: {then_text(follows)}", width))
    return lines


def brief_lines(findings: Sequence[Finding]) -> list[str]:
    """Two lines a finding, lower-case severity (compare-train's report): ``error code: message`` then ``  fix: ...``."""
    lines: list[str] = []
    for f in findings:
        lines += [f"{f.severity} {f.code}: {f.message}", f"  fix: {f.fix}"]
    return lines


def announcement(f: Finding) -> str:
    """The block the recorder writes to stderr the first time an error code is seen."""
    return (
        f"\n==== spectrace: {severity_label(f.severity)} {f.code}{at(f.module)} ====\n"
        f"  cause: {f.message}\n"
        f"  fix:   {f.fix}\n"
        f"{ANNOUNCE_TAIL}\n"
    )


def summary_lines(items: Sequence[Any]) -> list[str]:
    """The notebook's findings section (view groups): a headline counting the roots that
    have consequences, then each root's line, its fix, and ``then`` a line per consequence."""
    if not items:
        return ["Findings: none"]
    errors = sum(1 for f in items if f.severity == "error")
    consequences = sum(1 for f in items if f.root is not None)
    roots = sum(1 for f in items if f.consequences)
    lines = [headline(len(items), errors, roots, consequences)]
    w = max(len(f.code) for f in items)
    for b in blocks(items, orphans=False):
        f = b.head
        lines.append(f"  {severity_label(f.severity):<7} {f.code:<{w}}  x{f.count}  {f.message}")
        lines.append(f"  {'':<7} {'fix':>{w}}  {f.fix}")
        for c in b.beneath:
            # A consequence: cleared by its root's fix, so it shows none of its own.
            lines.append(f"  {'':<7} {'then':>{w}}  {c.code}: {c.message}")
    return lines


TABLE_HEAD = ("severity", "code", "count", "seen", "fix")


def table_rows(items: Sequence[Any]) -> list[list[str]]:
    """One row per group (:data:`TABLE_HEAD`): a consequence's fix cell says whose fix clears it."""
    return [[f.severity, f.code, str(f.count), f.message, f.fix if f.root is None else f"(follows from {f.root})"] for f in items]


# ----------------------------------------------------------------------------- JSON


def to_dict(e: Entry) -> dict[str, Any]:
    """One judged finding as JSON-able data: the record's fields, then ``cause``, ``follows_from``,
    ``root``, ``how``, ``root_fix``, ``also_from`` and ``consequences``."""
    out = e.finding.model_dump(mode="json")
    out.update(
        cause=e.cause,
        follows_from=e.follows_from,
        root=e.root,
        how=e.how,
        root_fix=e.root_fix,
        also_from=list(e.also_from),
        consequences=list(e.consequences),
    )
    return out


def to_dicts(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Every record judged, as :func:`to_dict` gives it (same order)."""
    return [to_dict(e) for e in entries(findings)]


# ----------------------------------------------------------------------------- evidence


EVIDENCE_LINES = 3  # the evidence row's height at most; the whole of it is in --json


def short_value(v: object, limit: int) -> str:
    """``v`` in at most ``limit`` characters; a list or dict is cut between its items
    (``[0, 2, +3 more]``), never in the middle of one."""
    text = str(v)
    if len(text) <= limit:
        return text
    if isinstance(v, (list, tuple, dict)):
        # A nested value is cut the same way, in a part of the room.
        room = max(12, limit // 2)
        if isinstance(v, dict):
            items = [f"{k!r}: {short_value(x, room) if isinstance(x, (list, tuple, dict)) else repr(x)}" for k, x in v.items()]
        else:
            items = [short_value(x, room) if isinstance(x, (list, tuple, dict)) else repr(x) for x in v]
        open_, close = ("{", "}") if isinstance(v, dict) else ("[", "]")
        kept: list[str] = []
        for i, item in enumerate(items):
            more = f", +{len(items) - i} more" if kept else f"+{len(items) - i} more"
            if len(open_ + ", ".join([*kept, item]) + f", +{len(items) - i - 1} more" + close) > limit:
                return open_ + ", ".join(kept) + more + close
            kept.append(item)
        return open_ + ", ".join(kept) + close
    return text[: max(1, limit - 3)] + "..."


def fit_evidence(evidence: Mapping[str, object], width: int, lines: int = EVIDENCE_LINES) -> str:
    """``k=v, k=v`` in about ``lines`` lines of ``width``: each value cut to one line, the
    items past that counted (``+2 more``). A wider console shows more of each value."""
    width = max(20, width)
    budget = lines * width - width // 4  # the terminal wraps at spaces: leave it room
    items = list(evidence.items())
    out = ""
    for i, (k, v) in enumerate(items):
        part = f"{k}={short_value(v, width - len(k) - 3)}"
        text = f"{out}, {part}" if out else part
        left = len(items) - i - 1
        if out and len(text) + (len(f", +{left} more") if left else 0) > budget:
            return f"{out}, +{left + 1} more"
        out = text
    return out


# ----------------------------------------------------------------------------- stacked


STACK_LABEL_W = 8  # seen / cause / fix / applies
STACK_INDENT = 2 + STACK_LABEL_W + 2  # where a stacked row's value starts


def stack(label: str, value: str, width: int) -> list[str]:
    """``label`` then ``value`` wrapped at spaces to ``width``; a word longer than the line
    stands whole on its own line, so an identifier in a fix can be copied as printed."""
    room = max(width - STACK_INDENT, 20)
    lines = textwrap.wrap(value, room, break_long_words=False, break_on_hyphens=False) or [""]
    pad = " " * STACK_INDENT
    return [f"  {label:<{STACK_LABEL_W}}  {lines[0]}", *(pad + line for line in lines[1:])]


def stacked_lines(f: Finding, width: int, extra: Sequence[tuple[str, str]] = ()) -> list[str]:
    """One finding as the audit prints it: ``ERROR  code  (module)``, then seen, cause (the
    catalogue's), fix and each ``extra`` (label, value) row, wrapped to ``width``."""
    head = f"{severity_label(f.severity)}  {f.code}" + (f"  ({f.module})" if f.module else "")
    out = textwrap.wrap(head, width, break_long_words=False, break_on_hyphens=False)
    out += stack("seen", f.message, width)
    entry = CATALOGUE.get(f.code)
    if entry is not None:
        out += stack("cause", entry.meaning, width)
    out += stack("fix", f.fix, width)
    for label, value in extra:
        out += stack(label, value, width)
    return out

"""What the loader reads trace files into: a :class:`TraceSet` of :class:`TraceFile`, the
records split by type, acceptance folded per step (:class:`AcceptanceLog`), and each kind of
trouble counted as one :class:`LoadProblem` whose message is a single line."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from spectrace.records import (
    Acceptance,
    Call,
    Capture,
    Counters,
    Coverage,
    Finding,
    Fingerprint,
    Header,
    Values,
    Weights,
)

from .limits import (
    MAX_ACCEPTANCE_STEPS,
    MAX_CALLS_PER_FILE,
    MAX_KEPT_BYTES,
    MAX_LINE_BYTES,
    MAX_POSITIONS,
)

# (kind, one-line description); the count and first line number are added when reported.
_KINDS: dict[str, tuple[str, str]] = {
    "truncated": ("last line is truncated (writer killed or still writing)", ""),
    "undecodable": ("undecodable line (not UTF-8 JSON)", "undecodable lines (not UTF-8 JSON)"),
    "too_long": (f"line longer than {MAX_LINE_BYTES >> 20} MB skipped", f"lines longer than {MAX_LINE_BYTES >> 20} MB skipped"),
    "unknown_type": ("record of an unknown type skipped", "records of an unknown type skipped"),
    "invalid": ("record that does not match the schema skipped", "records that do not match the schema skipped"),
    "not_object": ("line that is JSON but not a record object", "lines that are JSON but not record objects"),
    "no_header": ("first line is not a header; records read anyway", ""),
    "extra_header": ("extra header line ignored", "extra header lines ignored"),
    "calls_capped": (
        f"call records beyond the first {MAX_CALLS_PER_FILE} not loaded",
        f"call records beyond the first {MAX_CALLS_PER_FILE} not loaded",
    ),
    "implausible": ("record with an impossible value skipped", "records with impossible values skipped"),
    "bad_time": ("time stamp that is no date ignored", "time stamps that are no dates ignored"),
    "not_loaded": (
        f"record not loaded: the viewer's memory budget ({MAX_KEPT_BYTES >> 20} MB of records) is spent",
        f"records not loaded: the viewer's memory budget ({MAX_KEPT_BYTES >> 20} MB of records) is spent",
    ),
    "findings_folded": ("finding kept as a count only", "findings kept as counts only (a flood of one code, or the memory budget)"),
    "acceptance_steps": (
        f"acceptance record past the first {MAX_ACCEPTANCE_STEPS} steps is in the totals only",
        f"acceptance records past the first {MAX_ACCEPTANCE_STEPS} steps are in the totals only, not in the per-step series",
    ),
}


class LoadProblem(BaseModel):
    """One kind of trouble in one file, counted; ``message`` is a single line."""

    path: str
    kind: str
    count: int = 1
    first_line: int | None = None
    detail: str = ""
    # The path the user named (a file, a missing path): said whole, as given, since its last
    # part alone (``null`` for /dev/null) does not say which file it was. A file found in a
    # named folder is said by its name: the folder heads the screen already.
    given: bool = Field(False, exclude=True)

    @property
    def message(self) -> str:
        name = shown_path(self.path if self.given or self.kind == "missing" else os.path.basename(self.path) or self.path)
        if self.kind in ("future_schema", "not_trace", "empty", "unreadable", "missing", "not_regular"):
            return f"{name}: {self.detail}"
        one, many = _KINDS.get(self.kind, (self.kind, self.kind))
        text = f"{name}: {self.count} {one if self.count == 1 else many or one}"
        if self.kind == "truncated":
            text = f"{name}: {one}; 1 line skipped"
        elif self.kind == "no_header":
            text = f"{name}: {one}"
        elif self.first_line is not None:
            text += f" (first at line {self.first_line})"
        if self.detail:
            text += f": {self.detail}"
        return text


class AcceptanceLog:
    """Acceptance records folded per step as they are read: the state is one short row per
    step (at most :data:`MAX_ACCEPTANCE_STEPS` of them per set), never the records.

    A row is ``[records, sum of accept lengths, requests, draft tokens (max), records with
    positions, accepted at position 0, 1, ...]``. Records at steps past the cap fold into
    ``beyond``, one row for the rest of the run, so the totals still count them.
    """

    __slots__ = ("by_step", "beyond", "beyond_first", "beyond_last", "records")

    def __init__(self) -> None:
        self.by_step: dict[int, list[int]] = {}
        self.beyond: list[int] | None = None
        self.beyond_first: int | None = None
        self.beyond_last: int | None = None
        self.records = 0

    def __len__(self) -> int:
        return self.records

    def __bool__(self) -> bool:
        return self.records > 0

    def steps(self) -> list[int]:
        """Every step that had an acceptance record (the per-step ones, then the range past the cap)."""
        out = list(self.by_step)
        if self.beyond_first is not None and self.beyond_last is not None:
            out += [self.beyond_first, self.beyond_last]
        return out

    def add(self, a: Acceptance, *, new_step_ok: bool) -> bool:
        """Fold one record; False when its step is new and ``new_step_ok`` is not (it went to ``beyond``)."""
        self.records += 1
        row = self.by_step.get(a.step)
        kept = True
        if row is None:
            if new_step_ok:
                row = self.by_step[a.step] = [0, 0, 0, 0, 0]
            else:
                kept = False
                if self.beyond is None:
                    self.beyond = [0, 0, 0, 0, 0]
                row = self.beyond
                self.beyond_first = a.step if self.beyond_first is None else min(self.beyond_first, a.step)
                self.beyond_last = a.step if self.beyond_last is None else max(self.beyond_last, a.step)
        fold_row(row, a)
        return kept


def fold_row(row: list[int], a: Acceptance) -> None:
    row[0] += 1
    row[1] += sum(a.accept_lengths)
    row[2] += len(a.accept_lengths)
    row[3] = max(row[3], a.draft_tokens)
    if a.accepted_per_position:
        row[4] += 1
        positions = a.accepted_per_position[:MAX_POSITIONS]
        if len(row) < 5 + len(positions):
            row.extend([0] * (5 + len(positions) - len(row)))
        for i, n in enumerate(positions):
            row[5 + i] += n


def merge_rows(into: list[int], row: list[int]) -> None:
    into[0] += row[0]
    into[1] += row[1]
    into[2] += row[2]
    into[3] = max(into[3], row[3])
    into[4] += row[4]
    if len(into) < len(row):
        into.extend([0] * (len(row) - len(into)))
    for i in range(5, len(row)):
        into[i] += row[i]


class FoldedFindings(BaseModel):
    """Findings of one code kept as a count only (past :data:`MAX_FINDINGS_PER_CODE`, or the budget)."""

    code: str
    severity: str
    count: int = 0
    first_step: int | None = None
    last_step: int | None = None


class TraceFile(BaseModel):
    """The records of one process's trace file, split by type."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    path: str
    header: Header | None = None
    calls: list[Call] = []
    findings: list[Finding] = []
    findings_folded: dict[tuple[str, str], FoldedFindings] = {}
    acceptance: AcceptanceLog = Field(default_factory=AcceptanceLog)
    coverage: list[Coverage] = []
    weights: list[Weights] = []
    captures: list[Capture] = []
    fingerprints: list[Fingerprint] = []
    values: list[Values] = []  # tensor values kept beside the trace (SPECTRACE_CAPTURE_VALUES)
    counters: list[Counters] = []  # the closing record (one per closed file); the newest few
    problems: list[LoadProblem] = []
    lines_read: int = 0

    @property
    def name(self) -> str:
        return shown_path(os.path.basename(self.path))

    @property
    def rank(self) -> int | None:
        return self.header.rank if self.header else None

    @property
    def record_count(self) -> int:
        return (
            len(self.calls)
            + len(self.findings)
            + sum(f.count for f in self.findings_folded.values())
            + len(self.acceptance)
            + len(self.coverage)
            + len(self.weights)
            + len(self.captures)
            + len(self.fingerprints)
            + len(self.values)
            + len(self.counters)
        )

    @property
    def readable(self) -> bool:
        return self.header is not None or self.record_count > 0


class TraceSet(BaseModel):
    """All trace files of one run; ``problems`` covers the set (e.g. an empty folder) and every file."""

    source: str
    files: list[TraceFile] = []
    set_problems: list[LoadProblem] = []

    @property
    def problems(self) -> list[LoadProblem]:
        return self.set_problems + [p for f in self.files for p in f.problems]

    @property
    def readable(self) -> bool:
        return any(f.readable for f in self.files)

    def all(self, field: str) -> list[Any]:
        """Records of one kind across files, e.g. ``ts.all("findings")``."""
        return [r for f in self.files for r in getattr(f, field)]


def shown_path(path: str) -> str:
    """A path as text any output can carry: the bytes of a name that is not UTF-8 (decoded
    with surrogates) written out as ``\\xff``, so ``--json`` never fails on it."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")

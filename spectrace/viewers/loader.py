"""Read trace files (or a folder of them) into a :class:`TraceSet`: pure data, no rendering.

Bad input never raises. Each kind of trouble in a file (a truncated last line, random
bytes, an unknown record type, a newer schema, a file that is no trace at all) becomes
one counted, one-line :class:`LoadProblem`; the readable records are kept. Memory is
bounded: files are read line by line, lines longer than :data:`MAX_LINE_BYTES` are
skipped without being held, and a file whose first line is no trace is abandoned.

    >>> ts = load_traces("traces/")
    >>> [p.message for p in ts.problems]
    ['trace-h-1.jsonl: last line is truncated (writer killed or still writing); 1 line skipped']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from spectrace.records import (
    LEGACY_RECORD_TYPES,
    RECORD_ADAPTER,
    RECORD_TYPES,
    SCHEMA_VERSION,
    Acceptance,
    Call,
    Capture,
    Counters,
    Coverage,
    Finding,
    Fingerprint,
    Header,
    Weights,
)

MAX_LINE_BYTES = 1 << 20  # a record this long is a writer bug or not a trace; never hold it
MAX_CALLS_PER_FILE = 200_000  # ~ a few hundred MB of parsed records; more is counted, not kept
_SKIP_CHUNK = 1 << 16

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
}


class LoadProblem(BaseModel):
    """One kind of trouble in one file, counted; ``message`` is a single line."""

    path: str
    kind: str
    count: int = 1
    first_line: int | None = None
    detail: str = ""

    @property
    def message(self) -> str:
        name = os.path.basename(self.path) or self.path
        if self.kind in ("future_schema", "not_trace", "empty", "unreadable", "missing"):
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


class TraceFile(BaseModel):
    """The records of one process's trace file, split by type."""

    path: str
    header: Header | None = None
    calls: list[Call] = []
    findings: list[Finding] = []
    acceptance: list[Acceptance] = []
    coverage: list[Coverage] = []
    weights: list[Weights] = []
    captures: list[Capture] = []
    fingerprints: list[Fingerprint] = []
    counters: list[Counters] = []  # the closing record (one per closed file)
    problems: list[LoadProblem] = []
    lines_read: int = 0

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def rank(self) -> int | None:
        return self.header.rank if self.header else None

    @property
    def record_count(self) -> int:
        return (
            len(self.calls)
            + len(self.findings)
            + len(self.acceptance)
            + len(self.coverage)
            + len(self.weights)
            + len(self.captures)
            + len(self.fingerprints)
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


_FIELD_OF = {
    "call": "calls",
    "finding": "findings",
    "acceptance": "acceptance",
    "coverage": "coverage",
    "weights": "weights",
    "capture": "captures",
    "fingerprint": "fingerprints",
    "counters": "counters",
    "stats": "counters",  # the closing record's name before schema 2
}


class FileReader:
    """Parses one file incrementally: feed it complete lines, it fills a :class:`TraceFile`.

    Used for a one-shot load (read to the end) and for ``--follow`` (read what was appended,
    keep the offset, leave an unterminated last line for the next poll).
    """

    def __init__(self, path: str) -> None:
        self.file = TraceFile(path=path)
        self.offset = 0
        self.lineno = 0
        self.abandoned = False  # not a trace: stop reading it, whatever its size
        self._counts: dict[str, LoadProblem] = {}
        self._unknown_types: dict[str, int] = {}

    # -- reading ---------------------------------------------------------------------
    def read_available(self, *, final: bool) -> bool:
        """Read complete lines appended since the last call; ``final`` also takes an unterminated tail.

        Returns True when something new was read (records or problems).
        """
        if self.abandoned:
            return False
        before = (self.lineno, self.offset)
        try:
            with open(self.file.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # truncated or rotated under us: start over
                    self.__init__(self.file.path)  # type: ignore[misc]
                fh.seek(self.offset)
                while not self.abandoned:
                    start = fh.tell()
                    raw = fh.readline(MAX_LINE_BYTES + 1)
                    if not raw:
                        break
                    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                        self.lineno += 1
                        self._count("too_long")
                        self._maybe_abandon_after_first()
                        if self.abandoned:
                            break
                        if not self._skip_to_newline(fh):
                            # no newline until EOF: in follow mode wait for the rest of it
                            if not final:
                                self.lineno -= 1
                                self._uncount("too_long")
                                fh.seek(start)
                                break
                        self.offset = fh.tell()
                        continue
                    if not raw.endswith(b"\n") and not final:
                        break  # a line still being written
                    self.lineno += 1
                    self.offset = fh.tell()
                    self._parse(raw, last=not raw.endswith(b"\n"))
        except OSError as exc:
            self._set_fatal("unreadable", f"cannot read ({exc.strerror or exc})")
        self._publish()
        return (self.lineno, self.offset) != before

    def _skip_to_newline(self, fh: Any) -> bool:
        while True:
            chunk = fh.read(_SKIP_CHUNK)
            if not chunk:
                return False
            cut = chunk.find(b"\n")
            if cut >= 0:
                fh.seek(fh.tell() - len(chunk) + cut + 1)
                return True

    # -- parsing ---------------------------------------------------------------------
    def _parse(self, raw: bytes, *, last: bool) -> None:
        text = raw.strip()
        if not text:
            return
        try:
            obj = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[..." a million deep
            if last and self.file.readable:
                self._count("truncated")
            else:
                self._count("undecodable")
            self._maybe_abandon_after_first()
            return
        if not isinstance(obj, dict):
            self._count("not_object")
            self._maybe_abandon_after_first()
            return
        kind = obj.get("type")
        if kind == "header":
            self._parse_header(obj)
            return
        if not isinstance(kind, str) or (kind not in RECORD_TYPES and kind not in LEGACY_RECORD_TYPES):
            self._unknown_types[str(kind)[:40]] = self._unknown_types.get(str(kind)[:40], 0) + 1
            self._count("unknown_type")
            self._maybe_abandon_after_first()
            return
        if self.file.header is None and not self.file.readable and "no_header" not in self._counts:
            self._count("no_header")
        if kind == "call" and len(self.file.calls) >= MAX_CALLS_PER_FILE:
            self._count("calls_capped")
            return
        try:
            record = RECORD_ADAPTER.validate_python(obj)
        except ValidationError as exc:
            self._count("invalid", detail=_first_error(kind, exc))
            return
        getattr(self.file, _FIELD_OF[kind]).append(record)

    def _parse_header(self, obj: dict[str, Any]) -> None:
        if self.file.header is not None:
            self._count("extra_header")
            return
        try:
            header = Header.model_validate(obj)
        except ValidationError as exc:
            self._count("invalid", detail=_first_error("header", exc))
            return
        self.file.header = header
        if header.schema_version > SCHEMA_VERSION:
            self._counts["future_schema"] = LoadProblem(
                path=self.file.path,
                kind="future_schema",
                detail=f"written with schema_version {header.schema_version}, this viewer reads "
                f"{SCHEMA_VERSION}; records read as far as they match (upgrade spectrace)",
            )

    def _maybe_abandon_after_first(self) -> None:
        # A first line that is no record at all means this is not a trace: stop reading so
        # a multi-GB binary or log file costs one line, not the whole file.
        if self.lineno <= 1 and not self.file.readable:
            self.abandoned = True
            self._counts.clear()
            self._unknown_types.clear()
            self._set_fatal("not_trace", "not a spectrace trace (first line is not a JSON record); skipped")

    # -- problems --------------------------------------------------------------------
    def _count(self, kind: str, detail: str = "") -> None:
        problem = self._counts.get(kind)
        if problem is None:
            self._counts[kind] = LoadProblem(path=self.file.path, kind=kind, first_line=self.lineno, detail=detail)
        else:
            problem.count += 1

    def _uncount(self, kind: str) -> None:
        problem = self._counts.get(kind)
        if problem is not None:
            problem.count -= 1
            if problem.count <= 0:
                del self._counts[kind]

    def _set_fatal(self, kind: str, detail: str) -> None:
        self._counts[kind] = LoadProblem(path=self.file.path, kind=kind, detail=detail)

    def _publish(self) -> None:
        if "unknown_type" in self._counts:
            names = ", ".join(f"{k!r} x{n}" for k, n in sorted(self._unknown_types.items())[:4])
            self._counts["unknown_type"].detail = names
        if self.lineno == 0 and not self._counts and self.offset == 0:
            self._counts["empty"] = LoadProblem(path=self.file.path, kind="empty", detail="empty file")
        elif self.lineno > 0:
            self._counts.pop("empty", None)
        self.file.problems = list(self._counts.values())
        self.file.lines_read = self.lineno


def _first_error(kind: str, exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return kind
    err = errors[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if p != kind)
    return f"{kind}.{where}: {err.get('msg', '')}"[:120]


def trace_paths(path: str | os.PathLike[str]) -> list[str]:
    """The trace files a path names: the file itself, or a folder's ``trace-*.jsonl`` (else ``*.jsonl``)."""
    p = Path(path)
    if not p.is_dir():
        return [str(p)]
    found = sorted(str(q) for q in p.glob("trace-*.jsonl") if q.is_file())
    if not found:
        found = sorted(str(q) for q in p.glob("*.jsonl") if q.is_file())
    return found


def load_traces(path: str | os.PathLike[str]) -> TraceSet:
    """Load a trace file or a folder of them; never raises on bad input."""
    follower = TraceFollower(path)
    follower.poll(final=True)
    return follower.trace_set


class TraceFollower:
    """Incremental reader for ``--follow``: remembers offsets, reads only complete appended lines.

    >>> f = TraceFollower("traces/"); f.poll(); f.trace_set.files[0].calls[-1].step
    12
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.readers: dict[str, FileReader] = {}
        self.trace_set = TraceSet(source=self.path)

    def poll(self, *, final: bool = False) -> bool:
        """Pick up new files and appended lines; True when anything changed."""
        changed = False
        problems: list[LoadProblem] = []
        if not os.path.exists(self.path):
            problems.append(LoadProblem(path=self.path, kind="missing", detail="no such file or folder"))
        else:
            paths = trace_paths(self.path)
            if not paths:
                problems.append(LoadProblem(path=self.path, kind="empty", detail=_empty_detail(self.path)))
            for p in paths:
                if p not in self.readers:
                    self.readers[p] = FileReader(p)
                    changed = True
                changed |= self.readers[p].read_available(final=final)
        if [p.message for p in problems] != [p.message for p in self.trace_set.set_problems]:
            changed = True
        self.trace_set.set_problems = problems
        self.trace_set.files = [r.file for r in self.readers.values()]
        return changed


def _empty_detail(path: str) -> str:
    """Say where the traces are when they sit one folder down (spectrace demo's layout)."""
    detail = "folder holds no trace-*.jsonl files"
    try:
        below = sorted(
            entry.name
            for entry in os.scandir(path)
            if entry.is_dir() and any(n.startswith("trace-") and n.endswith(".jsonl") for n in os.listdir(entry.path))
        )
    except OSError:
        return detail
    if below:
        shown = ", ".join(below[:6]) + (f" (+{len(below) - 6} more)" if len(below) > 6 else "")
        detail += f"; its subfolders do: {shown} (view one of them)"
    return detail

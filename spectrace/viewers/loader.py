"""Read trace files (or a folder of them) into a :class:`TraceSet`: pure data, no rendering.

Bad input never raises. Each kind of trouble in a file (a truncated last line, random
bytes, an unknown record type, a newer schema, a file that is no trace at all) becomes
one counted, one-line :class:`LoadProblem` (with the first line number); the readable
records are kept. Only regular files are read (a FIFO or a device is refused unopened
for reading, so it cannot hang the viewer).

Memory is bounded whatever the trace's length or the number of files (:data:`LIMITS`, in
:mod:`.limits` with the plausibility checks; what is read lands in :mod:`.traceset`):
files are read line by line, lines longer than :data:`MAX_LINE_BYTES` are skipped without
being held, a file whose first line is no trace is abandoned, acceptance records are
folded per step as they are read (:class:`AcceptanceLog`), and the other records are kept
up to a budget of record text shared by the files of one set (:class:`LoadBudget`); what
does not fit is counted, never silently dropped. Every size a record claims (``draft_tokens``,
a shape, a count, a time stamp) is checked before anything is sized by it.

    >>> ts = load_traces("traces/")
    >>> [p.message for p in ts.problems]
    ['trace-h-1.jsonl: last line is truncated (writer killed or still writing); 1 line skipped']
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spectrace.checks.from_records import findings_from_records
from spectrace.checks.probe import PROBE_SUFFIX, probe_findings, withdraw
from spectrace.checks.replay import MAX_RESULT_BYTES, RESULT_SUFFIX, read_result
from spectrace.records import (
    LEGACY_RECORD_TYPES,
    RECORD_ADAPTER,
    RECORD_TYPES,
    SCHEMA_VERSION,
    Acceptance,
    Call,
    Finding,
    Header,
)
from spectrace.safe_files import SafeFileError, read_regular

from .limits import (
    LIMITS,
    MAX_CALLS_PER_FILE,
    MAX_COUNTERS,
    MAX_FINDINGS_PER_CODE,
    MAX_FOLDED_CODES,
    MAX_INT,
    MAX_LINE_BYTES,
    MAX_POSITIONS,
    LoadBudget,
    implausible,
    time_ok,
)
from .traceset import (
    AcceptanceLog,
    FoldedFindings,
    LoadProblem,
    TraceFile,
    TraceSet,
    merge_rows,
    shown_path,
)

_SKIP_CHUNK = 1 << 16
PROGRESS_STEP = 1 << 20  # bytes read between two calls of a load's progress callback
_TAIL = 64  # bytes before the read offset remembered to notice a rewritten file

_FIELD_OF = {
    "call": "calls",
    "finding": "findings",
    "acceptance": "acceptance",
    "coverage": "coverage",
    "weights": "weights",
    "capture": "captures",
    "fingerprint": "fingerprints",
    "values": "values",
    "counters": "counters",
    "stats": "counters",  # the closing record's name before schema 2
}


class FileReader:
    """Parses one file incrementally: feed it complete lines, it fills a :class:`TraceFile`.

    Used for a one-shot load (read to the end) and for ``--follow`` (read what was appended,
    keep the offset, leave an unterminated last line for the next poll). A file replaced
    (new inode), cut shorter, or rewritten under the reader is read again from the start;
    ``restarted`` says why, once, for the status line.
    """

    def __init__(self, path: str, budget: LoadBudget | None = None, *, given: bool = False) -> None:
        self.budget = budget or LoadBudget()
        self.given = given  # the path the user named, not a file found in a named folder
        self.restarted: str | None = None
        self._reset(path)

    def _reset(self, path: str) -> None:
        self.file = TraceFile(path=path)
        self.offset = 0
        self.lineno = 0
        self.abandoned = False  # not a trace: stop reading it, whatever its size
        self.kept_bytes = 0  # record text kept, taken from the budget
        self._identity: tuple[int, int] | None = None  # (device, inode) of what was read
        self._tail = b""  # the bytes just before ``offset``, as they were read
        self._counts: dict[str, LoadProblem] = {}
        self._unknown_types: dict[str, int] = {}
        self._not_loaded: dict[str, int] = {}
        self._findings_per_code: dict[str, int] = {}
        # Findings the calls imply (checks.from_records), made again when the calls change;
        # kept apart so a later pass replaces them rather than adding to them.
        self._derived: list[Finding] = []
        self._derived_from: tuple[int, int, str | None, tuple[str, ...]] = (-1, -1, None, ())

    def _restart(self, why: str) -> None:
        self.budget.release(self.kept_bytes, len(self.file.acceptance.by_step))
        self._reset(self.file.path)
        self.restarted = why

    # -- reading ---------------------------------------------------------------------
    def read_available(self, *, final: bool, progress: Callable[[int], None] | None = None) -> bool:
        """Read complete lines appended since the last call; ``final`` also takes an unterminated tail.

        ``progress``, when given, is called with this file's offset about every
        :data:`PROGRESS_STEP` bytes (the caller guards it). Returns True when something new
        was read (records or problems).
        """
        if self.abandoned:
            return False
        before = (self.lineno, self.offset, id(self.file))
        try:
            with _open_regular(self.file.path) as fh:
                st = os.fstat(fh.fileno())
                why = self._replaced(fh, st)
                if why:
                    self._restart(why)
                self._identity = (st.st_dev, st.st_ino)
                fh.seek(self.offset)
                self._read_lines(fh, final=final, progress=progress)
                if self.offset:
                    fh.seek(max(0, self.offset - _TAIL))
                    self._tail = fh.read(self.offset - fh.tell())
        except _NotRegular as exc:
            self.abandoned = True
            self._set_fatal("not_regular", f"not a regular file ({exc}); skipped")
        except OSError as exc:
            self._set_fatal("unreadable", f"cannot read ({exc.strerror or exc})")
        self._publish()
        return (self.lineno, self.offset, id(self.file)) != before

    def _replaced(self, fh: Any, st: os.stat_result) -> str | None:
        """Why what was read is no longer this file's start, or None (nothing read yet, or appended to)."""
        if not self.offset and not self.lineno:
            return None
        if self._identity is not None and self._identity != (st.st_dev, st.st_ino):
            return "rotated"  # a new file took the name
        if st.st_size < self.offset:
            return "truncated"  # shorter than what was read
        if self._tail:
            fh.seek(self.offset - len(self._tail))
            if fh.read(len(self._tail)) != self._tail:
                return "rewritten"  # cut and written again past the old offset
        return None

    def _read_lines(self, fh: Any, *, final: bool, progress: Callable[[int], None] | None = None) -> None:
        told = self.offset
        while not self.abandoned:
            if progress is not None and self.offset - told >= PROGRESS_STEP:
                told = self.offset
                progress(told)
            start = fh.tell()
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                self.lineno += 1
                self._count("too_long")
                self._maybe_abandon_after_first(f"its first line is longer than {MAX_LINE_BYTES} bytes")
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
            # ValueError also covers an integer of more than 4,300 digits.
            if last and self.file.readable:
                self._count("truncated")
            else:
                self._count("undecodable")
            self._maybe_abandon_after_first()
            return
        if not isinstance(obj, dict):
            self._count("not_object")
            self._maybe_abandon_after_first("its first line is JSON, not a spectrace record")
            return
        kind = obj.get("type")
        if kind == "header":
            self._parse_header(obj)
            return
        if not isinstance(kind, str) or (kind not in RECORD_TYPES and kind not in LEGACY_RECORD_TYPES):
            name = str(kind)[:40].encode("utf-8", "backslashreplace").decode("utf-8")  # "\ud800" too
            self._unknown_types[name] = self._unknown_types.get(name, 0) + 1
            self._count("unknown_type")
            # JSON of another program (a config, a log): no spectrace record type.
            self._maybe_abandon_after_first("its first line is JSON, not a spectrace record")
            return
        if self.file.header is None and not self.file.readable and "no_header" not in self._counts:
            self._count("no_header")
        field = _FIELD_OF[kind]
        if kind == "call" and len(self.file.calls) >= MAX_CALLS_PER_FILE:
            self._count("calls_capped")
            return
        if field not in ("acceptance", "counters", "findings") and not self._room(len(text)):
            self._skip_unloaded(kind)  # unvalidated: past the budget, parsing it would only cost time
            return
        try:
            record = RECORD_ADAPTER.validate_python(obj)
        except ValidationError as exc:
            self._release_room(field, len(text))
            self._count("invalid", detail=_first_error(kind, exc))
            return
        why = implausible(obj, record, text)
        if why:
            self._release_room(field, len(text))
            self._count("implausible", detail=f"{kind}: {why}")
            return
        self._fix_times(record)
        if field == "acceptance":
            self._add_acceptance(record)
        elif field == "counters":
            self.file.counters.append(record)
            if len(self.file.counters) > MAX_COUNTERS:
                # Counters are cumulative: the newest say all the older ones did.
                del self.file.counters[0]
        elif field == "findings":
            self._add_finding(record, len(text))
        else:
            getattr(self.file, field).append(record)

    def _room(self, n: int) -> bool:
        if self.budget.take(self.kept_bytes, n):
            self.kept_bytes += n
            return True
        return False

    def _release_room(self, field: str, n: int) -> None:
        if field not in ("acceptance", "counters", "findings"):
            self.kept_bytes -= n
            self.budget.used -= n

    def _skip_unloaded(self, kind: str) -> None:
        self._not_loaded[kind] = self._not_loaded.get(kind, 0) + 1
        self._count("not_loaded")

    def _add_acceptance(self, a: Acceptance) -> None:
        budget = self.budget
        room = budget.steps < budget.max_steps
        had = len(self.file.acceptance.by_step)
        if not self.file.acceptance.add(a, new_step_ok=room):
            self._count("acceptance_steps")
        budget.steps += len(self.file.acceptance.by_step) - had

    def _add_finding(self, fd: Finding, n: int) -> None:
        seen = self._findings_per_code.get(fd.code, 0)
        if seen < MAX_FINDINGS_PER_CODE and self._room(n):
            self._findings_per_code[fd.code] = seen + 1
            self.file.findings.append(fd)
            return
        folded = self.file.findings_folded
        key = (fd.code, fd.severity)
        if key not in folded and len(folded) >= MAX_FOLDED_CODES:
            key = ("(other codes)", fd.severity)
        entry = folded.get(key)
        if entry is None:
            entry = folded[key] = FoldedFindings(code=key[0], severity=key[1])
        entry.count += 1
        if fd.step is not None:
            entry.first_step = fd.step if entry.first_step is None else min(entry.first_step, fd.step)
            entry.last_step = fd.step if entry.last_step is None else max(entry.last_step, fd.step)
        self._count("findings_folded")

    def _fix_times(self, record: Any) -> None:
        """A time stamp that is no date (NaN, inf, 1e20, negative) is dropped, counted, never shown."""
        name = "started_unix" if isinstance(record, Header) else "t_unix"
        t = getattr(record, name, None)
        if t is None or t == 0.0 or time_ok(t):
            return
        setattr(record, name, 0.0 if isinstance(record, (Header, Call)) else None)
        self._count("bad_time", detail=f"{record.type}.{name} {t!r}")

    def _parse_header(self, obj: dict[str, Any]) -> None:
        if self.file.header is not None:
            self._count("extra_header")
            return
        try:
            header = Header.model_validate(obj)
        except ValidationError as exc:
            self._count("invalid", detail=_first_error("header", exc))
            return
        why = implausible(obj, header)
        if why:
            self._count("implausible", detail=f"header: {why}")
            return
        self._fix_times(header)
        self.file.header = header
        if header.schema_version > SCHEMA_VERSION:
            self._counts["future_schema"] = LoadProblem(
                path=self.file.path,
                kind="future_schema",
                detail=f"written with schema_version {header.schema_version}, this viewer reads "
                f"{SCHEMA_VERSION}; records read as far as they match (upgrade spectrace)",
            )

    def _maybe_abandon_after_first(self, why: str = "its first line is not JSON") -> None:
        # A first line that is no record at all means this is not a trace: stop reading so
        # a multi-GB binary or log file costs one line, not the whole file.
        if self.lineno <= 1 and not self.file.readable:
            self.abandoned = True
            self._counts.clear()
            self._unknown_types.clear()
            self._set_fatal("not_trace", f"not a spectrace trace ({why}); skipped")

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
        if "not_loaded" in self._counts:
            self._counts["not_loaded"].detail = ", ".join(f"{n} {k}" for k, n in sorted(self._not_loaded.items()))
        if "findings_folded" in self._counts:
            folded = sorted(self.file.findings_folded.values(), key=lambda f: -f.count)
            self._counts["findings_folded"].detail = ", ".join(f"{f.code} x{f.count}" for f in folded[:4])
        if self.lineno == 0 and not self._counts and self.offset == 0:
            self._counts["empty"] = LoadProblem(path=self.file.path, kind="empty", detail="empty file")
        elif self.lineno > 0:
            self._counts.pop("empty", None)
        self.file.problems = list(self._counts.values())
        for problem in self.file.problems:
            problem.given = self.given
        self.file.lines_read = self.lineno
        self._derive()

    def _derive(self) -> None:
        """The findings the file's calls imply, as every other consumer makes them, and a
        replay result written beside it."""
        f = self.file
        derived_ids = {id(d) for d in self._derived}
        recorded = [fd for fd in f.findings if id(fd) not in derived_ids]
        replay = _replay_result(f.path)
        probe = _beside(f.path, PROBE_SUFFIX)
        said = probe_findings(probe)
        key = (len(f.calls), len(recorded), replay.message if replay is not None else None, tuple(p.message for p in said))
        if key == self._derived_from:
            return
        self._derived_from = key
        self._derived = findings_from_records(f.calls, recorded, f.coverage)
        if replay is not None:
            self._derived.append(replay)
        self._derived += said
        # The warnings a probe has settled (the served draft won on their axis) are withdrawn.
        kept = withdraw(recorded + self._derived, probe)
        still = {id(k) for k in kept}
        self._derived = [d for d in self._derived if id(d) in still]
        f.findings = kept


def _beside(path: str, suffix: str) -> Any:
    """The JSON result a command wrote beside this trace file (``<stem><suffix>``), parsed; None when absent or unreadable."""
    stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else None
    if stem is None or not os.path.exists(stem + suffix):
        return None
    try:
        return json.loads(read_regular(stem + suffix, MAX_RESULT_BYTES).decode("utf-8"))
    except (SafeFileError, OSError, ValueError, RecursionError):  # RecursionError: a "[[[[..." bomb
        return None


def _replay_result(path: str) -> Finding | None:
    """What ``spectrace replay`` wrote beside this trace file (``<stem>.replay.json``), as
    its finding; None when there is none, it agrees, or it cannot be read."""
    stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else None
    if stem is None or not os.path.exists(stem + RESULT_SUFFIX):
        return None
    return read_result(stem + RESULT_SUFFIX)


class _NotRegular(Exception):
    """The path is a FIFO, a device or a socket: never read (a FIFO would block forever)."""


def _open_regular(path: str) -> Any:
    """Open for reading without blocking on a FIFO, and refuse anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "not a file"
            )
            raise _NotRegular(kind)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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


def load_traces(path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None) -> TraceSet:
    """Load a trace file or a folder of them; never raises on bad input.

    ``progress``, when given, is called with (bytes read so far, total bytes of the regular
    files being read) about every :data:`PROGRESS_STEP` bytes and once at the end with the
    total; a callback that raises is ignored from then on (it never stops the load)."""
    follower = TraceFollower(path)
    follower.poll(final=True, progress=progress)
    return follower.trace_set


class _Meter:
    """A load's progress over its files: sizes taken once before reading, the callback
    guarded so a failing one is dropped, never raised into the loader."""

    def __init__(self, callback: Callable[[int, int], None], paths: list[str]) -> None:
        self.callback: Callable[[int, int], None] | None = callback
        self.sizes: dict[str, int] = {}
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                self.sizes[p] = st.st_size
        self.total = sum(self.sizes.values())
        self.done = 0  # bytes of the files already read through

    def tell(self, done: int) -> None:
        if self.callback is None:
            return
        try:
            self.callback(min(done, self.total), self.total)
        except Exception:  # a progress display's bug must never stop a load
            self.callback = None

    def file(self, path: str) -> Callable[[int], None]:
        size = self.sizes.get(path, 0)
        return lambda offset: self.tell(self.done + min(offset, size))

    def file_done(self, path: str) -> None:
        self.done += self.sizes.get(path, 0)
        self.tell(self.done)


class TraceFollower:
    """Incremental reader for ``--follow``: remembers offsets, reads only complete appended lines.

    >>> f = TraceFollower("traces/"); f.poll(); f.trace_set.files[0].calls[-1].step
    12
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.readers: dict[str, FileReader] = {}
        self.trace_set = TraceSet(source=self.path)
        self.budget = LoadBudget()
        self.notices: list[str] = []  # files read again from the start, once each time, newest last

    def poll(self, *, final: bool = False, progress: Callable[[int, int], None] | None = None) -> bool:
        """Pick up new files and appended lines; True when anything changed.

        ``progress``: as for :func:`load_traces` (bytes of the files read through, their total size)."""
        changed = False
        problems: list[LoadProblem] = []
        if not os.path.exists(self.path):
            problems.append(LoadProblem(path=self.path, kind="missing", detail="no such file or folder"))
        else:
            paths = trace_paths(self.path)
            if not paths:
                problems.append(LoadProblem(path=self.path, kind="empty", detail=_empty_detail(self.path)))
            self.budget.files = max(1, len(paths))
            meter = _Meter(progress, paths) if progress is not None else None
            for p in paths:
                if p not in self.readers:
                    self.readers[p] = FileReader(p, self.budget, given=not os.path.isdir(self.path))
                    changed = True
                reader = self.readers[p]
                changed |= reader.read_available(final=final, progress=meter.file(p) if meter else None)
                if meter is not None:
                    meter.file_done(p)
                if reader.restarted:
                    self.notices.append(f"{reader.restarted}: {reader.file.name} read again from the start")
                    reader.restarted = None
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
            shown_path(entry.name)
            for entry in os.scandir(path)
            if entry.is_dir() and any(n.startswith("trace-") and n.endswith(".jsonl") for n in os.listdir(entry.path))
        )
    except OSError:
        return detail
    if below:
        shown = ", ".join(below[:6]) + (f" (+{len(below) - 6} more)" if len(below) > 6 else "")
        detail += f"; its subfolders do: {shown} (view one of them)"
    return detail


# What the viewers, the notebook and the tests import from here: the loaded data and the bounds.
__all__ = [
    "LIMITS",
    "MAX_INT",
    "MAX_LINE_BYTES",
    "MAX_POSITIONS",
    "PROGRESS_STEP",
    "AcceptanceLog",
    "FileReader",
    "FoldedFindings",
    "LoadBudget",
    "LoadProblem",
    "TraceFile",
    "TraceFollower",
    "TraceSet",
    "implausible",
    "load_traces",
    "merge_rows",
    "shown_path",
    "time_ok",
    "trace_paths",
]

"""``spectrace export``: a trace as Chrome Trace Event Format JSON, for a timeline viewer.

ui.perfetto.dev and chrome://tracing open the file. Each traced process (trace file) is
one process of the timeline; in it:

- a ``steps`` track: one complete event (``"X"``) per step, from the start of its first
  call to the end of its last;
- one track per root module (``target``, ``draft``, or the traced model's class): the
  module calls as complete events, a call's sub-modules nested inside it, with the
  call's tensors (shape, dtype, statistics) as its args;
- a ``findings`` track: each finding and coverage note as an instant event (``"i"``);
- an ``accept length`` counter (``"C"``): the mean accept length of each verify step.

What the records carry decides how things are drawn. A call record has one time stamp,
``t_unix``, taken when the call returned, and no start: the hooks see the calls in the
order they return, so a call is drawn from the end of the call recorded just before it in
the same step (the earliest it can have started) to its own time stamp, and a call with
sub-modules from where its first sub-module starts. The first call of a step has nothing
before it and is drawn with no duration at its end. Records carry no thread, so calls of
one process from several threads at once would be drawn as one sequence. An acceptance
record has no time stamp: its counter point sits at the end of its step's last call. A
finding or a coverage note is drawn at its own time stamp, else at the end of its step.
Whatever cannot be placed (a call without a time stamp, a step without any timed call,
findings the viewer kept as counts only) is counted in the file's ``otherData.not_drawn``
and said once on stderr.

The command's arguments and exit status are ``cli/export.py``'s.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from spectrace.records import Call, Coverage, Finding, TensorMeta
from spectrace.rules.acceptance import mean_from_sums

from .calls import SelectedCall
from .loader import TraceFile, TraceSet, shown_path, time_ok
from .model import ViewFilter
from .render import plural, shape

STEPS_TID = 1
FINDINGS_TID = 2
FIRST_ROOT_TID = 10
NO_ROOT = "calls"  # the track of calls whose record names no root

DRAWING = (
    "A call record holds the time its call returned (t_unix) and no start. A call is drawn from the end "
    "of the call recorded before it in the same step to its own time; a call with sub-modules from its "
    "first sub-module's start; a step's first call with no duration. Steps span their calls. Acceptance "
    "points sit at the end of their step's last call; findings and coverage notes at their own time, else "
    "at the end of their step."
)


# ------------------------------------------------------------------------- the file
def _version() -> str:
    # The installed distribution's version: ``spectrace.__version__`` would make the
    # package (and its torch-importing API) a dependency of the viewers.
    try:
        from importlib.metadata import version

        return version("spectrace")
    except Exception:  # noqa: BLE001 - run from a source tree that is not installed
        return "unknown"


class TraceEvent(BaseModel):
    """One event of the Chrome Trace Event Format (the fields the viewers require)."""

    name: str
    ph: Literal["X", "i", "C", "M"]
    ts: float = Field(description="microseconds since otherData.t0_unix")
    pid: int
    tid: int
    dur: float | None = None  # "X" only
    cat: str | None = None
    s: Literal["t", "p", "g"] | None = None  # "i" only: the instant's scope
    args: dict[str, Any] = {}


class NotDrawn(BaseModel):
    """What the records hold but the timeline cannot place (each said once on stderr)."""

    calls_without_time: int = 0
    acceptance_steps_without_time: int = Field(0, description="steps with acceptance records but no timed call")
    acceptance_beyond_cap: int = Field(0, description="acceptance records the viewer kept in totals only")
    findings_without_time: int = 0
    findings_kept_as_counts: int = Field(0, description="findings past the viewer's per-code cap")
    coverage_without_time: int = 0


class ExportCounts(BaseModel):
    processes: int = 0
    calls: int = 0
    steps: int = 0
    findings: int = 0
    coverage: int = 0
    acceptance_points: int = 0


class ExportSummary(BaseModel):
    source: str
    exported_by: str = Field(default_factory=lambda: f"spectrace {_version()}")
    t0_unix: float = Field(description="the time every ts counts from (Unix seconds)")
    drawing: str = DRAWING
    counts: ExportCounts
    not_drawn: NotDrawn


class ChromeTrace(BaseModel):
    """The file ``spectrace export`` writes (JSON object form of the Trace Event Format)."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: Literal["ms", "ns"] = "ms"
    otherData: ExportSummary


# ------------------------------------------------------------------------- building
@dataclass
class _Slice:
    call: Call
    start: int  # ns
    end: int  # ns
    children: list[_Slice] = field(default_factory=list)


@dataclass
class _Process:
    file: TraceFile
    pid: int
    calls: list[Call] = field(default_factory=list)
    roots: dict[str, int] = field(default_factory=dict)  # root -> tid
    step_end: dict[int, int] = field(default_factory=dict)  # step -> end of its last call (ns), every call of the step


def _ns(t: float) -> int:
    return int(round(t * 1e9))


def _strip(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v is not False}


def _tensor_args(m: TensorMeta) -> dict[str, Any]:
    st = m.stats
    out: dict[str, Any] = {"shape": shape(m.shape), "dtype": m.dtype, "device": m.device}
    if st is not None:
        out.update(mean=st.mean, std=st.std, absmax=st.absmax, nan=st.nan, inf=st.inf, numel=st.numel)
    else:
        out["stats"] = "none recorded"
    return _strip(out)


def _tensors(metas: list[TensorMeta]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metas:
        key, n = m.arg, 2
        while key in out:  # two tensors recorded under one name: keep both
            key, n = f"{m.arg} ({n})", n + 1
        out[key] = _tensor_args(m)
    return out


def call_args(c: Call) -> dict[str, Any]:
    """A call slice's args: where it sits, and every tensor's shape, dtype and statistics."""
    args = _strip(
        {
            "step": c.step,
            "call": c.seq,
            "module": c.module,
            "module_type": c.module_type,
            "role": c.role,
            "forward_mode": c.forward_mode,
            "tokens": c.tokens,
            "draft_step": c.draft_step,
            "graph_capture": c.graph_capture,
            "graph_replay": c.graph_replay,
            "graph": c.graph,
        }
    )
    args["inputs"] = _tensors(c.inputs)
    args["outputs"] = _tensors(c.outputs)
    return args


def _is_inside(child: Call, parent: Call) -> bool:
    return child.root == parent.root and (parent.module == "" or child.module.startswith(parent.module + "."))


def step_slices(calls: list[Call], has_children: set[str]) -> list[_Slice]:
    """The calls of one step (call order, all with a time stamp) as intervals, outermost
    first and in the order they began (a viewer meets a parent before its children).

    The hooks record a call when it returns, so a module's sub-modules come before it.
    Subtrees not yet claimed by a parent wait in ``pending``; a call with sub-modules
    claims them from the earliest one named under it (what ran between them ran inside
    it), and starts where that one starts."""
    pending: list[_Slice] = []
    prev_end: int | None = None
    for c in calls:
        end = _ns(c.t_unix)
        sl = _Slice(c, end if prev_end is None else min(prev_end, end), end)
        if c.module in has_children or c.module == "":
            first = next((i for i, s in enumerate(pending) if _is_inside(s.call, c)), None)
            if first is not None:
                sl.children = pending[first:]
                del pending[first:]
                sl.start = min(sl.start, min(s.start for s in sl.children))
                sl.end = max(end, max(s.end for s in sl.children))
        pending.append(sl)
        prev_end = end
    out: list[_Slice] = []
    stack = list(reversed(pending))
    while stack:  # pre-order, iteratively: nesting has no depth limit
        sl = stack.pop()
        out.append(sl)
        stack.extend(reversed(sl.children))
    return out


def _names_with_children(calls: Iterable[Call]) -> set[str]:
    """Module names some other recorded module sits under (most calls are leaves: they skip the search)."""
    out: set[str] = set()
    for c in calls:
        parts = c.module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return out


class _Builder:
    def __init__(self, ts: TraceSet, flt: ViewFilter, selected: list[SelectedCall]) -> None:
        self.ts = ts
        self.flt = flt
        self.events: list[TraceEvent] = []
        self._order: dict[int, int] = {}  # id(call event) -> its place in the steps' pre-orders, one after another
        self.meta: list[TraceEvent] = []
        self.not_drawn = NotDrawn()
        self.counts = ExportCounts()
        files = [f for f in ts.files if flt.rank is None or f.rank == flt.rank]
        by_file: dict[int, list[Call]] = {id(f): [] for f in files}
        for sel in selected:
            by_file[id(sel.file)].append(sel.call)
        self.processes: list[_Process] = []
        used: set[int] = set()
        for f in files:
            pid = f.header.pid if f.header else 0
            if pid <= 0 or pid in used:  # no header, or two hosts' processes share a pid
                pid = max(used | {1 << 22}) + 1
            used.add(pid)
            self.processes.append(_Process(f, pid, by_file[id(f)]))
        self.t0 = self._origin()

    def _origin(self) -> int:
        """The earliest time drawn (a window of steps starts at its own first event); the
        earliest process start when nothing with a time stamp is drawn."""
        flt = self.flt
        times: list[float] = []
        for p in self.processes:
            times += [c.t_unix for c in p.calls if c.t_unix and time_ok(c.t_unix)]
            notes = [fd for fd in p.file.findings if flt.finding_ok(fd)] + [cv for cv in p.file.coverage if flt.step_ok(cv.step)]
            times += [r.t_unix for r in notes if r.t_unix is not None and time_ok(r.t_unix)]
        if not times:
            times = [f.header.started_unix for f in self.ts.files if f.header and time_ok(f.header.started_unix)]
        return _ns(min(times)) if times else 0

    def _us(self, ns: int) -> float:
        return (ns - self.t0) / 1000

    def build(self) -> ChromeTrace:
        for p in self.processes:
            self._process(p)
        self.counts.processes = len(self.processes)
        # Equal starts (a call with no duration, its parent, its next sibling): the order
        # they began in, so a viewer nests them as they ran.
        order = self._order
        self.events.sort(key=lambda e: (e.ts, order.get(id(e), -1)))
        summary = ExportSummary(source=shown_path(self.ts.source), t0_unix=self.t0 / 1e9, counts=self.counts, not_drawn=self.not_drawn)
        return ChromeTrace(traceEvents=self.meta + self.events, otherData=summary)

    def _process(self, p: _Process) -> None:
        f = p.file
        h = f.header
        label = f"{h.host} pid {h.pid}" if h else f.name
        if f.rank is not None:
            label += f" rank {f.rank}"
        self._meta(p.pid, 0, "process_name", {"name": label})
        if f.rank is not None:
            self._meta(p.pid, 0, "process_sort_index", {"sort_index": f.rank})
        self._meta(p.pid, STEPS_TID, "thread_name", {"name": "steps"})
        self._meta(p.pid, FINDINGS_TID, "thread_name", {"name": "findings"})
        timed = [c for c in p.calls if c.t_unix]
        self.not_drawn.calls_without_time += len(p.calls) - len(timed)
        self._calls(p, timed)
        self._step_ends(p)
        self._acceptance(p)
        self._notes(p)

    def _meta(self, pid: int, tid: int, name: str, args: dict[str, Any]) -> None:
        self.meta.append(TraceEvent(name=name, ph="M", ts=0, pid=pid, tid=tid, args=args))

    def _tid(self, p: _Process, root: str) -> int:
        name = root or NO_ROOT
        tid = p.roots.get(name)
        if tid is None:
            tid = p.roots[name] = FIRST_ROOT_TID + len(p.roots)
            self._meta(p.pid, tid, "thread_name", {"name": name})
            self._meta(p.pid, tid, "thread_sort_index", {"sort_index": tid})
        return tid

    def _calls(self, p: _Process, calls: list[Call]) -> None:
        has_children = _names_with_children(calls)
        steps: dict[int, list[Call]] = {}
        for c in calls:
            steps.setdefault(c.step, []).append(c)
        for step, step_calls in steps.items():
            slices = step_slices(step_calls, has_children)
            for sl in slices:
                c = sl.call
                event = TraceEvent(
                    name=c.module or c.module_type,
                    ph="X",
                    ts=self._us(sl.start),
                    dur=(sl.end - sl.start) / 1000,
                    pid=p.pid,
                    tid=self._tid(p, c.root),
                    cat=c.role or "call",
                    args=call_args(c),
                )
                self._order[id(event)] = len(self._order)
                self.events.append(event)
            start, end = min(s.start for s in slices), max(s.end for s in slices)
            modes = sorted({c.forward_mode for c in step_calls if c.forward_mode})
            args: dict[str, Any] = {"step": step, "calls": len(step_calls)}
            if modes:
                args["forward_modes"] = modes
            self.events.append(
                TraceEvent(
                    name=f"step {step}" + (f" {modes[0]}" if len(modes) == 1 else ""),
                    ph="X",
                    ts=self._us(start),
                    dur=(end - start) / 1000,
                    pid=p.pid,
                    tid=STEPS_TID,
                    cat="step",
                    args=args,
                )
            )
            self.counts.calls += len(slices)
            self.counts.steps += 1

    def _step_ends(self, p: _Process) -> None:
        """Where each step of the process ends, over all its timed calls (not only those
        ``--module`` keeps): acceptance and findings of a step are placed there."""
        for c in p.file.calls:
            if c.t_unix and self.flt.step_ok(c.step):
                end = _ns(c.t_unix)
                if end > p.step_end.get(c.step, -1):
                    p.step_end[c.step] = end

    def _acceptance(self, p: _Process) -> None:
        log = p.file.acceptance
        for step in sorted(log.by_step):
            row = log.by_step[step]
            if not self.flt.step_ok(step) or not row[2]:
                continue
            end = p.step_end.get(step)
            if end is None:
                self.not_drawn.acceptance_steps_without_time += 1
                continue
            mean = round(mean_from_sums(row[1], row[2]) or 0.0, 4)
            self.events.append(TraceEvent(name="accept length", ph="C", ts=self._us(end), pid=p.pid, tid=0, args={"mean": mean}))
            self.counts.acceptance_points += 1
        if log.beyond is not None:
            self.not_drawn.acceptance_beyond_cap += log.beyond[0]

    def _place(self, p: _Process, record: Finding | Coverage) -> int | None:
        if record.t_unix is not None and time_ok(record.t_unix):
            return _ns(record.t_unix)
        return p.step_end.get(record.step) if record.step is not None else None

    def _notes(self, p: _Process) -> None:
        flt = self.flt
        for fd in p.file.findings:
            if not flt.finding_ok(fd):
                continue
            at = self._place(p, fd)
            if at is None:
                self.not_drawn.findings_without_time += 1
                continue
            args = _strip({"severity": fd.severity, "message": fd.message, "fix": fd.fix, "module": fd.module, "step": fd.step})
            if fd.evidence:
                args["evidence"] = fd.evidence
            self.events.append(
                TraceEvent(
                    name=fd.code, ph="i", s="t", ts=self._us(at), pid=p.pid, tid=FINDINGS_TID, cat=f"finding.{fd.severity}", args=args
                )
            )
            self.counts.findings += 1
        self.not_drawn.findings_kept_as_counts += sum(g.count for g in p.file.findings_folded.values())
        for cv in p.file.coverage:
            if not flt.step_ok(cv.step):
                continue
            at = self._place(p, cv)
            if at is None:
                self.not_drawn.coverage_without_time += 1
                continue
            args = _strip({"detail": cv.detail, "count": cv.count, "step": cv.step})
            self.events.append(
                TraceEvent(
                    name=f"coverage: {cv.kind}", ph="i", s="t", ts=self._us(at), pid=p.pid, tid=FINDINGS_TID, cat="coverage", args=args
                )
            )
            self.counts.coverage += 1


def build_timeline(ts: TraceSet, flt: ViewFilter, selected: list[SelectedCall]) -> ChromeTrace:
    """The timeline of loaded traces: the ``selected`` calls (``calls.select_calls``), and the
    steps, acceptance and notes that ``flt`` (rank, step, finding) keeps."""
    return _Builder(ts, flt, selected).build()


def not_drawn_lines(nd: NotDrawn) -> list[str]:
    """One line per kind of record the timeline leaves out."""
    lines = []
    if nd.calls_without_time:
        lines.append(f"{plural(nd.calls_without_time, 'call')} without a time stamp not drawn")
    if nd.acceptance_steps_without_time:
        lines.append(f"acceptance of {plural(nd.acceptance_steps_without_time, 'step')} not drawn: no call of those steps has a time stamp")
    if nd.acceptance_beyond_cap:
        lines.append(
            f"{plural(nd.acceptance_beyond_cap, 'acceptance record')} past the per-step cap not drawn (in the totals of spectrace view)"
        )
    if nd.findings_without_time:
        lines.append(f"{plural(nd.findings_without_time, 'finding')} without a time stamp or step not drawn")
    if nd.findings_kept_as_counts:
        lines.append(f"{plural(nd.findings_kept_as_counts, 'finding')} kept as counts only not drawn (spectrace view shows them)")
    if nd.coverage_without_time:
        lines.append(f"{plural(nd.coverage_without_time, 'coverage note')} without a time stamp or step not drawn")
    return lines


# ------------------------------------------------------------------------- writing
class WriteRefused(Exception):
    """The file cannot or must not be written; the message is one line."""


def refuse_to_clobber(path: str, *, force: bool) -> None:
    """A folder at ``path``, or anything at all without ``force``: one line (:class:`WriteRefused`)."""
    if os.path.isdir(path):
        raise WriteRefused(f"{shown_path(path)} is a folder; name the file to write")
    if os.path.lexists(path) and not force:
        raise WriteRefused(f"{shown_path(path)} exists; --force replaces it")


def write_new_file(path: str, text: str, *, force: bool) -> None:
    """Write ``text`` at ``path`` whole or not at all: through a temporary file beside it,
    linked into place so an existing file (or one that appears meanwhile) is never
    replaced without ``force``. A FIFO, a link or a device at the path is replaced, never
    written through. Every failure is one line (:class:`WriteRefused`)."""
    shown = shown_path(path)
    refuse_to_clobber(path, force=force)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteRefused(f"cannot write {shown}: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if the name was taken meanwhile: never clobbers
            except FileExistsError:
                raise WriteRefused(f"{shown} exists; --force replaces it")
            except OSError:  # a file system without hard links
                if os.path.lexists(path):
                    raise WriteRefused(f"{shown} exists; --force replaces it")
                os.replace(tmp, path)
    except OSError as exc:
        raise WriteRefused(f"cannot write {shown}: {exc.strerror or exc}")
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)

"""The view model: what the terminal shows, derived from a :class:`TraceSet`, no rendering.

Every part is a pydantic model so ``spectrace view --json`` is ``model_dump_json()`` and
tests can assert on data, not on pixels.

    >>> view = build_view(load_traces("traces/"))
    >>> view.datapath.fc.status
    'bypassed'

The data path is aggregated, never listed: per stage and forward mode, the records, how
many came from CUDA-graph replays, the real token rows, and the statistics of all its
tensors combined as one (mean weighted by numel, pooled std), over the whole run and over
the last ``window_steps`` traced steps. :class:`ViewBuilder` folds only the calls appended
since its last build, so ``spectrace view --follow`` stays cheap on a long live trace.
"""

from __future__ import annotations

import bisect
import math
import os
import socket
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from spectrace.checks.calls import check_fc_called, chunk_scale_outliers
from spectrace.checks.root_causes import root_causes
from spectrace.records import SEVERITY_RANK, Call, TensorMeta, TensorStats
from spectrace.rules.catalogue import CATALOGUE
from spectrace.rules.globs import suffix_match

from .drops import merge_reasons
from .loader import MAX_POSITIONS, TraceFile, TraceSet, merge_rows, shown_path, time_ok

HUGE_ABSMAX = 1e4  # a residual stream this large is overflow-bound in bf16/fp16
DEFAULT_WINDOW = 32  # the data path's recent span: the last N traced steps


class ViewFilter(BaseModel):
    """What ``spectrace view`` was asked to narrow to."""

    module: str | None = None  # glob, matched against the full name and as a suffix
    rank: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    finding: str | None = None
    window_steps: int = DEFAULT_WINDOW  # the data path's recent span: the last N traced steps

    def step_ok(self, step: int | None) -> bool:
        if step is None:
            return True
        if self.step_min is not None and step < self.step_min:
            return False
        return self.step_max is None or step <= self.step_max

    def module_ok(self, name: str | None) -> bool:
        return self.module is None or (name is not None and name_matches(name, self.module))

    def finding_ok(self, fd: Any) -> bool:
        """A finding record passes ``--step`` and ``--module`` (``--finding`` is applied apart)."""
        return self.step_ok(fd.step) and (not self.module or self.module_ok(fd.module))

    @property
    def steps_text(self) -> str:
        lo, hi = self.step_min, self.step_max
        return f"{lo}" if lo == hi and lo is not None else f"{'' if lo is None else lo}:{'' if hi is None else hi}"


def name_matches(name: str, pattern: str) -> bool:
    """``--module`` and the name rules: the one glob dialect, on the full dotted name or any
    dotted suffix (roots differ between engines).

        >>> name_matches("draft.model.fc", "model.fc"), name_matches("model.fc", "*fc")
        (True, True)
    """
    return suffix_match(name, pattern)


# ----------------------------------------------------------------------------------- parts
class ProcessInfo(BaseModel):
    file: str
    host: str | None = None
    pid: int | None = None
    rank: int | None = None
    schema_version: int | None = None
    spectrace_version: str | None = None
    records: int = 0
    # "closed" (its closing counters record is there), "running" (no closing record yet and
    # its process is alive on this host) or "not closed" (crashed or killed).
    state: str = "closed"
    last_record: str | None = None  # ISO UTC of the newest time stamp in the file


class HeaderSummary(BaseModel):
    source: str
    processes: list[ProcessInfo] = []
    ranks: list[int] = []
    step_first: int | None = None
    step_last: int | None = None
    steps_traced: int = 0
    started: str | None = None  # ISO UTC of the earliest header
    span_s: float | None = None
    records_dropped: int = 0
    # records_dropped split by the reason the writer recorded ("sink error", "record cap", ...)
    dropped_by_reason: dict[str, int] = {}
    # Files without their closing record: their drop counts were never written, so
    # "records dropped" is not known for them. One line each, e.g. "<file>: not closed ...".
    not_closed: list[str] = []
    hook_calls: int = 0  # spectrace's serving-engine hooks: how often they ran, and their host time
    # Steady state: start-up (graph capture, each hook's first calls) is paid once, so it is
    # in neither the per-call nor the per-step figures but in hook_startup_* alone.
    hook_us_per_call: float | None = None
    hook_steady_calls: int = 0
    hook_startup_calls: int = 0
    hook_startup_ms: float | None = None  # host time of the start-up calls, all of them together
    hook_us_per_verify_step: float | None = None
    hook_us_per_verify_step_by_feature: dict[str, float] = {}  # largest first
    # the part of the per-step figure spent in calls over 100 us (a lost CPU or a GIL wait)
    hook_us_per_verify_step_in_slow_calls: float | None = None
    coverage_gaps: list[str] = []
    graph_traced: str | None = None  # how replayed CUDA graphs were traced (in-graph statistics), if they were
    load_problems: list[str] = []
    # SPECTRACE_CAPTURE_VALUES: "FILE (N tokens x S steps)" per values file beside the trace (user data)
    values: list[str] = []


class FindingGroup(BaseModel):
    code: str
    severity: str
    count: int
    first_step: int | None = None
    last_step: int | None = None
    message: str
    cause: str
    fix: str
    modules: list[str] = []
    ranks: list[int] = []
    evidence: dict[str, Any] = {}
    # Root causes (decided by spectrace.checks.root_causes): a consequence names the finding
    # it follows from and the root at the top of that chain, whose fix clears it; a root
    # lists its consequences. Both None / empty: the finding stands alone.
    follows_from: str | None = None
    root: str | None = None
    how: str = ""  # why it follows from follows_from
    root_fix: str | None = None  # the root's fix: the one to apply
    also_from: list[str] = []  # other root causes shown that explain it as well
    consequences: list[str] = []


class StatsSummary(BaseModel):
    """Aggregate of TensorStats over calls: mean of means, mean of stds, max absmax, nan/inf sums."""

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int = 0
    inf: int = 0
    samples: int = 0


class MomentStats(BaseModel):
    """The statistics of many records' tensors combined as if they were one tensor: the
    mean weighted by numel, the pooled (population) std, the largest absmax, nan/inf summed.

    Records without a finite mean/std (a NaN in the tensor) add their nan/inf counts only.
    """

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int = 0
    inf: int = 0
    numel: int = 0  # the values mean and std cover
    records: int = 0  # records that carried statistics (one inside a graph capture has none)


class SpanStats(BaseModel):
    """Records of one slice of a stage over one span of steps (the whole run, or the window)."""

    records: int = 0
    graph_replay: int = 0  # statistics computed inside a replayed CUDA graph
    graph_capture: int = 0  # recorded while a graph was captured: shapes only
    eager: int = 0  # the others: eager steps
    rows: int | None = None  # real (unpadded) token rows, summed; None when no record says
    output: MomentStats | None = None
    input: MomentStats | None = None  # the first input (fc: the fused [T, 3H] draft input)


class SliceView(BaseModel):
    """One slice of a stage's records: one forward mode, one draft step, or all of them."""

    label: str  # the forward mode, "draft step N", or "all"
    forward_mode: str | None = None
    draft_step: int | None = None
    run: SpanStats = SpanStats()
    window: SpanStats = SpanStats()  # the last ``DataPath.window_steps`` traced steps


class LiveChunkView(BaseModel):
    """One chunk of the aux concat output (``output.chunk[i]``): one captured boundary."""

    index: int
    boundary: int | None = None
    width: int | None = None
    total: SliceView
    modes: list[SliceView] = []
    flags: list[str] = []


class FcWidths(BaseModel):
    """What fc was handed vs what it takes: the fc-bypass bug is an fc input as wide as the
    hidden size (the target captured no aux layers) and fc skipped."""

    in_widths: list[int] = []  # last dims of the draft's fused input (see in_from)
    in_from: str = ""  # "fc input", "fc_bypass finding", "aux concat output"
    in_features: int | None = None
    in_features_from: str = ""  # "fc input", "fc_bypass finding", "capture (expected)"
    hidden: int | None = None
    hidden_from: str = ""
    verdict: str = "unknown"  # ok / bypass / mismatch / unknown
    note: str = ""


class StageView(BaseModel):
    role: str
    modules: list[str] = []
    calls: int = 0
    in_shapes: list[list[int]] = []
    out_shapes: list[list[int]] = []
    dtypes: list[str] = []
    last: TensorStats | None = None
    # The whole run's output statistics combined by numel (see MomentStats); samples: the
    # records that carried statistics.
    agg: StatsSummary | None = None
    anomalies: list[str] = []
    status: str = "not seen"  # called / bypassed / not seen / loaded / missing ...
    note: str = ""
    total: SliceView | None = None  # every record of the stage
    modes: list[SliceView] = []  # one per forward mode seen (one "all" when none is recorded)
    draft_steps: list[SliceView] = []  # one per draft step of a multi-step draft, where recorded
    chunks: list[LiveChunkView] = []  # aux concat: its output chunks
    widths: FcWidths | None = None  # fc: its input width against in_features and hidden


class BoundaryView(BaseModel):
    """A captured boundary's source in the target: boundary b is ``target.layer[b-1]``'s
    output residual stream (b = 0: the embedding output)."""

    boundary: int
    role: str
    module: str | None = None
    total: SliceView | None = None  # None: that layer was never recorded
    modes: list[SliceView] = []
    # b0's own records carry no statistics (an embedding row identifies its token; see
    # docs/settings.md): its row then shows those of the aux concat chunk it feeds, and
    # this says so ("aux concat chunk 0"); None: the row's statistics are its own.
    stats_from: str | None = None


class CaptureView(BaseModel):
    module: str
    requested_ids: list[int] | None = None
    boundaries: list[int] = []
    num_layers: int
    hidden_size: int
    rule: str
    enabled: bool
    layers: list[BoundaryView] = []


class ChunkView(BaseModel):
    index: int
    boundary: int | None = None
    stats: TensorStats
    flags: list[str] = []


class FingerprintView(BaseModel):
    module: str
    chunk_width: int
    chunks: list[ChunkView] = []
    samples: int = 0


class DataPath(BaseModel):
    captures: list[CaptureView] = []
    aux: StageView
    fingerprints: list[FingerprintView] = []
    fc: StageView
    layer: StageView
    norm: StageView
    lm_head: StageView
    d2t: StageView
    target_lm_head: StageView = StageView(role="target_lm_head")
    window_steps: int = DEFAULT_WINDOW  # the recent span: the last N traced steps ...
    window_first_step: int | None = None  # ... from this step
    window_last_step: int | None = None  # ... to this one
    steps_seen: int = 0  # traced steps (of call records) in the run
    roles: bool = False  # the trace names each call's role (else stages are told by names)
    draft_vocab: int | None = None  # the draft lm_head's output width
    target_vocab: int | None = None  # the target lm_head's output width (d2t maps between them)
    module_filter: str | None = None  # --module: the stages it names; the others say so
    # An EAGLE-3 pair was traced: a draft (its roles, an fc, or names that say draft/eagle),
    # an aux concat or a capture record. Only then is there a data path to draw; a plain
    # model's layers are not a draft's, and a missing fc is no bypass.
    eagle3: bool = False


class AcceptanceView(BaseModel):
    steps: list[int] = []
    mean_accept: list[float] = []
    overall_mean: float | None = None
    draft_tokens: int | None = None
    requests: int = 0
    position_rate: list[float] = []


class ModuleRow(BaseModel):
    module: str
    module_type: str = ""
    role: str | None = None  # Call.role: draft.fc, target.layer[3], ... (None before roles)
    calls: int = 0
    out_shapes: list[list[int]] = []
    dtypes: list[str] = []
    agg: StatsSummary
    anomalies: list[str] = []  # from the recorded statistics, and a nonfinite finding naming it


class TraceView(BaseModel):
    header: HeaderSummary
    findings: list[FindingGroup] = []
    datapath: DataPath
    acceptance: AcceptanceView
    modules: list[ModuleRow] = []
    # A filter that matched nothing, in one line naming it and what the trace holds: the
    # view of an empty selection would read as a healthy run.
    filter_problem: str | None = None


# ------------------------------------------------------------------------------- building
def build_view(ts: TraceSet, flt: ViewFilter | None = None) -> TraceView:
    """Derive everything the viewer shows from loaded traces, narrowed by ``flt``."""
    return ViewBuilder(flt).build(ts)


class ViewBuilder:
    """Builds the view of a growing :class:`TraceSet` again and again (``--follow``): each
    build folds in only the calls appended since the previous one.

    Per file it keeps the steps, the module table's sums and, for a trace with roles, the
    data path's aggregates; a file that was truncated or replaced under the reader starts
    over. Traces without roles (older writers) tell the draft by names across the whole
    run, so their data path is folded again at each build.

        >>> builder = ViewBuilder(ViewFilter(window_steps=16))
        >>> view = builder.build(follower.trace_set)  # poll, build, poll, build ...
    """

    def __init__(self, flt: ViewFilter | None = None) -> None:
        self.flt = flt or ViewFilter()
        self._files: dict[str, _FileState] = {}
        self._module_ok: dict[str, bool] = {}

    def build(self, ts: TraceSet) -> TraceView:
        flt = self.flt
        files = [f for f in ts.files if flt.rank is None or f.rank == flt.rank]
        states = [self._update(f) for f in files]
        view = TraceView(
            header=_header(ts, files, states, flt),
            findings=_findings(files, flt),
            datapath=_datapath(files, states, flt),
            acceptance=_acceptance(files, flt),
            modules=_ModuleAcc.merged([s.modules for s in states]),
        )
        _flag_nonfinite_modules(view)
        view.filter_problem = _filter_problem(ts, files, view, flt, self._module_ok)
        return view

    def _update(self, f: TraceFile) -> _FileState:
        state = self._files.get(f.path)
        if state is None or state.file is not f or state.done > len(f.calls):
            state = self._files[f.path] = _FileState(f, max(1, self.flt.window_steps))
        calls = f.calls
        if state.done == len(calls):
            return state
        flt, module_ok = self.flt, self._module_ok
        for c in calls[state.done :] if state.done else calls:
            if not state.eagle3 and c.role and _eagle3_role(c.role):
                state.eagle3 = True  # before the filters: what was traced, not what is shown
            if not flt.step_ok(c.step):
                continue
            state.note_step(c)
            ok = module_ok.get(c.module)
            if ok is None:
                ok = module_ok[c.module] = flt.module_ok(c.module)
            if c.role:
                state.roled = True
            if ok:
                state.modules.feed(c)
                if c.role:  # --module narrows the data path too
                    state.path.feed(c, c.role)
        state.done = len(calls)
        return state


def _header(ts: TraceSet, files: list[TraceFile], states: list[_FileState], flt: ViewFilter) -> HeaderSummary:
    call_steps: set[int] = states[0].steps if len(states) == 1 else set().union(*(s.steps for s in states))
    acc_steps = {s for f in files for s in f.acceptance.steps() if flt.step_ok(s)}
    extra = acc_steps - call_steps
    firsts = [min(call_steps)] if call_steps else []
    lasts = [max(call_steps)] if call_steps else []
    if extra:
        firsts.append(min(extra))
        lasts.append(max(extra))
    procs = [
        ProcessInfo(
            file=f.name,
            host=f.header.host if f.header else None,
            pid=f.header.pid if f.header else None,
            rank=f.rank,
            schema_version=f.header.schema_version if f.header else None,
            spectrace_version=f.header.spectrace_version if f.header else None,
            records=f.record_count,
            state=closure_state(f),
            last_record=_iso(last_record_unix(f)),
        )
        for f in files
    ]
    starts = [f.header.started_unix for f in files if f.header and time_ok(f.header.started_unix)]
    stamped = [s.stamp for s in states if s.stamp is not None]
    started = span = None
    if starts:
        started = datetime.fromtimestamp(min(starts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        # Only call records carry a time: a serving trace under CUDA graphs (acceptance
        # records only) has no span to state, and "0.0 s" would read as a measurement.
        span = round(max(starts + stamped) - min(starts), 3) if stamped else None
    dropped, gaps = _coverage(files)
    return HeaderSummary(
        source=shown_path(ts.source),
        processes=procs,
        ranks=sorted({f.rank for f in files if f.rank is not None}),
        step_first=min(firsts) if firsts else None,
        step_last=max(lasts) if lasts else None,
        steps_traced=len(call_steps) + len(extra),
        started=started,
        span_s=span,
        records_dropped=dropped,
        dropped_by_reason=merge_reasons([_last_counters(f).dropped_by_reason for f in files if f.counters]),
        not_closed=[not_closed_line(f) for f in files if closure_state(f) != "closed"],
        **_hook_cost(files),
        coverage_gaps=[g for g in gaps if not g.startswith(GRAPH_TRACED)],
        graph_traced=next((g[len(GRAPH_TRACED) :] for g in gaps if g.startswith(GRAPH_TRACED)), None),
        load_problems=[p.message for p in ts.problems],
        values=[f"{v.file} ({v.tokens} tokens x {len(v.steps)} steps)" for f in files for v in f.values],
    )


def _hook_cost(files: list[TraceFile]) -> dict[str, Any]:
    """What spectrace's own serving hooks cost the host, steady state and start-up apart.

    Start-up (graph capture, each hook's first calls: imports, kernel compiles) is paid
    once, so it is neither in the per-call nor in the per-step figures: it is said apart,
    as the time it took and its calls. The per-step figure is split by patch-point feature
    (largest first), with the part of it spent in calls over 100 us.

    Counters are cumulative, so per file the last (largest) counters record counts; a verify
    step is one acceptance record.
    """
    calls = startup_calls = steps = 0
    seconds = slow = 0.0
    by_feature: dict[str, float] = {}
    for f in files:
        last = max(f.counters, key=lambda s: s.hook_calls, default=None)
        if last is None or not last.hook_calls:
            continue
        calls += last.hook_calls
        seconds += last.hook_seconds
        startup_calls += sum(n for k, n in last.hook_calls_by_feature.items() if k.endswith(STARTUP_SUFFIX))
        slow += sum(v for k, v in last.hook_slow_seconds_by_feature.items() if not k.endswith(STARTUP_SUFFIX))
        steps += len(f.acceptance)
        for feature, spent in last.hook_seconds_by_feature.items():
            by_feature[feature] = by_feature.get(feature, 0.0) + spent
    if not calls:
        return {}
    startup = sum(v for k, v in by_feature.items() if k.endswith(STARTUP_SUFFIX))
    serving, serving_calls = max(0.0, seconds - startup), max(0, calls - startup_calls)
    per_step = {
        k: round(v / steps * 1e6, 1)
        for k, v in sorted(by_feature.items(), key=lambda kv: -kv[1])
        if steps and not k.endswith(STARTUP_SUFFIX)
    }
    return {
        "hook_calls": calls,
        "hook_us_per_call": round(serving / serving_calls * 1e6, 2) if serving_calls else None,
        "hook_steady_calls": serving_calls,
        "hook_startup_calls": startup_calls,
        "hook_startup_ms": round(startup * 1e3, 1) if startup_calls or startup else None,
        "hook_us_per_verify_step": round(serving / steps * 1e6, 1) if steps else None,
        "hook_us_per_verify_step_by_feature": per_step,
        "hook_us_per_verify_step_in_slow_calls": round(slow / steps * 1e6, 1) if steps else None,
    }


STARTUP_SUFFIX = "@startup"
GRAPH_TRACED = "\0traced:"  # marks the in-graph tracing line among _coverage's lines


def _iso(unix: float | None) -> str | None:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if time_ok(unix) else None


def last_record_unix(f: TraceFile) -> float | None:
    """The newest time stamp in a file: its last call, finding, capture, ... or its header."""
    stamps = [f.header.started_unix] if f.header else []
    for kind in (f.calls[-1:], f.findings, f.coverage, f.weights, f.captures):
        stamps += [r.t_unix for r in kind if getattr(r, "t_unix", None)]
    stamps = [t for t in stamps if time_ok(t)]
    return max(stamps) if stamps else None


def _alive_here(f: TraceFile) -> bool:
    if f.header is None or f.header.host != socket.gethostname():
        return False
    try:
        os.kill(f.header.pid, 0)
    except PermissionError:
        return True  # alive, another user's
    except (OSError, OverflowError):
        return False
    return True


def closure_state(f: TraceFile) -> str:
    """Whether a file got its closing record (written at exit, on SIGTERM and at the end of
    ``trace()``): a file without one was cut by a crash or a SIGKILL, or is still written."""
    if f.counters:
        return "closed"
    return "running" if _alive_here(f) else "not closed"


def not_closed_line(f: TraceFile) -> str:
    last = _iso(last_record_unix(f)) or "unknown"
    if closure_state(f) == "running":
        return f"{f.name}: open, its process is still running (last record {last})"
    return (
        f"{f.name}: not closed: the process crashed or was killed (no closing record; last record {last}); "
        "records after that and its drop counts are not in the file"
    )


def _coverage(files: list[TraceFile]) -> tuple[int, list[str]]:
    """Records dropped and one line per kind of blind spot.

    Counters are cumulative per flush, so per file the largest one counts; coverage records
    are events, so they add up. Per file the larger of the two wins to avoid double counting.
    """
    dropped = replay = 0
    other: dict[str, list[Any]] = defaultdict(lambda: [0, ""])
    for f in files:
        stats_dropped = max((s.records_dropped for s in f.counters), default=0)
        stats_replay = max((s.graph_replay_steps for s in f.counters), default=0)
        repeats = _once_counts(f)

        def count(c: Any, repeats: dict[str, int] = repeats) -> int:
            return repeats.get(c.once_key, c.count) if c.once_key else c.count

        cov_dropped = sum(count(c) for c in f.coverage if c.kind == "dropped")
        cov_replay = sum(count(c) for c in f.coverage if c.kind == "graph_replay")
        dropped += max(stats_dropped, cov_dropped)
        replay += max(stats_replay, cov_replay)
        internal = max((s.internal_errors for s in f.counters), default=0)
        for c in f.coverage:
            if c.kind in ("dropped", "graph_replay"):
                continue
            entry = other[c.kind]
            entry[0] += count(c)
            entry[1] = entry[1] or c.detail
        if internal and "internal_error" not in other:
            other["internal_error"] = [internal, "see the process log"]
    gaps: list[str] = []
    if replay:
        gaps.append(f"{replay} steps ran under CUDA-graph replay and were not traced per module")
    traced = sum(max((s.graph_replays_traced for s in f.counters), default=0) for f in files)
    readbacks = sum(max((s.graph_readbacks for s in f.counters), default=0) for f in files)
    lost = sum(max((s.graph_readbacks_dropped for s in f.counters), default=0) for f in files)
    if traced:
        # Not a blind spot, but what the per-module figures of replayed steps rest on.
        gaps.append(
            GRAPH_TRACED
            + f"{traced} CUDA-graph replays carried statistics kernels; {readbacks} read back"
            + (f", {lost} read-backs lost (pinned ring full)" if lost else "")
        )
    words = {
        "not_covered": "not covered",
        "unhooked": "modules not hooked",
        "internal_error": "internal errors in spectrace",
        "sink_error": "sink errors (records not written)",
    }
    for kind in sorted(other):
        count, detail = other[kind]
        gaps.append(f"{count} {words.get(kind, kind)}: {detail}" if detail else f"{count} {words.get(kind, kind)}")
    return dropped, gaps


def _last_counters(f: TraceFile) -> Any:
    """The counters record that counts: they are cumulative, so the one with the most drops."""
    return max(f.counters, key=lambda s: s.records_dropped)


def _once_counts(f: TraceFile) -> dict[str, int]:
    """How often each record said once really happened (the closing counters record says)."""
    return f.counters[-1].once_counts if f.counters else {}


def _findings(files: list[TraceFile], flt: ViewFilter) -> list[FindingGroup]:
    groups: dict[tuple[str, str], FindingGroup] = {}
    for f in files:
        repeats = _once_counts(f)
        for fd in f.findings:
            if not flt.finding_ok(fd):
                continue
            key = (fd.code, fd.severity)
            g = groups.get(key)
            if g is None:
                entry = CATALOGUE.get(fd.code)
                # model_construct: the values come validated from the records; a trace can
                # hold tens of thousands of codes, and validation was most of their cost.
                g = groups[key] = FindingGroup.model_construct(
                    code=fd.code,
                    severity=fd.severity,
                    count=0,
                    message=fd.message,
                    cause=entry.meaning if entry else "",
                    fix=fd.fix or (entry.fix if entry else ""),
                    evidence=fd.evidence,
                )
            g.count += repeats.get(fd.once_key, 1) if fd.once_key else 1
            if fd.step is not None:
                g.first_step = fd.step if g.first_step is None else min(g.first_step, fd.step)
                g.last_step = fd.step if g.last_step is None else max(g.last_step, fd.step)
            if fd.module and fd.module not in g.modules:
                g.modules.append(fd.module)
            if f.rank is not None and f.rank not in g.ranks:
                g.ranks.append(f.rank)
        if flt.module or flt.step_min is not None or flt.step_max is not None:
            continue  # counts only: no module, no step of each; the load problem line says so
        for (code, severity), folded in f.findings_folded.items():
            g = groups.get((code, severity))
            if g is None:
                entry = CATALOGUE.get(code)
                g = groups[(code, severity)] = FindingGroup(
                    code=code,
                    severity=severity,
                    count=0,
                    message="(kept as a count only: see the load problems)",
                    cause=entry.meaning if entry else "",
                    fix=entry.fix if entry else "",
                )
            g.count += folded.count
            for step in (folded.first_step, folded.last_step):
                if step is not None:
                    g.first_step = step if g.first_step is None else min(g.first_step, step)
                    g.last_step = step if g.last_step is None else max(g.last_step, step)
            if f.rank is not None and f.rank not in g.ranks:
                g.ranks.append(f.rank)
    # Judged over every finding the step and module filters pass, before --finding: a
    # consequence shown alone still names its root and the root's fix.
    out = _by_root_cause(list(groups.values()))
    return [g for g in out if not flt.finding or g.code == flt.finding]


def _by_root_cause(found: list[FindingGroup]) -> list[FindingGroup]:
    """Each root cause followed by its consequences (nearest first); the others in their order.

    One pass over the groups (a trace can hold tens of thousands of codes): each
    consequence is filed under its root once, and chain depths are memoised.
    """
    by_code = {g.code: g for g in found if g.severity == "error"}
    beneath: dict[str, list[FindingGroup]] = defaultdict(list)
    for g, judged in zip(found, root_causes(found)):
        if judged.follows_from is None and judged.root is None and not judged.also:
            continue  # stands alone: the defaults say so already (a pydantic setattr costs)
        g.follows_from, g.root, g.how, g.also_from = judged.follows_from, judged.root, judged.how, list(judged.also)
        if judged.root is not None:
            g.root_fix = by_code[judged.root].fix
            beneath[judged.root].append(g)

    depths: dict[str, int] = {}

    def depth(g: FindingGroup) -> int:
        d, at = 0, g
        while at.follows_from is not None and d < len(found):
            if at.code in depths:
                d += depths[at.code]
                break
            d, at = d + 1, by_code[at.follows_from]
        depths[g.code] = d
        return d

    # Causes before symptoms: an acceptance collapse is explained by the other findings.
    symptom = {"acceptance_collapse": 1}

    def key(g: FindingGroup) -> tuple[int, int, int, str]:
        return (SEVERITY_RANK.get(g.severity, 9), symptom.get(g.code, 0), -g.count, g.code)

    out: list[FindingGroup] = []
    for g in sorted((g for g in found if g.root is None), key=key):
        below = sorted(beneath.get(g.code, []), key=lambda c: (depth(c), key(c))) if g.severity == "error" else []
        if below:
            g.consequences = [c.code for c in below]
        out += [g, *below]
    return out


# ------------------------------------------------------------------------------ data path
# The roles (``Call.role``, decided from the module tree when the hook was attached) that
# make each stage. Traces written before roles existed carry none: for them the stages
# fall back to suffix globs over names (``ROLE_PATTERNS``; roots differ: ``draft.model.fc``,
# ``model.fc``, ``fc``) and the draft is guessed from its names (``_draft_calls``).
STAGE_ROLES: dict[str, tuple[str, ...]] = {
    "aux": ("target.aux_concat",),
    "fc": ("draft.fc",),
    "layer": ("draft.layer",),
    "norm": ("draft.norm",),
    "lm_head": ("draft.lm_head",),
    "target_lm_head": ("target.lm_head",),
}
ROLE_PATTERNS: dict[str, tuple[str, ...]] = {
    "aux": ("*aux_concat*", "*aux_hidden*"),
    "fc": ("fc",),
    "layer": ("layers.0", "midlayer"),
    "norm": ("norm",),
    "lm_head": ("lm_head",),
}
_DRAFT_WORDS = ("draft", "eagle")


def _is_draftish(c: Call) -> bool:
    text = f"{c.root} {c.module} {c.module_type}".lower()
    return any(w in text for w in _DRAFT_WORDS)


def _draft_calls(calls: list[Call]) -> list[Call]:
    """Calls that belong to the draft model, guessed from names (traces without roles).

    The target also has ``model.norm``, ``lm_head`` and ``model.layers.0``, so names alone
    cannot tell: a call is the draft's if its root/name/type says draft/eagle, or it shares
    a root with a draft-only module (``fc``, ``midlayer``). When nothing tells, every call is
    a candidate (a single-model trace).
    """
    draft_roots = {
        c.root for c in calls if c.root and (_is_draftish(c) or name_matches(c.module, "fc") or name_matches(c.module, "midlayer"))
    }
    tagged = [c for c in calls if _is_draftish(c) or (c.root and c.root in draft_roots)]
    if tagged:
        return tagged
    # Without roots: keep the names under an fc's prefix when there is one.
    prefixes = {c.module[: -len("fc")] for c in calls if name_matches(c.module, "fc")}
    if prefixes:
        heads = {p[: -len("model.")] if p.endswith("model.") else p for p in prefixes}
        keep = {p for p in prefixes | heads if p}  # an empty prefix would take the target too
        if keep:
            return [c for c in calls if any(c.module.startswith(p) for p in keep)]
    return calls


def _eagle3_role(role: str) -> bool:
    return role.startswith("draft.") or role == STAGE_ROLES["aux"][0]


def _legacy_eagle3(calls: Iterable[Call]) -> bool:
    """A trace without roles holds an EAGLE-3 pair when a name says so: an fc, a midlayer,
    an aux concat, or draft/eagle in a root, name or type. A plain model has none of them."""
    for c in calls:
        if _is_draftish(c) or name_matches(c.module, "fc") or name_matches(c.module, "midlayer"):
            return True
        if any(name_matches(c.module, p) for p in ROLE_PATTERNS["aux"]):
            return True
    return False


def draft_calls(calls: list[Call], roled: set[int]) -> list[Call]:
    """The draft's calls, in trace order: by role where the trace has roles, else guessed."""
    legacy = [c for c in calls if id(c) not in roled]
    mine = {id(c) for c in calls if id(c) in roled and c.role and c.role.startswith("draft.")}
    mine |= {id(c) for c in _draft_calls(legacy)} if legacy else set()
    return [c for c in calls if id(c) in mine]


def _final_norm_candidate(c: Call, roled: set[int]) -> bool:
    # Names only: a norm inside the decoder layer is not the final norm (a role says so itself).
    return id(c) in roled or (not name_matches(c.module, "layers.**") and "midlayer" not in c.module)


def _legacy_role(c: Call, draft: set[int]) -> str | None:
    """The stage of a call in a trace without roles, as the role it would have had."""
    if any(name_matches(c.module, p) for p in ROLE_PATTERNS["aux"]):
        return STAGE_ROLES["aux"][0]
    if id(c) not in draft:
        return None
    for stage in ("fc", "layer", "norm", "lm_head"):
        if stage == "norm" and not _final_norm_candidate(c, set()):
            continue
        if any(name_matches(c.module, p) for p in ROLE_PATTERNS[stage]):
            return STAGE_ROLES[stage][0]
    return None


# ---------------------------------------------------------------- data path aggregation
# Output args the hooks write: a decoder layer's residual stream (its (out, residual) pair
# summed), an aux concat's chunks (one per captured boundary), else the tensor itself.
RESIDUAL_ARG = "output.residual_stream"
CHUNK_PREFIX = "output.chunk["
# Rows in data-flow order: prefill, verify, draft extend, draft decode; others after.
MODE_ORDER = ("EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND", "DECODE")
_Key = tuple[str, "str | None", "int | None", "int | None"]  # role, forward mode, draft step, chunk


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Moments:
    """Running numel-weighted mean and pooled M2 (Chan et al.), absmax, nan/inf counts."""

    __slots__ = ("n", "mean", "m2", "absmax", "nan", "inf", "records")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.absmax: float | None = None
        self.nan = 0
        self.inf = 0
        self.records = 0

    def add(self, st: TensorStats, shape: Sequence[int], count: bool = True) -> None:
        if count:
            self.records += 1
        if st.nan:
            self.nan += st.nan
        if st.inf:
            self.inf += st.inf
        a = st.absmax
        if a is not None and a == a and (self.absmax is None or a > self.absmax):
            self.absmax = a
        m, sd = st.mean, st.std
        if m is None or sd is None or not (math.isfinite(m) and math.isfinite(sd)):
            return
        k = st.numel or _numel(shape)
        if k <= 0:
            return
        n = self.n + k
        d = m - self.mean
        self.mean += d * (k / n)
        self.m2 += sd * sd * k + d * d * (self.n * k / n)
        self.n = n

    def merge(self, o: _Moments) -> None:
        self.records += o.records
        self.nan += o.nan
        self.inf += o.inf
        if o.absmax is not None and (self.absmax is None or o.absmax > self.absmax):
            self.absmax = o.absmax
        if o.n:
            n = self.n + o.n
            d = o.mean - self.mean
            self.mean += d * (o.n / n)
            self.m2 += o.m2 + d * d * (self.n * o.n / n)
            self.n = n

    def view(self) -> MomentStats:
        has = self.n > 0
        return MomentStats(
            mean=self.mean if has else None,
            std=math.sqrt(max(self.m2 / self.n, 0.0)) if has else None,
            absmax=self.absmax,
            nan=self.nan,
            inf=self.inf,
            numel=self.n,
            records=self.records,
        )


class _Span:
    """Counts and moments of the records of one key over one span of steps."""

    __slots__ = ("records", "replay", "capture", "rows", "out", "inp")

    def __init__(self) -> None:
        self.records = 0
        self.replay = 0
        self.capture = 0
        self.rows: int | None = None
        self.out: _Moments | None = None
        self.inp: _Moments | None = None

    def add(self, c: Call, outs: Sequence[TensorMeta], inp: TensorMeta | None) -> None:
        self.records += 1
        if c.graph_replay:
            self.replay += 1
        elif c.graph_capture:
            self.capture += 1
        if c.tokens is not None:
            self.rows = (self.rows or 0) + c.tokens
        first = True
        for m in outs:
            if m.stats is not None:
                if self.out is None:
                    self.out = _Moments()
                self.out.add(m.stats, m.shape, first)
                first = False
        if inp is not None and inp.stats is not None:
            if self.inp is None:
                self.inp = _Moments()
            self.inp.add(inp.stats, inp.shape)

    def merge(self, o: _Span) -> None:
        self.records += o.records
        self.replay += o.replay
        self.capture += o.capture
        if o.rows is not None:
            self.rows = (self.rows or 0) + o.rows
        for name in ("out", "inp"):
            theirs = getattr(o, name)
            if theirs is not None:
                mine = getattr(self, name)
                if mine is None:
                    mine = _Moments()
                    setattr(self, name, mine)
                mine.merge(theirs)

    def view(self) -> SpanStats:
        return SpanStats(
            records=self.records,
            graph_replay=self.replay,
            graph_capture=self.capture,
            eager=self.records - self.replay - self.capture,
            rows=self.rows,
            output=self.out.view() if self.out is not None else None,
            input=self.inp.view() if self.inp is not None else None,
        )


class _RoleInfo:
    """What a role's records look like, whatever their mode: modules, shapes, dtypes, last stats."""

    __slots__ = ("calls", "modules", "in_shapes", "out_shapes", "dtypes", "last", "chunk_widths")

    def __init__(self) -> None:
        self.calls = 0
        self.modules: dict[str, None] = {}
        self.in_shapes: dict[tuple[int, ...], None] = {}
        self.out_shapes: dict[tuple[int, ...], None] = {}
        self.dtypes: dict[str, None] = {}
        self.last: TensorStats | None = None
        self.chunk_widths: dict[int, int] = {}

    def merge(self, o: _RoleInfo) -> None:
        self.calls += o.calls
        for name in ("modules", "in_shapes", "out_shapes", "dtypes"):
            getattr(self, name).update(getattr(o, name))
        self.last = o.last or self.last
        self.chunk_widths.update(o.chunk_widths)


def _split_outputs(outputs: list[TensorMeta]) -> tuple[list[TensorMeta], list[tuple[int, TensorMeta]]]:
    """The tensor a stage's output statistics describe, and its chunks (aux concat).

    A residual stream wins over the layer's raw output; with chunks only, the chunks
    together are the output (their moments combine exactly into the whole tensor's).
    """
    if len(outputs) == 1 and not outputs[0].arg.startswith(CHUNK_PREFIX):
        return outputs, []
    full: TensorMeta | None = None
    resid: TensorMeta | None = None
    chunks: list[tuple[int, TensorMeta]] = []
    for m in outputs:
        if m.arg.startswith(CHUNK_PREFIX):
            try:
                chunks.append((int(m.arg[len(CHUNK_PREFIX) :].split("]", 1)[0]), m))
            except ValueError:
                continue
        elif m.arg == RESIDUAL_ARG:
            resid = m
        elif full is None:
            full = m
    chunks.sort(key=lambda im: im[0])
    primary = resid or full
    if primary is not None:
        return [primary], chunks
    return [m for _i, m in chunks], chunks


HIDDEN_ARG = "hidden_states"


def stage_input(c: Call, role: str, outs: Sequence[TensorMeta]) -> TensorMeta | None:
    """The input a stage's line shows: a decoder layer's hidden states, else the first input.

    A decoder layer's first argument is often not its hidden states (SGLang's EAGLE-3 layer
    takes ``positions, embeds, hidden_states``; HF's takes ``hidden_states`` first). The
    argument named ``hidden_states`` wins; else the last argument as wide as the layer's
    output (the hidden width), so positions and position embeddings never stand in for it.
    """
    if not c.inputs:
        return None
    if not (role.endswith(".layer") or ".layer[" in role):
        return c.inputs[0]
    for m in c.inputs:
        if m.arg.rsplit(".", 1)[-1] == HIDDEN_ARG:
            return m
    width = outs[0].shape[-1] if outs and outs[0].shape else None
    wide = [m for m in c.inputs if len(m.shape) >= 2 and m.shape[-1] == width]
    return wide[-1] if wide else c.inputs[0]


class _PathAcc:
    """The data path's aggregates over the calls fed so far: per (role, forward mode, draft
    step, chunk) a span over the whole run and one per step of the window's steps."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.info: dict[str, _RoleInfo] = {}
        self.run: dict[_Key, _Span] = {}
        self.by_step: dict[int, dict[_Key, _Span]] = {}
        self.top: list[int] = []  # the largest `window` distinct steps fed, ascending
        self.draft: list[Call] = []  # the draft's calls, for check_fc_called

    def _window_bucket(self, step: int) -> dict[_Key, _Span] | None:
        top = self.top
        if top and step == top[-1]:
            return self.by_step[step]
        i = bisect.bisect_left(top, step)
        if i < len(top) and top[i] == step:
            return self.by_step[step]
        if len(top) >= self.window:
            if i == 0:
                return None  # older than the window
            top.insert(i, step)
            self.by_step.pop(top.pop(0), None)
        else:
            top.insert(i, step)
        bucket: dict[_Key, _Span] = {}
        self.by_step[step] = bucket
        return bucket

    def feed(self, c: Call, role: str) -> None:
        if role.startswith("draft."):
            self.draft.append(c)
        info = self.info.get(role)
        if info is None:
            info = self.info[role] = _RoleInfo()
        info.calls += 1
        info.modules[c.module] = None
        outs, chunks = _split_outputs(c.outputs)
        if outs:
            first = outs[0]
            if len(outs) == 1:
                info.out_shapes[tuple(first.shape)] = None
                if first.stats is not None:
                    info.last = first.stats
            elif first.shape:  # the chunks stand for the whole output
                info.out_shapes[(*first.shape[:-1], sum(m.shape[-1] if m.shape else 0 for m in outs))] = None
            info.dtypes[first.dtype] = None
        inp = stage_input(c, role, outs)
        if inp is not None:
            info.in_shapes[tuple(inp.shape)] = None
        key: _Key = (role, c.forward_mode, c.draft_step, None)
        bucket = self._window_bucket(c.step)
        spans = [self.run, bucket] if bucket is not None else [self.run]
        for table in spans:
            span = table.get(key)
            if span is None:
                span = table[key] = _Span()
            span.add(c, outs, inp)
        for i, m in chunks:
            if m.shape:
                info.chunk_widths[i] = m.shape[-1]
            ckey: _Key = (role, c.forward_mode, c.draft_step, i)
            for table in spans:
                span = table.get(ckey)
                if span is None:
                    span = table[ckey] = _Span()
                span.add(c, (m,), None)


class _FileState:
    """What :class:`ViewBuilder` keeps of one file between builds."""

    def __init__(self, f: TraceFile, window: int) -> None:
        self.file = f
        self.done = 0  # calls of f folded in
        self.roled = False  # a call of this file carried a role
        self.eagle3 = False  # a call's role belongs to an EAGLE-3 pair (see DataPath.eagle3)
        self.steps: set[int] = set()
        self.top: list[int] = []  # the largest `window` distinct call steps, ascending
        self.window = window
        self.stamp: float | None = None  # the newest call time stamp
        self.modules = _ModuleAcc()
        self.path = _PathAcc(window)

    def note_step(self, c: Call) -> None:
        step = c.step
        if step not in self.steps:
            self.steps.add(step)
            top = self.top
            if len(top) < self.window:
                bisect.insort(top, step)
            elif step > top[0]:
                bisect.insort(top, step)
                top.pop(0)
        t = c.t_unix
        if t and time_ok(t) and (self.stamp is None or t > self.stamp):
            self.stamp = t


def _merge_paths(accs: list[_PathAcc], floor: int | None) -> tuple[dict[str, _RoleInfo], dict[_Key, _Span], dict[_Key, _Span]]:
    """Role infos, whole-run spans and window spans (steps >= floor) of every accumulator."""
    info: dict[str, _RoleInfo] = {}
    run: dict[_Key, _Span] = {}
    win: dict[_Key, _Span] = {}

    def into(table: dict[_Key, _Span], key: _Key, span: _Span) -> None:
        mine = table.get(key)
        if mine is None:
            mine = table[key] = _Span()
        mine.merge(span)

    for acc in accs:
        for role, ri in acc.info.items():
            info.setdefault(role, _RoleInfo()).merge(ri)
        for key, span in acc.run.items():
            into(run, key, span)
        if floor is None:
            continue
        for step, bucket in acc.by_step.items():
            if step >= floor:
                for key, span in bucket.items():
                    into(win, key, span)
    return info, run, win


def _mode_rank(mode: str | None) -> tuple[int, str]:
    if mode is None:
        return (len(MODE_ORDER) + 1, "")
    return (MODE_ORDER.index(mode), mode) if mode in MODE_ORDER else (len(MODE_ORDER), mode)


class _Slicer:
    """Slices of the merged spans: by role(s), grouped by forward mode or draft step."""

    def __init__(self, run: dict[_Key, _Span], win: dict[_Key, _Span]) -> None:
        self.run = run
        self.win = win
        self._by_role: dict[str, list[_Key]] = defaultdict(list)
        for key in run:
            self._by_role[key[0]].append(key)

    def _keys(self, roles: Iterable[str], chunk: int | None) -> list[_Key]:
        return [k for r in roles for k in self._by_role.get(r, ()) if k[3] == chunk]

    def _slice(self, keys: list[_Key], label: str, mode: str | None = None, step: int | None = None) -> SliceView:
        run, win = _Span(), _Span()
        for k in keys:
            run.merge(self.run[k])
            w = self.win.get(k)
            if w is not None:
                win.merge(w)
        return SliceView(label=label, forward_mode=mode, draft_step=step, run=run.view(), window=win.view())

    def total(self, roles: Iterable[str], chunk: int | None = None) -> SliceView | None:
        keys = self._keys(roles, chunk)
        return self._slice(keys, "all") if keys else None

    def modes(self, roles: Iterable[str], chunk: int | None = None) -> list[SliceView]:
        groups: dict[str | None, list[_Key]] = defaultdict(list)
        for k in self._keys(roles, chunk):
            groups[k[1]].append(k)
        only_none = list(groups) == [None]
        return [
            self._slice(groups[m], m if m is not None else ("all" if only_none else "no mode"), mode=m)
            for m in sorted(groups, key=_mode_rank)
        ]

    def draft_steps(self, roles: Iterable[str]) -> list[SliceView]:
        groups: dict[int, list[_Key]] = defaultdict(list)
        for k in self._keys(roles, None):
            if k[2] is not None:
                groups[k[2]].append(k)
        return [self._slice(groups[d], f"draft step {d}", step=d) for d in sorted(groups)]


def _stage(stage: str, roles: tuple[str, ...], info: dict[str, _RoleInfo], sl: _Slicer, window: int) -> StageView:
    view = StageView(role=stage)
    mine = [info[r] for r in roles if r in info]
    if not mine:
        return view
    ri = _RoleInfo()
    for part in mine:
        ri.merge(part)
    view.status = "called"
    view.calls = ri.calls
    view.modules = list(ri.modules)
    view.in_shapes = [list(s) for s in ri.in_shapes]
    view.out_shapes = [list(s) for s in ri.out_shapes]
    view.dtypes = list(ri.dtypes)
    view.last = ri.last
    view.total = sl.total(roles)
    view.modes = sl.modes(roles)
    view.draft_steps = sl.draft_steps(roles)
    out = view.total.run.output if view.total else None
    if out is not None:
        view.agg = StatsSummary(mean=out.mean, std=out.std, absmax=out.absmax, nan=out.nan, inf=out.inf, samples=out.records)
        view.anomalies = anomalies(view.agg)
        recent = view.total.window.output if view.total else None
        if recent is not None and (recent.nan or recent.inf):
            bad = ", ".join(f"{n} x{v}" for n, v in (("nan", recent.nan), ("inf", recent.inf)) if v)
            view.anomalies.append(f"{bad} in the last {window} steps")
    return view


def _live_chunks(aux: StageView, ri: _RoleInfo | None, sl: _Slicer, captures: list[CaptureView]) -> list[LiveChunkView]:
    if ri is None or not ri.chunk_widths:
        return []
    bounds = next((c.boundaries for c in captures if c.boundaries), None)
    out = []
    for i in sorted(ri.chunk_widths):
        total = sl.total(STAGE_ROLES["aux"], chunk=i)
        if total is None:
            continue
        out.append(
            LiveChunkView(
                index=i,
                boundary=bounds[i] if bounds and i < len(bounds) else None,
                width=ri.chunk_widths[i],
                total=total,
                modes=sl.modes(STAGE_ROLES["aux"], chunk=i),
            )
        )
    stds = [c.total.run.output.std if c.total.run.output else None for c in out]
    for i, why in chunk_scale_outliers(stds).items():
        out[i].flags.append(why)
    return out


def _boundary_layers(capture: CaptureView, info: dict[str, _RoleInfo], sl: _Slicer) -> list[BoundaryView]:
    out = []
    for b in capture.boundaries:
        role = "target.embed" if b == 0 else f"target.layer[{b - 1}]"
        ri = info.get(role)
        out.append(
            BoundaryView(
                boundary=b,
                role=role,
                module=next(iter(ri.modules), None) if ri else None,
                total=sl.total((role,)),
                modes=sl.modes((role,)),
            )
        )
    return out


def _embed_from_chunks(captures: list[CaptureView], chunks: list[LiveChunkView]) -> None:
    """Give the b0 row the statistics of the aux chunk it becomes, where its own are withheld."""
    chunk = next((c for c in chunks if c.boundary == 0 and c.total.run.output is not None), None)
    if chunk is None:
        return
    for cap in captures:
        for b in cap.layers:
            if b.boundary == 0 and (b.total is None or b.total.run.output is None):
                b.total, b.modes = chunk.total, chunk.modes
                b.stats_from = f"aux concat chunk {chunk.index}"


def _last_dims(shapes: list[list[int]]) -> list[int]:
    return list(dict.fromkeys(s[-1] for s in shapes if s))


def _fc_widths(dp: DataPath, findings: list[Any]) -> FcWidths:
    """fc's input width against its in_features and the hidden size, from what was seen."""
    w = FcWidths()
    bypass = next((fd for fd in findings if fd.code == "fc_bypass"), None)
    ev = bypass.evidence if bypass is not None else {}
    cap = next((c for c in dp.captures if c.hidden_size), None)
    fc_out = _last_dims(dp.fc.out_shapes)
    if cap is not None:
        w.hidden, w.hidden_from = cap.hidden_size, "capture"
    elif fc_out:
        w.hidden, w.hidden_from = fc_out[-1], "fc output"
    elif _last_dims(dp.layer.out_shapes):
        w.hidden, w.hidden_from = _last_dims(dp.layer.out_shapes)[-1], "decoder layer output"
    elif isinstance(ev.get("embed_width"), int):
        w.hidden, w.hidden_from = ev["embed_width"], "fc_bypass finding"
    fc_in = _last_dims(dp.fc.in_shapes)
    if fc_in:
        w.in_widths, w.in_from = fc_in, "fc input"
    elif isinstance(ev.get("seen_width"), int):
        w.in_widths, w.in_from = [ev["seen_width"]], "fc_bypass finding"
    elif _last_dims(dp.aux.out_shapes):
        w.in_widths, w.in_from = _last_dims(dp.aux.out_shapes), "aux concat output"
    ran = [x for x in fc_in if x != w.hidden]  # an fc that ran on these: its in_features
    if isinstance(ev.get("fc_in_features"), int):
        w.in_features, w.in_features_from = ev["fc_in_features"], "fc_bypass finding"
    elif ran:
        w.in_features, w.in_features_from = max(ran), "fc input"
    elif cap is not None and cap.boundaries:
        w.in_features, w.in_features_from = cap.hidden_size * len(cap.boundaries), "capture (expected)"
    if w.hidden and w.hidden in w.in_widths:
        w.verdict = "bypass"
        w.note = f"fc input width {w.hidden} equals hidden {w.hidden}: the draft got unfused hidden states"
        if w.in_features:
            w.note += f", fc expects {w.in_features}"
    elif w.in_widths and w.in_features:
        w.verdict = "ok" if all(x == w.in_features for x in w.in_widths) else "mismatch"
        if w.verdict == "mismatch":
            w.note = f"fc input width {'/'.join(map(str, w.in_widths))} is not fc in_features {w.in_features}"
    return w


def _datapath(files: list[TraceFile], states: list[_FileState], flt: ViewFilter) -> DataPath:
    window = max(1, flt.window_steps)
    accs = [s.path for s in states if s.roled]
    legacy_files = [s.file for s in states if not s.roled]
    eagle3 = any(s.eagle3 for s in states) or any(f.captures for f in files)
    if not eagle3 and legacy_files:
        eagle3 = _legacy_eagle3(c for f in legacy_files for c in f.calls)
    if legacy_files:
        # No roles: the draft is told by names across the whole run, so fold it again.
        legacy = [c for f in legacy_files for c in f.calls if flt.step_ok(c.step)]
        draft = {id(c) for c in _draft_calls(legacy)} if legacy else set()
        acc = _PathAcc(window)
        for c in legacy:
            role = _legacy_role(c, draft) if flt.module_ok(c.module) else None
            if role is not None:
                acc.feed(c, role)
        acc.draft = [c for c in legacy if id(c) in draft and flt.module_ok(c.module)]
        accs.append(acc)
    top = sorted(set().union(*(s.top for s in states)))[-window:] if states else []
    floor = top[0] if top else None
    info, run, win = _merge_paths(accs, floor)
    if not eagle3:
        info = {}  # a plain model's layers make no stage (the module table shows them)
    sl = _Slicer(run, win)
    draft_list = [c for acc in accs for c in acc.draft]

    # What --step and --module let through: the data path states no finding the list hides.
    findings = [fd for f in files for fd in f.findings if flt.finding_ok(fd)]
    captures = [CaptureView(**c.model_dump(include=set(CaptureView.model_fields) - {"layers"})) for f in files for c in f.captures]
    captures = _unique_models(captures)
    roled = any(s.roled for s in states)
    for cap in captures:
        # Only a trace with roles can name the target's layers; an older one says nothing.
        cap.layers = _boundary_layers(cap, info, sl) if roled else []
    if flt.module:
        captures = _captures_matching(captures, flt)

    def stage(name: str) -> StageView:
        return _stage(name, STAGE_ROLES[name], info, sl, window)

    fc = stage("fc")
    aux = stage("aux")
    aux.chunks = _live_chunks(aux, info.get(STAGE_ROLES["aux"][0]), sl, captures)
    _embed_from_chunks(captures, aux.chunks)
    if aux.calls == 0 and any(not c.enabled for c in captures):
        aux.status = "disabled"
    elif aux.calls == 0 and any(fd.code in ("aux_capture_disabled", "logits_fallback") for fd in findings):
        aux.status = "disabled"
    dp = DataPath(
        captures=captures,
        aux=aux,
        fingerprints=_fingerprints(files),
        fc=fc,
        layer=stage("layer"),
        norm=stage("norm"),
        lm_head=stage("lm_head"),
        d2t=_d2t(files, findings),
        target_lm_head=_stage("target_lm_head", ("target.lm_head",), info, sl, window),
        window_steps=window,
        window_first_step=floor,
        window_last_step=top[-1] if top else None,
        steps_seen=len(set().union(*(s.steps for s in states))) if len(states) > 1 else len(states[0].steps) if states else 0,
        roles=roled,
        eagle3=eagle3,
    )
    if not eagle3:
        # A plain model: its layers are no draft's, and an fc it never had was not bypassed.
        return dp
    dp.fc.widths = _fc_widths(dp, findings)
    bypass = [fd for fd in findings if fd.code == "fc_bypass"]
    if bypass:
        fc.status = "bypassed"
        fc.note = bypass[0].message
    elif fc.calls == 0 and draft_list and not flt.module:
        # No fc_bypass finding passed --step (made from the whole run, it may sit outside
        # the steps shown): the same check over the steps shown decides. Not under
        # --module: the calls it would see are only those the filter kept.
        for found in check_fc_called(draft_list):
            fc.status, fc.note = "bypassed", found.message
    elif fc.calls and dp.fc.widths.verdict == "bypass":
        fc.status, fc.note = "bypassed", dp.fc.widths.note + "; fc was skipped"
    dp.draft_vocab = (_last_dims(dp.lm_head.out_shapes) or [None])[-1]
    dp.target_vocab = (_last_dims(dp.target_lm_head.out_shapes) or [None])[-1]
    if flt.module:
        dp.module_filter = flt.module
        _narrow_datapath(dp, flt)
    return dp


NOT_IN_FILTER = "not in --module"


def _captures_matching(captures: list[CaptureView], flt: ViewFilter) -> list[CaptureView]:
    """The captures ``--module`` names: by the capturing model, or by a captured layer."""
    out = []
    for cap in captures:
        if flt.module_ok(cap.module):
            out.append(cap)
            continue
        layers = [b for b in cap.layers if flt.module_ok(b.module)]
        if layers:
            out.append(cap.model_copy(update={"layers": layers}))
    return out


def _narrow_datapath(dp: DataPath, flt: ViewFilter) -> None:
    """Under ``--module``: a stage none of whose calls (or findings) matched says so, rather
    than "not seen", which would read as a stage the run never reached."""
    for name in ("aux", "fc", "layer", "norm", "lm_head", "target_lm_head"):
        stage: StageView = getattr(dp, name)
        if stage.calls == 0 and stage.status == "not seen":
            stage.status = NOT_IN_FILTER
    d2t = dp.d2t
    if d2t.status != "not seen" and not any(flt.module_ok(m) or flt.module_ok(f"{m}.d2t") for m in d2t.modules):
        dp.d2t = StageView(role="d2t", status=NOT_IN_FILTER)
    elif d2t.status == "not seen":
        d2t.status = NOT_IN_FILTER
    if dp.lm_head.status == NOT_IN_FILTER:
        dp.draft_vocab = None
    if dp.target_lm_head.status == NOT_IN_FILTER:
        dp.target_vocab = None
    dp.fingerprints = [fp for fp in dp.fingerprints if flt.module_ok(fp.module)]


# ------------------------------------------------------------------------ empty filters
MAX_NAMES_LISTED = 6


def _listed(names: Iterable[str]) -> str:
    names = list(names)
    more = f", … ({len(names)} in all)" if len(names) > MAX_NAMES_LISTED else ""
    return ", ".join(names[:MAX_NAMES_LISTED]) + more


def _filter_problem(ts: TraceSet, files: list[TraceFile], view: TraceView, flt: ViewFilter, module_ok: dict[str, bool]) -> str | None:
    """One line for the first filter that matched nothing (rank, step, module, finding), naming
    what the trace holds; None when each filter given kept something."""
    if flt.rank is not None and not files:
        ranks = sorted({f.rank for f in ts.files if f.rank is not None})
        held = f"ranks present: {', '.join(map(str, ranks))}" if ranks else "no process of these traces records a rank"
        return f"--rank {flt.rank} matches no process ({held})"
    stepped = flt.step_min is not None or flt.step_max is not None
    if (
        stepped
        and view.header.steps_traced == 0
        and not any(fd.step is not None and flt.step_ok(fd.step) for f in files for fd in f.findings)
    ):
        steps = {c.step for f in files for c in f.calls} | {s for f in files for s in f.acceptance.steps()}
        held = f"steps {min(steps)}..{max(steps)} traced" if steps else "no step traced"
        empty = (
            " is an empty range"
            if flt.step_min is not None and flt.step_max is not None and flt.step_min > flt.step_max
            else " matches no step"
        )
        return f"--step {flt.steps_text}{empty} ({held})"
    if flt.module:
        named = (
            any(module_ok.values())
            or any(flt.module_ok(fd.module) for f in files for fd in f.findings)
            or any(flt.module_ok(c.module) for f in files for c in f.captures)
        )
        if not named:
            names = sorted(module_ok) or sorted({fd.module for f in files for fd in f.findings if fd.module})
            held = f"modules: {_listed(names)}" if names else "no module recorded"
            return f"--module {flt.module!r} matches no module ({held})"
    if flt.finding and not view.findings:
        codes = dict.fromkeys(fd.code for f in files for fd in f.findings if flt.finding_ok(fd))
        if not (flt.module or stepped):
            codes.update(dict.fromkeys(code for f in files for code, _ in f.findings_folded))
        unknown = "" if flt.finding in CATALOGUE else "not a finding code; "
        held = f"codes shown without it: {_listed(codes)}" if codes else "no finding shown without it"
        return f"--finding {flt.finding} matches no finding ({unknown}{held})"
    return None


def _fingerprints(files: list[TraceFile]) -> list[FingerprintView]:
    """Per-chunk statistics averaged over samples, per module (bug 3 shows here)."""
    by_module: dict[str, list[Any]] = defaultdict(list)
    for f in files:
        for fp in f.fingerprints:
            by_module[fp.module].append(fp)
    out = []
    for module, fps in by_module.items():
        width = fps[-1].chunk_width
        n = max(len(fp.chunks) for fp in fps)
        bounds = next((fp.boundaries for fp in reversed(fps) if fp.boundaries), None)
        chunks = []
        for i in range(n):
            stats = [fp.chunks[i] for fp in fps if i < len(fp.chunks)]
            agg = summarize(stats)
            chunks.append(
                ChunkView(
                    index=i,
                    boundary=bounds[i] if bounds and i < len(bounds) else None,
                    stats=TensorStats(mean=agg.mean, std=agg.std, absmax=agg.absmax, nan=agg.nan, inf=agg.inf),
                )
            )
        _flag_scale_outliers(chunks)
        out.append(FingerprintView(module=module, chunk_width=width, chunks=chunks, samples=len(fps)))
    return out


def _flag_scale_outliers(chunks: list[ChunkView]) -> None:
    """Mark the chunks the check flags (checks/calls.py decides; the viewer only shows)."""
    for i, why in chunk_scale_outliers([c.stats.std for c in chunks]).items():
        chunks[i].flags.append(why)


def _d2t(files: list[TraceFile], findings: list[Any]) -> StageView:
    view = StageView(role="d2t")
    for f in files:
        for w in f.weights:
            if _names_d2t(w.written):
                view.status, view.modules = "loaded", [w.module]
            elif _names_d2t(w.missing):
                view.status, view.modules = "missing", [w.module]
            elif _names_d2t(w.ignored):
                view.status, view.modules = "ignored", [w.module]
            elif view.status == "not seen" and w.offered:
                view.status, view.modules = "absent from checkpoint", [w.module]
    for fd in findings:
        if fd.code == "weights_missing" and "d2t" in (fd.message + str(fd.evidence)):
            view.status, view.note = "missing", fd.message
    return view


def _names_d2t(names: list[str]) -> bool:
    # SGLang renames d2t to hot_token_id at load; either name means the mapping.
    return any(n.split(".")[-1] in ("d2t", "hot_token_id") for n in names)


# -------------------------------------------------------------------------- acceptance
def acceptance_files(files: list[TraceFile]) -> list[TraceFile]:
    """The files whose acceptance records count: under tensor parallelism every rank of a
    server records the same verify steps, so of the ranks of one host only the lowest one's
    count (a verify step is one step, not one per rank)."""
    lowest: dict[str, int] = {}
    for f in files:
        host = f.header.host if f.header else ""
        if f.rank is not None and f.acceptance:
            lowest[host] = min(lowest.get(host, f.rank), f.rank)
    return [f for f in files if f.rank is None or lowest.get(f.header.host if f.header else "") in (None, f.rank)]


def _acceptance(files: list[TraceFile], flt: ViewFilter) -> AcceptanceView:
    """The acceptance panel from the per-step rows the loader folded (see AcceptanceLog)."""
    files = acceptance_files(files)
    per_step: dict[int, list[int]] = {}
    total = [0, 0, 0, 0, 0]
    for f in files:
        log = f.acceptance
        for step, row in log.by_step.items():
            if flt.step_ok(step):
                merge_rows(per_step.setdefault(step, [0, 0, 0, 0, 0]), row)
                merge_rows(total, row)
        # Steps past the per-step cap are in the whole run's totals; a step filter cannot see them.
        if log.beyond is not None and flt.step_min is None and flt.step_max is None:
            merge_rows(total, log.beyond)
    view = AcceptanceView()
    if not total[0]:
        return view
    # A step whose records name no request (accept_lengths: []) has no accept length to show.
    view.steps = sorted(s for s, row in per_step.items() if row[2])
    view.mean_accept = [round(per_step[s][1] / per_step[s][2], 4) for s in view.steps]
    view.requests = total[2]
    view.overall_mean = round(total[1] / total[2], 4) if total[2] else None
    view.draft_tokens = total[3]
    if total[4]:  # some record said how many accepted each position
        shown = min(total[3], MAX_POSITIONS)
        positions = (total[5 : 5 + shown] + [0] * shown)[:shown]
        view.position_rate = [round(n / total[2], 4) if total[2] else 0.0 for n in positions]
    return view


# ------------------------------------------------------------------------- module table
def module_table(calls: list[Call]) -> list[ModuleRow]:
    """One row per module in first-call order: calls, output shapes, dtypes, aggregated stats."""
    acc = _ModuleAcc()
    for c in calls:
        acc.feed(c)
    return _ModuleAcc.merged([acc])


class _ModRow:
    """Running sums of one module's row: what :func:`summarize` would give over its calls."""

    __slots__ = (
        "module_type",
        "role",
        "calls",
        "out_shapes",
        "dtypes",
        "sum_mean",
        "n_mean",
        "sum_std",
        "n_std",
        "absmax",
        "nan",
        "inf",
        "samples",
    )

    def __init__(self, module_type: str) -> None:
        self.module_type = module_type
        self.role: str | None = None
        self.calls = 0
        self.out_shapes: dict[tuple[int, ...], None] = {}
        self.dtypes: dict[str, None] = {}
        self.sum_mean = self.sum_std = 0.0
        self.n_mean = self.n_std = self.nan = self.inf = self.samples = 0
        self.absmax: float | None = None

    def merge(self, o: _ModRow) -> None:
        self.role = self.role or o.role
        self.calls += o.calls
        self.out_shapes.update(o.out_shapes)
        self.dtypes.update(o.dtypes)
        self.sum_mean += o.sum_mean
        self.n_mean += o.n_mean
        self.sum_std += o.sum_std
        self.n_std += o.n_std
        self.nan += o.nan
        self.inf += o.inf
        self.samples += o.samples
        if o.absmax is not None and (self.absmax is None or o.absmax > self.absmax):
            self.absmax = o.absmax


class _ModuleAcc:
    """The module table, folded call by call (see :class:`ViewBuilder`)."""

    def __init__(self) -> None:
        self.rows: dict[str, _ModRow] = {}

    def feed(self, c: Call) -> None:
        row = self.rows.get(c.module)
        if row is None:
            row = self.rows[c.module] = _ModRow(c.module_type)
        row.calls += 1
        if row.role is None and c.role:
            row.role = c.role
        if not c.outputs:
            return
        m = c.outputs[0]
        row.out_shapes[tuple(m.shape)] = None
        row.dtypes[m.dtype] = None
        st = m.stats
        if st is None:
            return
        row.samples += 1
        if st.mean is not None and math.isfinite(st.mean):
            row.sum_mean += st.mean
            row.n_mean += 1
        if st.std is not None and math.isfinite(st.std):
            row.sum_std += st.std
            row.n_std += 1
        if st.absmax is not None and (row.absmax is None or st.absmax > row.absmax):
            row.absmax = st.absmax
        row.nan += st.nan or 0
        row.inf += st.inf or 0

    @staticmethod
    def merged(accs: list[_ModuleAcc]) -> list[ModuleRow]:
        rows: dict[str, _ModRow] = {}
        for acc in accs:
            for name, row in acc.rows.items():
                mine = rows.get(name)
                if mine is None:
                    rows[name] = mine = _ModRow(row.module_type)
                mine.merge(row)
        out = []
        for name, r in rows.items():
            agg = StatsSummary(
                mean=r.sum_mean / r.n_mean if r.n_mean else None,
                std=r.sum_std / r.n_std if r.n_std else None,
                absmax=r.absmax,
                nan=r.nan,
                inf=r.inf,
                samples=r.samples,
            )
            out.append(
                ModuleRow(
                    module=name,
                    module_type=r.module_type,
                    role=r.role,
                    calls=r.calls,
                    out_shapes=[list(s) for s in r.out_shapes],
                    dtypes=list(r.dtypes),
                    agg=agg,
                    anomalies=anomalies(agg),
                )
            )
        return out


def summarize(stats: Iterable[TensorStats]) -> StatsSummary:
    """Mean of means and stds, max of absmax, sums of nan/inf (None-safe)."""
    means, stds, maxes = [], [], []
    nan = inf = n = 0
    for s in stats:
        n += 1
        if s.mean is not None and math.isfinite(s.mean):
            means.append(s.mean)
        if s.std is not None and math.isfinite(s.std):
            stds.append(s.std)
        if s.absmax is not None:
            maxes.append(s.absmax)
        nan += s.nan or 0
        inf += s.inf or 0
    return StatsSummary(
        mean=sum(means) / len(means) if means else None,
        std=sum(stds) / len(stds) if stds else None,
        absmax=max(maxes) if maxes else None,
        nan=nan,
        inf=inf,
        samples=n,
    )


def anomalies(s: StatsSummary) -> list[str]:
    """Words for what is wrong with a tensor's statistics: nan, inf, huge, constant."""
    out = []
    if s.nan:
        out.append(f"nan x{s.nan}")
    if s.inf:
        out.append(f"inf x{s.inf}")
    if s.absmax is not None and (not math.isfinite(s.absmax) or s.absmax > HUGE_ABSMAX):
        out.append("huge")
    if s.std is not None and s.std == 0 and s.samples:
        out.append("constant")
    return out


def _flag_nonfinite_modules(view: TraceView) -> None:
    """Mark the rows a ``nonfinite`` finding names (checks/ made it; the table shows it)
    where the row's own statistics do not already say nan or inf."""
    named = {m for fg in view.findings if fg.code == "nonfinite" for m in fg.modules}
    for row in view.modules:
        if row.module in named and not (row.agg.nan or row.agg.inf):
            row.anomalies.insert(0, "non-finite")


def _unique_models(xs: list[CaptureView]) -> list[CaptureView]:
    seen: dict[str, CaptureView] = {}
    for x in xs:
        seen.setdefault(x.model_dump_json(), x)
    return list(seen.values())

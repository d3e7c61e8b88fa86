"""The view model: what the terminal shows, derived from a :class:`TraceSet`, no rendering.

Every part is a pydantic model (:mod:`.parts`) so ``spectrace view --json`` is
``model_dump_json()`` and tests can assert on data, not on pixels.

    >>> view = build_view(load_traces("traces/"))
    >>> view.datapath.fc.status
    'bypassed'

This module drives the builders, one job each: the header (:mod:`.header`), the findings
grouped by root cause (:mod:`.grouping`), the data path (:mod:`.datapath`, from the
aggregates of :mod:`.accumulate` and the stages of :mod:`.stages`), the acceptance panel
(:mod:`.acceptance`) and the module table (:mod:`.module_table`).

The data path is aggregated, never listed: per stage and forward mode, the records, how
many came from CUDA-graph replays, the real token rows, and the statistics of all its
tensors combined as one (mean weighted by numel, pooled std), over the whole run and over
the last ``window_steps`` traced steps. :class:`ViewBuilder` folds only the calls appended
since its last build, so ``spectrace view --follow`` stays cheap on a long live trace.
"""

from __future__ import annotations

from collections.abc import Iterable

from spectrace.rules.catalogue import CATALOGUE
from spectrace.rules.globs import closest, closest_names, did_you_mean

from .acceptance import build_acceptance
from .accumulate import FileState, stage_input
from .datapath import NOT_IN_FILTER, build_datapath
from .grouping import group_findings
from .header import closure_state, header_summary, not_closed_line
from .module_table import ModuleAcc, anomalies, flag_nonfinite_modules, module_table, summarize
from .parts import (
    DEFAULT_WINDOW,
    AcceptanceView,
    BoundaryView,
    CaptureView,
    ChunkView,
    DataPath,
    FcWidths,
    FindingGroup,
    FingerprintView,
    HeaderSummary,
    LiveChunkView,
    ModuleRow,
    MomentStats,
    ProcessInfo,
    SliceView,
    SpanStats,
    StageView,
    StatsSummary,
    TraceView,
    ViewFilter,
    name_matches,
)
from .stages import ROLE_PATTERNS, STAGE_ROLES, is_eagle3_role
from .traceset import TraceFile, TraceSet


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
        self._files: dict[str, FileState] = {}
        self._module_ok: dict[str, bool] = {}

    def build(self, ts: TraceSet) -> TraceView:
        flt = self.flt
        files = [f for f in ts.files if flt.rank is None or f.rank == flt.rank]
        states = [self._update(f) for f in files]
        view = TraceView(
            header=header_summary(ts, files, states, flt),
            findings=group_findings(files, flt),
            datapath=build_datapath(files, states, flt),
            acceptance=build_acceptance(files, flt),
            modules=ModuleAcc.merged([s.modules for s in states]),
        )
        flag_nonfinite_modules(view)
        view.filter_problem = _filter_problem(ts, files, view, flt, self._module_ok)
        return view

    def _update(self, f: TraceFile) -> FileState:
        state = self._files.get(f.path)
        if state is None or state.file is not f or state.done > len(f.calls):
            state = self._files[f.path] = FileState(f, max(1, self.flt.window_steps))
        calls = f.calls
        if state.done == len(calls):
            return state
        flt, module_ok = self.flt, self._module_ok
        for c in calls[state.done :] if state.done else calls:
            if not state.eagle3 and c.role and is_eagle3_role(c.role):
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
            hint = did_you_mean(closest_names(flt.module, names))
            return f"--module {flt.module!r} matches no module{'; ' + hint if hint else ''} ({held})"
    if flt.finding and not view.findings:
        codes = dict.fromkeys(fd.code for f in files for fd in f.findings if flt.finding_ok(fd))
        if not (flt.module or stepped):
            codes.update(dict.fromkeys(code for f in files for code, _ in f.findings_folded))
        unknown = "" if flt.finding in CATALOGUE else "not a finding code; "
        near = "" if flt.finding in CATALOGUE else did_you_mean(closest(flt.finding, list(CATALOGUE), n=2))
        held = f"codes shown without it: {_listed(codes)}" if codes else "no finding shown without it"
        return f"--finding {flt.finding} matches no finding{'; ' + near if near else ''} ({unknown}{held})"
    return None


# The names the tests reach through this module (a monkeypatched class, the ordering alone).

__all__ = [
    "DEFAULT_WINDOW",
    "NOT_IN_FILTER",
    "ROLE_PATTERNS",
    "STAGE_ROLES",
    "AcceptanceView",
    "BoundaryView",
    "CaptureView",
    "ChunkView",
    "DataPath",
    "FcWidths",
    "FindingGroup",
    "FingerprintView",
    "HeaderSummary",
    "LiveChunkView",
    "ModuleRow",
    "MomentStats",
    "ProcessInfo",
    "SliceView",
    "SpanStats",
    "StageView",
    "StatsSummary",
    "TraceView",
    "ViewBuilder",
    "ViewFilter",
    "anomalies",
    "build_view",
    "closure_state",
    "module_table",
    "name_matches",
    "not_closed_line",
    "stage_input",
    "summarize",
]

"""The view model: what the terminal shows, derived from a :class:`TraceSet`, no rendering.

Every part is a pydantic model so ``spectrace view --json`` is ``model_dump_json()`` and
tests can assert on data, not on pixels.

    >>> view = build_view(load_traces("traces/"))
    >>> view.datapath.fc.status
    'bypassed'
"""

from __future__ import annotations

import math
import os
import socket
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from spectrace.checks.calls import check_fc_called, chunk_scale_outliers
from spectrace.records import SEVERITY_RANK, Call, TensorMeta, TensorStats
from spectrace.rules.catalogue import CATALOGUE
from spectrace.rules.globs import suffix_match

from .loader import TraceFile, TraceSet

HUGE_ABSMAX = 1e4  # a residual stream this large is overflow-bound in bf16/fp16


class ViewFilter(BaseModel):
    """What ``spectrace view`` was asked to narrow to."""

    module: str | None = None  # glob, matched against the full name and as a suffix
    rank: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    finding: str | None = None

    def step_ok(self, step: int | None) -> bool:
        if step is None:
            return True
        if self.step_min is not None and step < self.step_min:
            return False
        return self.step_max is None or step <= self.step_max

    def module_ok(self, name: str | None) -> bool:
        return self.module is None or (name is not None and name_matches(name, self.module))


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
    # Files without their closing record: their drop counts were never written, so
    # "records dropped" is not known for them. One line each, e.g. "<file>: not closed ...".
    not_closed: list[str] = []
    hook_calls: int = 0  # spectrace's serving-engine hooks: how often they ran, and their host time
    hook_us_per_call: float | None = None
    hook_us_per_verify_step: float | None = None
    hook_us_per_verify_step_by_feature: dict[str, float] = {}  # largest first
    coverage_gaps: list[str] = []
    load_problems: list[str] = []


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


class StatsSummary(BaseModel):
    """Aggregate of TensorStats over calls: mean of means, mean of stds, max absmax, nan/inf sums."""

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int = 0
    inf: int = 0
    samples: int = 0


class StageView(BaseModel):
    role: str
    modules: list[str] = []
    calls: int = 0
    in_shapes: list[list[int]] = []
    out_shapes: list[list[int]] = []
    dtypes: list[str] = []
    last: TensorStats | None = None
    agg: StatsSummary | None = None
    anomalies: list[str] = []
    status: str = "not seen"  # called / bypassed / not seen / loaded / missing ...
    note: str = ""


class CaptureView(BaseModel):
    module: str
    requested_ids: list[int] | None = None
    boundaries: list[int] = []
    num_layers: int
    hidden_size: int
    rule: str
    enabled: bool


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
    anomalies: list[str] = []


class TraceView(BaseModel):
    header: HeaderSummary
    findings: list[FindingGroup] = []
    datapath: DataPath
    acceptance: AcceptanceView
    modules: list[ModuleRow] = []


# ------------------------------------------------------------------------------- building
def build_view(ts: TraceSet, flt: ViewFilter | None = None) -> TraceView:
    """Derive everything the viewer shows from loaded traces, narrowed by ``flt``."""
    flt = flt or ViewFilter()
    files = [f for f in ts.files if flt.rank is None or f.rank == flt.rank]
    calls = [c for f in files for c in f.calls if flt.step_ok(c.step)]
    module_calls = [c for c in calls if flt.module_ok(c.module)]
    return TraceView(
        header=_header(ts, files, calls, flt),
        findings=_findings(files, flt),
        datapath=_datapath(files, calls),
        acceptance=_acceptance(files, flt),
        modules=module_table(module_calls),
    )


def _header(ts: TraceSet, files: list[TraceFile], calls: list[Call], flt: ViewFilter) -> HeaderSummary:
    steps = {c.step for c in calls}
    steps |= {a.step for f in files for a in f.acceptance if flt.step_ok(a.step)}
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
    starts = [f.header.started_unix for f in files if f.header]
    stamped = [c.t_unix for c in calls if c.t_unix]
    started = span = None
    if starts:
        started = datetime.fromtimestamp(min(starts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        # Only call records carry a time: a serving trace under CUDA graphs (acceptance
        # records only) has no span to state, and "0.0 s" would read as a measurement.
        span = round(max(starts + stamped) - min(starts), 3) if stamped else None
    dropped, gaps = _coverage(files)
    hook_calls, hook_us, hook_us_step, hook_us_by_feature = _hook_cost(files)
    return HeaderSummary(
        source=ts.source,
        processes=procs,
        ranks=sorted({f.rank for f in files if f.rank is not None}),
        step_first=min(steps) if steps else None,
        step_last=max(steps) if steps else None,
        steps_traced=len(steps),
        started=started,
        span_s=span,
        records_dropped=dropped,
        not_closed=[not_closed_line(f) for f in files if closure_state(f) != "closed"],
        hook_calls=hook_calls,
        hook_us_per_call=hook_us,
        hook_us_per_verify_step=hook_us_step,
        hook_us_per_verify_step_by_feature=hook_us_by_feature,
        coverage_gaps=gaps,
        load_problems=[p.message for p in ts.problems],
    )


def _hook_cost(files: list[TraceFile]) -> tuple[int, float | None, float | None, dict[str, float]]:
    """What spectrace's own serving hooks cost the host: calls, us per call, us per verify
    step, and that per-step figure split by patch-point feature (largest first).

    Counters are cumulative, so per file the last (largest) counters record counts; a verify
    step is one acceptance record.
    """
    calls = 0
    seconds = 0.0
    steps = 0
    by_feature: dict[str, float] = {}
    for f in files:
        last = max(f.counters, key=lambda s: s.hook_calls, default=None)
        if last is None or not last.hook_calls:
            continue
        calls += last.hook_calls
        seconds += last.hook_seconds
        steps += len(f.acceptance)
        for feature, spent in last.hook_seconds_by_feature.items():
            by_feature[feature] = by_feature.get(feature, 0.0) + spent
    if not calls:
        return 0, None, None, {}
    per_step = {k: round(v / steps * 1e6, 1) for k, v in sorted(by_feature.items(), key=lambda kv: -kv[1])} if steps else {}
    return calls, round(seconds / calls * 1e6, 2), round(seconds / steps * 1e6, 1) if steps else None, per_step


def _iso(unix: float | None) -> str | None:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if unix else None


def last_record_unix(f: TraceFile) -> float | None:
    """The newest time stamp in a file: its last call, finding, capture, ... or its header."""
    stamps = [f.header.started_unix] if f.header else []
    for kind in (f.calls[-1:], f.findings, f.coverage, f.weights, f.captures):
        stamps += [r.t_unix for r in kind if getattr(r, "t_unix", None)]
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


def _once_counts(f: TraceFile) -> dict[str, int]:
    """How often each record said once really happened (the closing counters record says)."""
    return f.counters[-1].once_counts if f.counters else {}


def _findings(files: list[TraceFile], flt: ViewFilter) -> list[FindingGroup]:
    groups: dict[tuple[str, str], FindingGroup] = {}
    for f in files:
        repeats = _once_counts(f)
        for fd in f.findings:
            if flt.finding and fd.code != flt.finding:
                continue
            if not flt.step_ok(fd.step) or (flt.module and not flt.module_ok(fd.module)):
                continue
            key = (fd.code, fd.severity)
            g = groups.get(key)
            if g is None:
                entry = CATALOGUE.get(fd.code)
                g = groups[key] = FindingGroup(
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
    out = list(groups.values())
    # Causes before symptoms: an acceptance collapse is explained by the other findings.
    symptom = {"acceptance_collapse": 1}
    out.sort(key=lambda g: (SEVERITY_RANK.get(g.severity, 9), symptom.get(g.code, 0), -g.count, g.code))
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
}
ROLE_PATTERNS: dict[str, tuple[str, ...]] = {
    "aux": ("*aux_concat*", "*aux_hidden*"),
    "fc": ("fc",),
    "layer": ("layers.0", "midlayer"),
    "norm": ("norm",),
    "lm_head": ("lm_head",),
}
_DRAFT_WORDS = ("draft", "eagle")


def roled_calls(files: list[TraceFile]) -> set[int]:
    """Ids of the calls whose file carries roles: for those, ``Call.role`` is the truth and
    a call without one is no stage at all. The others come from a writer before roles."""
    return {id(c) for f in files if any(c.role for c in f.calls) for c in f.calls}


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


def draft_calls(calls: list[Call], roled: set[int]) -> list[Call]:
    """The draft's calls, in trace order: by role where the trace has roles, else guessed."""
    legacy = [c for c in calls if id(c) not in roled]
    mine = {id(c) for c in calls if id(c) in roled and c.role and c.role.startswith("draft.")}
    mine |= {id(c) for c in _draft_calls(legacy)} if legacy else set()
    return [c for c in calls if id(c) in mine]


def in_stage(stage: str, c: Call, roled: set[int]) -> bool:
    """Whether call ``c`` is part of data-path ``stage`` (its role, or its name when the
    trace has no roles)."""
    if id(c) in roled:
        return c.role in STAGE_ROLES[stage]
    return any(name_matches(c.module, p) for p in ROLE_PATTERNS[stage])


def _stage(role: str, calls: list[Call], roled: set[int] | None = None) -> StageView:
    mine = [c for c in calls if in_stage(role, c, roled or set())]
    view = StageView(role=role)
    if not mine:
        return view
    view.status = "called"
    view.calls = len(mine)
    view.modules = _unique(c.module for c in mine)
    view.in_shapes = _unique_shapes(m for c in mine for m in c.inputs[:1])
    view.out_shapes = _unique_shapes(m for c in mine for m in c.outputs[:1])
    view.dtypes = _unique(m.dtype for c in mine for m in c.outputs[:1])
    outs = [m.stats for c in mine for m in c.outputs[:1] if m.stats is not None]
    view.last = outs[-1] if outs else None
    view.agg = summarize(outs) if outs else None
    view.anomalies = anomalies(view.agg) if view.agg else []
    return view


def _final_norm_candidate(c: Call, roled: set[int]) -> bool:
    # Names only: a norm inside the decoder layer is not the final norm (a role says so itself).
    return id(c) in roled or (not name_matches(c.module, "layers.**") and "midlayer" not in c.module)


def _datapath(files: list[TraceFile], calls: list[Call]) -> DataPath:
    roled = roled_calls(files)
    draft = draft_calls(calls, roled)
    findings = [fd for f in files for fd in f.findings]
    captures = [CaptureView(**c.model_dump(include=set(CaptureView.model_fields))) for f in files for c in f.captures]
    captures = _unique_models(captures)
    fc = _stage("fc", draft, roled)
    bypass = [fd for fd in findings if fd.code == "fc_bypass"]
    if bypass:
        fc.status = "bypassed"
        fc.note = bypass[0].message
    elif fc.calls == 0 and draft:
        # The check decides (the decoder layer ran in steps where fc never did); shown here.
        for found in check_fc_called(draft):
            fc.status, fc.note = "bypassed", found.message
    aux = _stage("aux", calls, roled)
    if aux.calls == 0 and any(not c.enabled for c in captures):
        aux.status = "disabled"
    elif aux.calls == 0 and any(fd.code in ("aux_capture_disabled", "logits_fallback") for fd in findings):
        aux.status = "disabled"
    return DataPath(
        captures=captures,
        aux=aux,
        fingerprints=_fingerprints(files),
        fc=fc,
        layer=_stage("layer", draft, roled),
        norm=_stage("norm", [c for c in draft if _final_norm_candidate(c, roled)], roled),
        lm_head=_stage("lm_head", draft, roled),
        d2t=_d2t(files, findings),
    )


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
def _acceptance(files: list[TraceFile], flt: ViewFilter) -> AcceptanceView:
    recs = sorted((a for f in files for a in f.acceptance if flt.step_ok(a.step)), key=lambda a: a.step)
    view = AcceptanceView()
    if not recs:
        return view
    per_step: dict[int, list[int]] = defaultdict(list)
    for a in recs:
        per_step[a.step].extend(a.accept_lengths)
    view.steps = sorted(per_step)
    view.mean_accept = [round(sum(v) / len(v), 4) if v else 0.0 for v in (per_step[s] for s in view.steps)]
    every = [x for v in per_step.values() for x in v]
    view.overall_mean = round(sum(every) / len(every), 4) if every else None
    view.requests = len(every)
    view.draft_tokens = max(a.draft_tokens for a in recs)
    k = view.draft_tokens
    accepted = [0] * k
    proposed = 0
    for a in recs:
        proposed += len(a.accept_lengths)
        for i, n in enumerate(a.accepted_per_position[:k]):
            accepted[i] += n
    view.position_rate = (
        [round(n / proposed, 4) if proposed else 0.0 for n in accepted] if any(a.accepted_per_position for a in recs) else []
    )
    return view


# ------------------------------------------------------------------------- module table
def module_table(calls: list[Call]) -> list[ModuleRow]:
    """One row per module in first-call order: calls, output shapes, dtypes, aggregated stats."""
    by: dict[str, list[Call]] = {}
    for c in calls:
        by.setdefault(c.module, []).append(c)
    rows = []
    for name, cs in by.items():
        outs = [m.stats for c in cs for m in c.outputs[:1] if m.stats is not None]
        agg = summarize(outs)
        rows.append(
            ModuleRow(
                module=name,
                module_type=cs[0].module_type,
                role=next((c.role for c in cs if c.role), None),
                calls=len(cs),
                out_shapes=_unique_shapes(m for c in cs for m in c.outputs[:1]),
                dtypes=_unique(m.dtype for c in cs for m in c.outputs[:1]),
                agg=agg,
                anomalies=anomalies(agg),
            )
        )
    return rows


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


def _unique(xs: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(xs))


def _unique_shapes(metas: Iterable[TensorMeta]) -> list[list[int]]:
    seen: dict[tuple[int, ...], None] = {}
    for m in metas:
        seen.setdefault(tuple(m.shape), None)
    return [list(s) for s in seen]


def _unique_models(xs: list[CaptureView]) -> list[CaptureView]:
    seen: dict[str, CaptureView] = {}
    for x in xs:
        seen.setdefault(x.model_dump_json(), x)
    return list(seen.values())

"""The data path of an EAGLE-3 pair as the view draws it: the captured boundaries, the aux
concat and its chunks, fc (with its input width against what it takes), the draft's layer,
norm and LM head, d2t and the target's LM head, each sliced by forward mode and draft step
over the whole run and the recent window. Built from the aggregates of :mod:`.accumulate`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from spectrace.checks.calls import check_fc_called, chunk_scale_outliers
from spectrace.records import TensorStats
from spectrace.rules.roles import boundary_role

from .accumulate import FileState, PathAcc, RoleInfo, Span, SpanKey, merge_paths
from .module_table import anomalies, summarize
from .parts import (
    BoundaryView,
    CaptureView,
    ChunkView,
    DataPath,
    FcWidths,
    FingerprintView,
    LiveChunkView,
    SliceView,
    StageView,
    StatsSummary,
    ViewFilter,
)
from .stages import STAGE_ROLES, guess_draft_calls, legacy_eagle3, legacy_role
from .traceset import TraceFile

# Rows in data-flow order: prefill, verify, draft extend, draft decode; others after.
MODE_ORDER = ("EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND", "DECODE")
NOT_IN_FILTER = "not in --module"


def _mode_rank(mode: str | None) -> tuple[int, str]:
    if mode is None:
        return (len(MODE_ORDER) + 1, "")
    return (MODE_ORDER.index(mode), mode) if mode in MODE_ORDER else (len(MODE_ORDER), mode)


class _Slicer:
    """Slices of the merged spans: by role(s), grouped by forward mode or draft step."""

    def __init__(self, run: dict[SpanKey, Span], win: dict[SpanKey, Span]) -> None:
        self.run = run
        self.win = win
        self._by_role: dict[str, list[SpanKey]] = defaultdict(list)
        for key in run:
            self._by_role[key[0]].append(key)

    def _keys(self, roles: Iterable[str], chunk: int | None) -> list[SpanKey]:
        return [k for r in roles for k in self._by_role.get(r, ()) if k[3] == chunk]

    def _slice(self, keys: list[SpanKey], label: str, mode: str | None = None, step: int | None = None) -> SliceView:
        run, win = Span(), Span()
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
        groups: dict[str | None, list[SpanKey]] = defaultdict(list)
        for k in self._keys(roles, chunk):
            groups[k[1]].append(k)
        only_none = list(groups) == [None]
        return [
            self._slice(groups[m], m if m is not None else ("all" if only_none else "no mode"), mode=m)
            for m in sorted(groups, key=_mode_rank)
        ]

    def draft_steps(self, roles: Iterable[str]) -> list[SliceView]:
        groups: dict[int, list[SpanKey]] = defaultdict(list)
        for k in self._keys(roles, None):
            if k[2] is not None:
                groups[k[2]].append(k)
        return [self._slice(groups[d], f"draft step {d}", step=d) for d in sorted(groups)]


def _stage(stage: str, roles: tuple[str, ...], info: dict[str, RoleInfo], sl: _Slicer, window: int) -> StageView:
    view = StageView(role=stage)
    mine = [info[r] for r in roles if r in info]
    if not mine:
        return view
    ri = RoleInfo()
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


def _live_chunks(aux: StageView, ri: RoleInfo | None, sl: _Slicer, captures: list[CaptureView]) -> list[LiveChunkView]:
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


def _boundary_layers(capture: CaptureView, info: dict[str, RoleInfo], sl: _Slicer) -> list[BoundaryView]:
    out = []
    for b in capture.boundaries:
        role = boundary_role(b)
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


def build_datapath(files: list[TraceFile], states: list[FileState], flt: ViewFilter) -> DataPath:
    window = max(1, flt.window_steps)
    accs = [s.path for s in states if s.roled]
    legacy_files = [s.file for s in states if not s.roled]
    eagle3 = any(s.eagle3 for s in states) or any(f.captures for f in files)
    if not eagle3 and legacy_files:
        eagle3 = legacy_eagle3(c for f in legacy_files for c in f.calls)
    if legacy_files:
        # No roles: the draft is told by names across the whole run, so fold it again.
        legacy = [c for f in legacy_files for c in f.calls if flt.step_ok(c.step)]
        draft = {id(c) for c in guess_draft_calls(legacy)} if legacy else set()
        acc = PathAcc(window)
        for c in legacy:
            role = legacy_role(c, draft) if flt.module_ok(c.module) else None
            if role is not None:
                acc.feed(c, role)
        acc.draft = [c for c in legacy if id(c) in draft and flt.module_ok(c.module)]
        accs.append(acc)
    top = sorted(set().union(*(s.top for s in states)))[-window:] if states else []
    floor = top[0] if top else None
    info, run, win = merge_paths(accs, floor)
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
        target_lm_head=stage("target_lm_head"),
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


def _unique_models(xs: list[CaptureView]) -> list[CaptureView]:
    seen: dict[str, CaptureView] = {}
    for x in xs:
        seen.setdefault(x.model_dump_json(), x)
    return list(seen.values())

"""The data path's aggregates, folded call by call: per (role, forward mode, draft step,
chunk) the records and the statistics of all their tensors combined as one (mean weighted
by numel, pooled std), over the whole run and over each of the last ``window`` steps.

:class:`FileState` is what the view builder keeps of one file between builds, so
``spectrace view --follow`` folds in only the calls appended since the last one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from spectrace.records import Call, TensorMeta, TensorStats
from spectrace.rules.roles import is_draft_role

from .limits import time_ok
from .module_table import ModuleAcc
from .parts import MomentStats, SpanStats
from .traceset import TraceFile

# Output args the hooks write: a decoder layer's residual stream (its (out, residual) pair
# summed), an aux concat's chunks (one per captured boundary), else the tensor itself.
RESIDUAL_ARG = "output.residual_stream"
CHUNK_PREFIX = "output.chunk["
SpanKey = tuple[str, "str | None", "int | None", "int | None"]  # role, forward mode, draft step, chunk


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


class Span:
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

    def merge(self, o: Span) -> None:
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


class RoleInfo:
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

    def merge(self, o: RoleInfo) -> None:
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


class PathAcc:
    """The data path's aggregates over the calls fed so far: per (role, forward mode, draft
    step, chunk) a span over the whole run and one per step of the window's steps."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.info: dict[str, RoleInfo] = {}
        self.run: dict[SpanKey, Span] = {}
        self.by_step: dict[int, dict[SpanKey, Span]] = {}
        self.top: list[int] = []  # the largest `window` distinct steps fed, ascending
        self.draft: list[Call] = []  # the draft's calls, for check_fc_called

    def _window_bucket(self, step: int) -> dict[SpanKey, Span] | None:
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
        bucket: dict[SpanKey, Span] = {}
        self.by_step[step] = bucket
        return bucket

    def feed(self, c: Call, role: str) -> None:
        if is_draft_role(role):
            self.draft.append(c)
        info = self.info.get(role)
        if info is None:
            info = self.info[role] = RoleInfo()
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
        key: SpanKey = (role, c.forward_mode, c.draft_step, None)
        bucket = self._window_bucket(c.step)
        spans = [self.run, bucket] if bucket is not None else [self.run]
        for table in spans:
            span = table.get(key)
            if span is None:
                span = table[key] = Span()
            span.add(c, outs, inp)
        for i, m in chunks:
            if m.shape:
                info.chunk_widths[i] = m.shape[-1]
            ckey: SpanKey = (role, c.forward_mode, c.draft_step, i)
            for table in spans:
                span = table.get(ckey)
                if span is None:
                    span = table[ckey] = Span()
                span.add(c, (m,), None)


class FileState:
    """What the view builder (:class:`~spectrace.viewers.model.ViewBuilder`) keeps of one file between builds."""

    def __init__(self, f: TraceFile, window: int) -> None:
        self.file = f
        self.done = 0  # calls of f folded in
        self.roled = False  # a call of this file carried a role
        self.eagle3 = False  # a call's role belongs to an EAGLE-3 pair (see DataPath.eagle3)
        self.steps: set[int] = set()
        self.top: list[int] = []  # the largest `window` distinct call steps, ascending
        self.window = window
        self.stamp: float | None = None  # the newest call time stamp
        self.modules = ModuleAcc()
        self.path = PathAcc(window)

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


def merge_paths(accs: list[PathAcc], floor: int | None) -> tuple[dict[str, RoleInfo], dict[SpanKey, Span], dict[SpanKey, Span]]:
    """Role infos, whole-run spans and window spans (steps >= floor) of every accumulator."""
    info: dict[str, RoleInfo] = {}
    run: dict[SpanKey, Span] = {}
    win: dict[SpanKey, Span] = {}

    def into(table: dict[SpanKey, Span], key: SpanKey, span: Span) -> None:
        mine = table.get(key)
        if mine is None:
            mine = table[key] = Span()
        mine.merge(span)

    for acc in accs:
        for role, ri in acc.info.items():
            info.setdefault(role, RoleInfo()).merge(ri)
        for key, span in acc.run.items():
            into(run, key, span)
        if floor is None:
            continue
        for step, bucket in acc.by_step.items():
            if step >= floor:
                for key, span in bucket.items():
                    into(win, key, span)
    return info, run, win

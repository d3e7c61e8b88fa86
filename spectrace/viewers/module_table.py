"""The per-module table: one row per module in first-call order with its calls, output
shapes, dtypes and statistics summed call by call, and words for what is wrong with them."""

from __future__ import annotations

import math
from collections.abc import Iterable

from spectrace.records import Call, TensorStats

from .parts import ModuleRow, StatsSummary, TraceView

HUGE_ABSMAX = 1e4  # a residual stream this large is overflow-bound in bf16/fp16


def module_table(calls: list[Call]) -> list[ModuleRow]:
    """One row per module in first-call order: calls, output shapes, dtypes, aggregated stats."""
    acc = ModuleAcc()
    for c in calls:
        acc.feed(c)
    return ModuleAcc.merged([acc])


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


class ModuleAcc:
    """The module table, folded call by call (see :class:`~spectrace.viewers.model.ViewBuilder`)."""

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
    def merged(accs: list[ModuleAcc]) -> list[ModuleRow]:
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


def flag_nonfinite_modules(view: TraceView) -> None:
    """Mark the rows a ``nonfinite`` finding names (checks/ made it; the table shows it)
    where the row's own statistics do not already say nan or inf."""
    named = {m for fg in view.findings if fg.code == "nonfinite" for m in fg.modules}
    for row in view.modules:
        if row.module in named and not (row.agg.nan or row.agg.inf):
            row.anomalies.insert(0, "non-finite")

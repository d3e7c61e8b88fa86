"""Compare two traces (A vs B) and list what differs, ending in a one-line verdict.

Shapes alone cannot see the layer-capture bug (both fused inputs are 3 x hidden wide), so
the diff also compares capture boundaries and the per-chunk statistics of the fused draft
input (``fingerprint`` records): an embedding-output chunk has a very different scale than
a deep residual stream.

    >>> result = diff_traces(load_traces("healthy/"), load_traces("served/"), rtol=0.25)
    >>> result.verdict
    '3 differences: 1 capture, 2 fingerprint'
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.text import Text

from .loader import TraceSet, shown_path
from .model import StatsSummary, build_view, closure_state, module_table, not_closed_line, summarize
from .render import num, shape

DEFAULT_RTOL = 0.25
ATOL = 1e-6  # below this both numbers are zero for our purposes

Kind = Literal["module", "shape", "dtype", "stats", "capture", "fingerprint", "acceptance", "finding"]


class Difference(BaseModel):
    kind: Kind
    where: str
    detail: str
    a: Any = None
    b: Any = None


class DiffResult(BaseModel):
    a: str
    b: str
    rtol: float
    differences: list[Difference] = []
    verdict: str = ""
    # Files of either side that lack their closing record (crashed, killed, or still
    # running): what they hold is a prefix of the run, so a missing step may be that.
    a_not_closed: list[str] = []
    b_not_closed: list[str] = []


def drifted(a: float | None, b: float | None, rtol: float, scale: float | None = None) -> bool:
    """True when a and b differ by more than ``rtol`` of ``scale`` (default: the larger magnitude)."""
    if a is None or b is None:
        return (a is None) != (b is None)
    ref = scale if scale is not None else max(abs(a), abs(b))
    return abs(a - b) > rtol * ref + ATOL


def _stats_drift(where: str, sa: StatsSummary, sb: StatsSummary, rtol: float, kind: Kind) -> list[Difference]:
    out = []
    # A mean near zero makes a relative mean test noise; judge its shift against the spread.
    spread = max(sa.std or 0.0, sb.std or 0.0)
    checks = (
        ("std", sa.std, sb.std, None),
        ("absmax", sa.absmax, sb.absmax, None),
        ("mean", sa.mean, sb.mean, spread or None),
    )
    for name, x, y, scale in checks:
        if drifted(x, y, rtol, scale):
            ratio = f" (x{y / x:.3g})" if x and y and name != "mean" else ""
            out.append(Difference(kind=kind, where=where, detail=f"{name} {num(x)} -> {num(y)}{ratio}", a=x, b=y))
    for name in ("nan", "inf"):
        x, y = getattr(sa, name), getattr(sb, name)
        if bool(x) != bool(y):
            out.append(Difference(kind=kind, where=where, detail=f"{name} {x} -> {y}", a=x, b=y))
    return out


def _ranks(ts: TraceSet) -> list[int]:
    return sorted({f.rank for f in ts.files if f.rank is not None})


def _of_rank(ts: TraceSet, rank: int) -> TraceSet:
    return TraceSet(source=ts.source, files=[f for f in ts.files if f.rank == rank])


def _diff_sets(a: TraceSet, b: TraceSet, rtol: float) -> list[Difference]:
    return (
        _diff_modules(a, b, rtol)
        + _diff_captures(a, b)
        + _diff_fingerprints(a, b, rtol)
        + _diff_acceptance(a, b, rtol)
        + _diff_findings(a, b)
    )


def diff_traces(a: TraceSet, b: TraceSet, *, rtol: float = DEFAULT_RTOL) -> DiffResult:
    """Every difference between two traces that could explain an acceptance change.

    Two tensor-parallel runs with the same ranks are compared rank by rank (a shard is
    compared with the same shard), each difference naming its rank."""
    diffs: list[Difference] = []
    ranks = _ranks(a)
    if len(ranks) > 1 and ranks == _ranks(b):
        for rank in ranks:
            for d in _diff_sets(_of_rank(a, rank), _of_rank(b, rank), rtol):
                d.where = f"rank {rank}: {d.where}"
                diffs.append(d)
    else:
        diffs = _diff_sets(a, b, rtol)
    result = DiffResult(
        a=shown_path(a.source),
        b=shown_path(b.source),
        rtol=rtol,
        differences=diffs,
        a_not_closed=[not_closed_line(f) for f in a.files if closure_state(f) != "closed"],
        b_not_closed=[not_closed_line(f) for f in b.files if closure_state(f) != "closed"],
    )
    if not diffs:
        result.verdict = "traces agree"
    else:
        counts = Counter(d.kind for d in diffs)
        result.verdict = f"{len(diffs)} difference{'s' if len(diffs) != 1 else ''}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    cut = [side for side, lines in (("A", result.a_not_closed), ("B", result.b_not_closed)) if lines]
    if cut:
        result.verdict += f" ({' and '.join(cut)} not closed: a prefix of the run only)"
    return result


def _diff_modules(a: TraceSet, b: TraceSet, rtol: float) -> list[Difference]:
    rows_a = {r.module: r for r in module_table(a.all("calls"))}
    rows_b = {r.module: r for r in module_table(b.all("calls"))}
    out: list[Difference] = []
    for name in list(rows_a) + [n for n in rows_b if n not in rows_a]:
        ra, rb = rows_a.get(name), rows_b.get(name)
        if ra is None or rb is None:
            side = "A" if rb is None else "B"
            out.append(Difference(kind="module", where=name, detail=f"called in {side} only"))
            continue
        if ra.out_shapes != rb.out_shapes:
            out.append(
                Difference(
                    kind="shape",
                    where=name,
                    detail=f"{' '.join(map(shape, ra.out_shapes))} -> {' '.join(map(shape, rb.out_shapes))}",
                    a=ra.out_shapes,
                    b=rb.out_shapes,
                )
            )
        if ra.dtypes != rb.dtypes:
            out.append(Difference(kind="dtype", where=name, detail=f"{ra.dtypes} -> {rb.dtypes}", a=ra.dtypes, b=rb.dtypes))
        out += _stats_drift(name, ra.agg, rb.agg, rtol, "stats")
    return out


def _diff_captures(a: TraceSet, b: TraceSet) -> list[Difference]:
    ca = {c.module: c for c in a.all("captures")}
    cb = {c.module: c for c in b.all("captures")}
    out: list[Difference] = []
    # Roots may differ between runs; with one capture each, compare them whatever their names.
    pairs = [(m, ca[m], cb[m]) for m in ca if m in cb]
    if not pairs and len(ca) == 1 and len(cb) == 1:
        (ma, xa), (_, xb) = next(iter(ca.items())), next(iter(cb.items()))
        pairs = [(ma, xa, xb)]
    for module, x, y in pairs:
        if x.boundaries != y.boundaries:
            out.append(
                Difference(
                    kind="capture",
                    where=module,
                    detail=f"boundaries {x.boundaries} -> {y.boundaries} (ids {x.requested_ids} -> {y.requested_ids})",
                    a=x.boundaries,
                    b=y.boundaries,
                )
            )
        if x.enabled != y.enabled:
            out.append(Difference(kind="capture", where=module, detail=f"enabled {x.enabled} -> {y.enabled}"))
    if ca and not cb:
        out.append(Difference(kind="capture", where=", ".join(ca), detail="capture record in A only"))
    if cb and not ca:
        out.append(Difference(kind="capture", where=", ".join(cb), detail="capture record in B only"))
    return out


def _diff_fingerprints(a: TraceSet, b: TraceSet, rtol: float) -> list[Difference]:
    fa = {f.module: f for f in build_view(a).datapath.fingerprints}
    fb = {f.module: f for f in build_view(b).datapath.fingerprints}
    pairs = [(m, fa[m], fb[m]) for m in fa if m in fb]
    if not pairs and len(fa) == 1 and len(fb) == 1:
        pairs = [(next(iter(fa)), next(iter(fa.values())), next(iter(fb.values())))]
    out: list[Difference] = []
    for module, x, y in pairs:
        if x.chunk_width != y.chunk_width or len(x.chunks) != len(y.chunks):
            out.append(
                Difference(
                    kind="fingerprint",
                    where=module,
                    detail=f"{len(x.chunks)} x {x.chunk_width} -> {len(y.chunks)} x {y.chunk_width}",
                )
            )
        for cx, cy in zip(x.chunks, y.chunks):
            where = f"{module} chunk {cx.index}"
            label = f"b{cx.boundary}" if cx.boundary == cy.boundary else f"b{cx.boundary} vs b{cy.boundary}"
            for d in _stats_drift(where, summarize([cx.stats]), summarize([cy.stats]), rtol, "fingerprint"):
                d.detail = f"({label}) {d.detail}"
                out.append(d)
    return out


def _diff_acceptance(a: TraceSet, b: TraceSet, rtol: float) -> list[Difference]:
    ma, mb = build_view(a).acceptance.overall_mean, build_view(b).acceptance.overall_mean
    if ma is None and mb is None:
        return []
    if drifted(ma, mb, rtol):
        return [Difference(kind="acceptance", where="mean accept length", detail=f"{num(ma)} -> {num(mb)}", a=ma, b=mb)]
    return []


def _diff_findings(a: TraceSet, b: TraceSet) -> list[Difference]:
    # Codes kept as counts only (past the loader's budget) are codes all the same.
    ka = {f.code for f in a.all("findings")} | {code for f in a.files for code, _ in f.findings_folded}
    kb = {f.code for f in b.all("findings")} | {code for f in b.files for code, _ in f.findings_folded}
    out = [Difference(kind="finding", where=c, detail="finding in A only") for c in sorted(ka - kb)]
    out += [Difference(kind="finding", where=c, detail="finding in B only") for c in sorted(kb - ka)]
    return out


class DiffView:
    """The diff as text: one line per difference, grouped by kind, then the verdict."""

    def __init__(self, result: DiffResult) -> None:
        self.r = result

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        r = self.r
        yield Text(f"A {r.a}\nB {r.b}\nrtol {r.rtol:g}", style="dim")
        for side, lines in (("A", r.a_not_closed), ("B", r.b_not_closed)):
            for line in lines:
                yield Text(f"{side} {line}", style="bold red" if ": not closed" in line else "yellow")
        kind = None
        for d in r.differences:
            if d.kind != kind:
                kind = d.kind
                yield Text(kind, style="bold")
            line = Text("  ")
            line.append(d.where, style="cyan")
            line.append(f"  {d.detail}")
            yield line
        yield Text(r.verdict, style="bold green" if not r.differences else "bold red")


def render_diff(result: DiffResult) -> Group:
    return Group(DiffView(result))

"""Compare two traces (A vs B) and list what differs, ending in a one-line verdict.

What explains an acceptance change comes first: the data path (the draft's fc, the aux
concat, the fused input's per-chunk statistics), the target's capture, the mean accept
length, the findings of one side only; the other modules' shapes, dtypes and statistics
follow. Shapes are compared with their batch and token dimensions set aside
(:func:`set_aside_dims`): two runs on other prompts see other sequence lengths, which is no
difference; a module whose shapes differ only there is listed in ``DiffResult.set_aside``
(``--json``), and counted in one line of the text.

Shapes alone cannot see the layer-capture bug (both fused inputs are 3 x hidden wide), so
the diff also compares capture boundaries and the per-chunk statistics of the fused draft
input (``fingerprint`` records): an embedding-output chunk has a very different scale than
a deep residual stream.

    >>> result = diff_traces(load_traces("healthy/"), load_traces("served/"), rtol=0.25)
    >>> result.verdict
    '3 differences: 1 capture, 2 fingerprint'
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Literal

from pydantic import BaseModel
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.text import Text

from spectrace.records import SEVERITY_RANK

from .header import closure_state, not_closed_line
from .model import build_view
from .module_table import module_table, summarize
from .parts import ModuleRow, StatsSummary, name_matches
from .render import num, shape_pattern
from .stages import ROLE_PATTERNS, STAGE_ROLES
from .traceset import TraceSet, shown_path

DEFAULT_RTOL = 0.25
ATOL = 1e-6  # below this both numbers are zero for our purposes

MAX_MODULE_LINES = 12  # lines of per-module differences on screen (one per module and kind); --json has them all

Kind = Literal["module", "shape", "dtype", "stats", "capture", "fingerprint", "acceptance", "finding"]
# The text and the JSON list differences in this order: what explains an acceptance change
# first, the per-module detail last.
Section = Literal["data path", "capture", "acceptance", "findings", "modules"]
SECTIONS: tuple[Section, ...] = ("data path", "capture", "acceptance", "findings", "modules")
# The data path's stages, most telling first (a skipped fc is the commonest wiring bug).
_STAGE_ORDER = ("fc", "aux", "layer", "norm", "lm_head", "target_lm_head")
_STAGE_OF_ROLE = {role: stage for stage in _STAGE_ORDER for role in STAGE_ROLES[stage]}


class Difference(BaseModel):
    kind: Kind
    where: str
    detail: str
    a: Any = None
    b: Any = None
    section: Section = "modules"
    stage: str | None = None  # the data path stage of the module (fc, aux, layer ...), if any


class DiffResult(BaseModel):
    a: str
    b: str
    rtol: float
    differences: list[Difference] = []
    # Modules whose output shapes differ only in batch or token dimensions: no difference,
    # kept so the JSON is complete (``a`` and ``b`` hold every shape seen).
    set_aside: list[Difference] = []
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


def _diff_sets(a: TraceSet, b: TraceSet, rtol: float) -> tuple[list[Difference], list[Difference]]:
    modules, set_aside = _diff_modules(a, b, rtol)
    found = modules + _diff_captures(a, b) + _diff_fingerprints(a, b, rtol) + _diff_acceptance(a, b, rtol) + _diff_findings(a, b)
    return found, set_aside


def _ordered(diffs: list[Difference]) -> list[Difference]:
    """Sections in :data:`SECTIONS` order, data path stages in :data:`_STAGE_ORDER` order;
    otherwise as found (first-call order of the modules)."""

    def key(d: Difference) -> tuple[int, int]:
        stage = _STAGE_ORDER.index(d.stage) if d.stage in _STAGE_ORDER else len(_STAGE_ORDER)
        return SECTIONS.index(d.section), stage

    return sorted(diffs, key=key)


def diff_traces(a: TraceSet, b: TraceSet, *, rtol: float = DEFAULT_RTOL) -> DiffResult:
    """Every difference between two traces that could explain an acceptance change.

    Two tensor-parallel runs with the same ranks are compared rank by rank (a shard is
    compared with the same shard), each difference naming its rank."""
    diffs: list[Difference] = []
    set_aside: list[Difference] = []
    ranks = _ranks(a)
    if len(ranks) > 1 and ranks == _ranks(b):
        for rank in ranks:
            found, aside = _diff_sets(_of_rank(a, rank), _of_rank(b, rank), rtol)
            for d in found + aside:
                d.where = f"rank {rank}: {d.where}"
            diffs += found
            set_aside += aside
    else:
        diffs, set_aside = _diff_sets(a, b, rtol)
    diffs = _ordered(diffs)
    result = DiffResult(
        a=shown_path(a.source),
        b=shown_path(b.source),
        rtol=rtol,
        differences=diffs,
        set_aside=set_aside,
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


def set_aside_dims(a: list[list[int]], b: list[list[int]]) -> dict[int, set[int]]:
    """Per number of dimensions, the ones a shape comparison sets aside as batch or token
    dimensions: dimension 0 of a shape of 2 or more (``[T, H]``, ``[B, T, H]``), dimension 1
    of a 3-dimensional one (``[B, T, H]``), and any other that varies between the calls of
    one side (a sequence length elsewhere: ``[B, heads, T, d]``, or a 1-dimensional ``[T]``).
    The last dimension of a shape of 2 or more, the feature width, is always compared.

        >>> set_aside_dims([[1, 24, 64], [1, 29, 64]], [[1, 30, 64]])
        {3: {0, 1}}
    """
    out: dict[int, set[int]] = {}
    for side in (a, b):
        by_ndim: dict[int, list[list[int]]] = defaultdict(list)
        for s in side:
            by_ndim[len(s)].append(s)
        for ndim, same in by_ndim.items():
            dims = out.setdefault(ndim, set())
            if ndim >= 2:
                dims.add(0)
            if ndim == 3:
                dims.add(1)
            for i in range(ndim - 1 if ndim >= 2 else ndim):
                if len({s[i] for s in same}) > 1:
                    dims.add(i)
    return out


def shape_signatures(shapes: list[list[int]], aside: dict[int, set[int]]) -> set[tuple[int | None, ...]]:
    """The shapes with the dimensions in ``aside`` replaced by None: what is compared."""
    return {tuple(None if i in aside.get(len(s), ()) else d for i, d in enumerate(s)) for s in shapes}


def _shapes_text(ss: list[list[int]]) -> str:
    # One pattern per number of dimensions: a varying dimension reads min..max.
    by_ndim: dict[int, list[list[int]]] = defaultdict(list)
    for s in ss:
        by_ndim[len(s)].append(s)
    return " ".join(shape_pattern(group) for group in by_ndim.values()) or "-"


def _stage(row: ModuleRow) -> str | None:
    """The data path stage a module row stands for, by its role (by its name before roles)."""
    if row.role is not None:
        return _STAGE_OF_ROLE.get(row.role)
    for stage in ("fc", "aux"):
        if any(name_matches(row.module, p) for p in ROLE_PATTERNS[stage]):
            return stage
    return None


def _diff_modules(a: TraceSet, b: TraceSet, rtol: float) -> tuple[list[Difference], list[Difference]]:
    rows_a = {r.module: r for r in module_table(a.all("calls"))}
    rows_b = {r.module: r for r in module_table(b.all("calls"))}
    out: list[Difference] = []
    set_aside: list[Difference] = []
    for name in list(rows_a) + [n for n in rows_b if n not in rows_a]:
        ra, rb = rows_a.get(name), rows_b.get(name)
        stage = _stage(ra or rb)  # type: ignore[arg-type]  # one of them is there
        section: Section = "data path" if stage else "modules"

        at: dict[str, Any] = {"where": name, "section": section, "stage": stage}

        if ra is None or rb is None:
            side, calls = ("A", ra.calls) if ra is not None else ("B", rb.calls if rb else 0)
            detail = f"called in {side} only ({calls} call{'s' if calls != 1 else ''})"
            out.append(Difference(kind="module", detail=detail, a=ra.calls if ra else None, b=rb.calls if rb else None, **at))
            continue
        if ra.out_shapes != rb.out_shapes:
            aside = set_aside_dims(ra.out_shapes, rb.out_shapes)
            same = shape_signatures(ra.out_shapes, aside) == shape_signatures(rb.out_shapes, aside)
            detail = f"{_shapes_text(ra.out_shapes)} -> {_shapes_text(rb.out_shapes)}"
            if same:
                detail += " (batch and token dimensions only)"
            diff = Difference(kind="shape", detail=detail, a=ra.out_shapes, b=rb.out_shapes, **at)
            (set_aside if same else out).append(diff)
        if ra.dtypes != rb.dtypes:
            out.append(Difference(kind="dtype", detail=f"{ra.dtypes} -> {rb.dtypes}", a=ra.dtypes, b=rb.dtypes, **at))
        for d in _stats_drift(name, ra.agg, rb.agg, rtol, "stats"):
            d.section, d.stage = section, stage
            out.append(d)
    return out, set_aside


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
        # Capture switched off explains everything after it; say it before the boundaries.
        if x.enabled != y.enabled:
            out.append(
                Difference(
                    section="capture", kind="capture", where=module, detail=f"enabled {x.enabled} -> {y.enabled}", a=x.enabled, b=y.enabled
                )
            )
        if x.boundaries != y.boundaries:
            out.append(
                Difference(
                    section="capture",
                    kind="capture",
                    where=module,
                    detail=f"boundaries {x.boundaries} -> {y.boundaries} (ids {x.requested_ids} -> {y.requested_ids})",
                    a=x.boundaries,
                    b=y.boundaries,
                )
            )
    if ca and not cb:
        out.append(Difference(section="capture", kind="capture", where=", ".join(ca), detail="capture record in A only"))
    if cb and not ca:
        out.append(Difference(section="capture", kind="capture", where=", ".join(cb), detail="capture record in B only"))
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
                    section="data path",
                    stage="aux",
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
                d.section, d.stage = "data path", "aux"
                out.append(d)
    return out


def _diff_acceptance(a: TraceSet, b: TraceSet, rtol: float) -> list[Difference]:
    ma, mb = build_view(a).acceptance.overall_mean, build_view(b).acceptance.overall_mean
    if ma is None and mb is None:
        return []
    if drifted(ma, mb, rtol):
        return [
            Difference(section="acceptance", kind="acceptance", where="mean accept length", detail=f"{num(ma)} -> {num(mb)}", a=ma, b=mb)
        ]
    return []


def _diff_findings(a: TraceSet, b: TraceSet) -> list[Difference]:
    """Codes found on one side only; ``a``/``b`` hold that side's first message of the code."""
    # Codes kept as counts only (past the loader's budget) are codes all the same.
    ka, kb = _codes(a), _codes(b)
    out = []
    for side, mine, other in (("A", ka, kb), ("B", kb, ka)):
        for code in sorted(set(mine) - set(other), key=lambda c: (SEVERITY_RANK.get(mine[c][0], 9), c)):
            severity, message = mine[code]
            x, y = (message, None) if side == "A" else (None, message)
            out.append(Difference(section="findings", kind="finding", where=code, detail=f"{severity}, in {side} only", a=x, b=y))
    return out


def _codes(ts: TraceSet) -> dict[str, tuple[str, str]]:
    """Each finding code of a set: its severity and first message ("" when kept as a count only)."""
    out: dict[str, tuple[str, str]] = {}
    for f in ts.all("findings"):
        out.setdefault(f.code, (f.severity, f.message))
    for f in ts.files:
        for (code, severity), _ in f.findings_folded.items():
            out.setdefault(code, (severity, ""))
    return out


class DiffView:
    """The diff as text: what explains an acceptance change first (data path, capture,
    acceptance, findings), then at most :data:`MAX_MODULE_LINES` per-module differences,
    one line for the shapes set aside, and the verdict last."""

    def __init__(self, result: DiffResult) -> None:
        self.r = result

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        r = self.r
        yield Text(f"A {r.a}\nB {r.b}\nrtol {r.rtol:g}; shapes compared with batch and token dimensions set aside", style="dim")
        for side, lines in (("A", r.a_not_closed), ("B", r.b_not_closed)):
            for line in lines:
                yield Text(f"{side} {line}", style="bold red" if ": not closed" in line else "yellow")
        groups = _lines(r.differences)
        width = max((len(ds[0].stage or "") for ds in groups if ds[0].section == "data path"), default=0)
        section = None
        modules = [ds for ds in groups if ds[0].section == "modules"]
        for ds in [ds for ds in groups if ds[0].section != "modules"] + modules[:MAX_MODULE_LINES]:
            if ds[0].section != section:
                section = ds[0].section
                yield Text(section, style="bold")
            yield _line(ds, width)
        if len(modules) > MAX_MODULE_LINES:
            yield Text(f"  ... {len(modules) - MAX_MODULE_LINES} more modules differ (--json lists them all)", style="dim")
        if r.set_aside:
            n = len(r.set_aside)
            yield Text(
                f"{n} module{'s' if n != 1 else ''} differ only in batch/token dimensions: set aside (--json)",
                style="dim",
            )
        yield Text(r.verdict, style="bold green" if not r.differences else "bold red")


def _lines(diffs: list[Difference]) -> list[list[Difference]]:
    """One screen line per module and kind: a module's drifted statistics share a line
    (one difference each in ``--json``)."""
    out: list[list[Difference]] = []
    for d in diffs:
        last = out[-1][0] if out else None
        if (
            last is not None
            and d.kind in ("stats", "fingerprint")
            and (last.kind, last.where, last.section) == (d.kind, d.where, d.section)
        ):
            out[-1].append(d)
        else:
            out.append([d])
    return out


def _line(ds: list[Difference], stage_width: int) -> Text:
    d = ds[0]
    line = Text("  ")
    if d.section == "data path":
        line.append(f"{d.stage or '':<{stage_width}}  ", style="bold")
    line.append(d.where, style="cyan")
    details = [x.detail for x in ds]
    label = details[0][: details[0].find(")") + 1] if d.kind == "fingerprint" and details[0].startswith("(") else ""
    if label and len(ds) > 1 and all(x.startswith(label + " ") for x in details):
        details = [details[0]] + [x[len(label) + 1 :] for x in details[1:]]  # "(b1 vs b0)" once
    line.append("  " + "; ".join(details))
    message = d.a or d.b if d.kind == "finding" else None
    if message:
        # One line each: the whole message is in --json and in `spectrace view`.
        line.append(f": {message}", style="dim")
        line.no_wrap, line.overflow = True, "ellipsis"
    return line


def render_diff(result: DiffResult) -> Group:
    return Group(DiffView(result))

"""Repeated layers as one row: the module table of a deep model on one screen.

``model.layers.0.mlp`` ... ``model.layers.79.mlp`` become ``model.layers.[0-79].mlp``: the
calls summed, the statistics combined, the shapes and dtypes united. A row with something
wrong (NaN, Inf, a huge absmax) is never folded, so the layer it happened in keeps its
name on the screen. Display only: ``--json`` keeps one row per module.

    >>> [r.module for r in fold_layers(rows)]
    ['model.embed_tokens', 'model.layers.[0-31].self_attn', 'model.layers.7.mlp', 'lm_head']
"""

from __future__ import annotations

from .model import ModuleRow, StatsSummary


def _key(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``model.layers.[].mlp`` and the indices, or None for a name without one."""
    parts = name.split(".")
    idx = tuple(int(p) for p in parts if p.isascii() and p.isdigit() and len(p) < 10)
    if not idx:
        return None
    return ".".join("[]" if p.isascii() and p.isdigit() and len(p) < 10 else p for p in parts), idx


def spans(values: list[int]) -> str:
    """``0-3,7,9-10``: sorted, runs joined.

    >>> spans([3, 0, 1, 2, 7, 9, 10])
    '0-3,7,9-10'
    """
    out: list[str] = []
    vs = sorted(set(values))
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        out.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ",".join(out)


def _folded_name(pattern: str, indices: list[tuple[int, ...]]) -> str:
    parts, k = [], 0
    for p in pattern.split("."):
        if p == "[]":
            parts.append(f"[{spans([ix[k] for ix in indices])}]")
            k += 1
        else:
            parts.append(p)
    return ".".join(parts)


def _combined(rows: list[ModuleRow]) -> StatsSummary:
    """Means and stds weighted by the samples each row covers; absmax the largest."""
    n = sum(r.agg.samples for r in rows)

    def weighted(values: list[tuple[float | None, int]]) -> float | None:
        known = [(v, w) for v, w in values if v is not None and w]
        total = sum(w for _, w in known)
        return sum(v * w for v, w in known) / total if total else None

    absmax = [r.agg.absmax for r in rows if r.agg.absmax is not None]
    return StatsSummary(
        mean=weighted([(r.agg.mean, r.agg.samples) for r in rows]),
        std=weighted([(r.agg.std, r.agg.samples) for r in rows]),
        absmax=max(absmax) if absmax else None,
        nan=sum(r.agg.nan for r in rows),
        inf=sum(r.agg.inf for r in rows),
        samples=n,
    )


def fold_layers(rows: list[ModuleRow]) -> list[ModuleRow]:
    """One row per repeated module (same name but its indices, same type), in one pass;
    rows with anomalies and names seen once stay as they are, in their order."""
    groups: dict[tuple[str, str], list[tuple[ModuleRow, tuple[int, ...]]]] = {}
    order: list[ModuleRow | tuple[str, str]] = []
    for r in rows:
        k = None if r.anomalies else _key(r.module)
        if k is None:
            order.append(r)
            continue
        gk = (k[0], r.module_type)
        if gk not in groups:
            groups[gk] = []
            order.append(gk)
        groups[gk].append((r, k[1]))
    out: list[ModuleRow] = []
    for item in order:
        if isinstance(item, ModuleRow):
            out.append(item)
            continue
        members = groups[item]
        if len(members) == 1:
            out.append(members[0][0])
            continue
        rs = [m for m, _ in members]
        out.append(
            ModuleRow(
                module=_folded_name(item[0], [ix for _, ix in members]),
                module_type=item[1],
                role=None,
                calls=sum(r.calls for r in rs),
                out_shapes=list({tuple(s): s for r in rs for s in r.out_shapes}.values()),
                dtypes=list(dict.fromkeys(d for r in rs for d in r.dtypes)),
                agg=_combined(rs),
            )
        )
    return out

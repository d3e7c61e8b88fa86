"""``weights_dropped`` / ``weights_missing`` from what a weight load did.

When the dropped and the missing names share their tails under different prefixes
(``layers.0.self_attn.q_proj`` dropped, ``midlayer.self_attn.q_proj`` missing), the
fix names the rename map.

    >>> check_weights(Weights(module="draft", ignored=["layers.0.mlp.up_proj.weight"],
    ...                       missing=["midlayer.mlp.up_proj.weight"]))[0].fix
    "rename 'layers.0.*' to 'midlayer.*' in the checkpoint (or map it in the loader)"
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..records import Finding, Weights
from ..rules.catalogue import finding

MAX_NAMES = 12


def group_by_prefix(names: list[str], depth: int = 2) -> dict[str, list[str]]:
    """``{"layers.0": [...], "lm_head": [...]}``: names grouped by their first parts."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        parts = name.split(".")
        key = ".".join(parts[: min(depth, max(1, len(parts) - 1))])
        groups[key].append(name)
    return dict(groups)


def rename_map(dropped: list[str], missing: list[str]) -> dict[str, str]:
    """Prefix renames that turn dropped names into missing ones (``layers.0`` -> ``midlayer``)."""
    votes: Counter[tuple[str, str]] = Counter()
    missing_set = set(missing)
    for name in dropped:
        parts = name.split(".")
        for cut in range(1, len(parts)):
            tail = ".".join(parts[cut:])
            for target in missing_set:
                if target.endswith("." + tail) or target == tail:
                    head = target[: len(target) - len(tail)].rstrip(".")
                    votes[(".".join(parts[:cut]), head)] += 1
            if votes:
                break
    result: dict[str, str] = {}
    for (src, dst), _ in votes.most_common():
        if dst.startswith("model.") and not src.startswith("model."):
            dst = dst[len("model.") :]  # engines add the "model." prefix themselves
        if src not in result and dst not in result.values():
            result[src] = dst
    return result


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" (+{len(names) - MAX_NAMES} more)" if len(names) > MAX_NAMES else "")


def check_weights(weights: Weights) -> list[Finding]:
    findings: list[Finding] = []
    renames = rename_map(weights.ignored, weights.missing)
    rename_fix = None
    if renames:
        pairs = "; ".join(f"{src}.* -> {dst}.*" if dst else f"{src}.* -> (no prefix)" for src, dst in renames.items())
        rename_fix = f"rename the checkpoint keys {pairs} (or map them in the loader)"
    for code, names, key, what in (
        ("weights_dropped", weights.ignored, "dropped", "checkpoint tensors were ignored by the loader"),
        ("weights_missing", weights.missing, "missing", "parameters were never written and stay at init"),
    ):
        if not names:
            continue
        groups = group_by_prefix(names)
        findings.append(
            finding(
                code,
                f"{len(names)} {what}: {_listing(names)}",
                module=weights.module,
                evidence={key: names, "by_prefix": {k: len(v) for k, v in groups.items()}, "rename_map": renames},
                fix=rename_fix,
                source="checks.weights",
            )
        )
    return findings


def check_hot_token_map(draft_vocab: int | None, target_vocab: int | None, loaded: bool, *, module: str, source: str = "") -> list[Finding]:
    """A reduced draft vocabulary needs its d2t map (the engine's hot_token_id)."""
    if not (draft_vocab and target_vocab and draft_vocab < target_vocab) or loaded:
        return []
    return [
        finding(
            "weights_missing",
            f"draft_vocab_size {draft_vocab} < target vocab {target_vocab} but no d2t was loaded: draft ids are read as target ids",
            module=module,
            evidence={"draft_vocab_size": draft_vocab, "vocab_size": target_vocab, "missing": ["d2t"]},
            fix="save d2t (draft id -> target id offsets) with the draft checkpoint",
            source=source,
        )
    ]

"""``weights_dropped`` / ``weights_missing`` from what a weight load did.

When the dropped and the missing names share their tails under different prefixes
(``layers.0.self_attn.q_proj`` dropped, ``midlayer.self_attn.q_proj`` missing), the
fix names the rename map.

    >>> check_weights(Weights(module="draft", ignored=["layers.0.mlp.up_proj.weight"],
    ...                       missing=["midlayer.mlp.up_proj.weight"]))[0].fix
    'rename the checkpoint keys layers.0.* -> midlayer.*, or serve on SGLang 0.5.14 or later, which reads both names'
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..records import Finding, Weights
from ..rules.catalogue import finding
from ..rules.engines import layer_rename_note

MAX_NAMES = 12


def group_by_prefix(names: list[str], depth: int = 2) -> dict[str, list[str]]:
    """``{"layers.0": [...], "lm_head": [...]}``: names grouped by their first parts."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        parts = name.split(".")
        key = ".".join(parts[: min(depth, max(1, len(parts) - 1))])
        groups[key].append(name)
    return dict(groups)


# Bounds of the rename search, so a load of 200,000 unrelated names stays linear: tails
# of at most this many parts (real parameter names have fewer than ten), and at most this
# many missing names voted for per tail ("weight" ends every one of them).
MAX_TAIL_PARTS = 16
MAX_HEADS_PER_TAIL = 8


def _tails(name: str) -> list[tuple[str, str]]:
    """``(head, tail)`` for every dot-aligned tail of ``name`` of at most MAX_TAIL_PARTS parts, longest first."""
    parts = name.split(".")
    first = max(0, len(parts) - MAX_TAIL_PARTS)
    out: list[tuple[str, str]] = []
    tail = ""
    for cut in range(len(parts) - 1, first - 1, -1):
        tail = parts[cut] + ("." + tail if tail else "")
        out.append((".".join(parts[:cut]), tail))
    out.reverse()
    return out


def rename_map(dropped: list[str], missing: list[str]) -> dict[str, str]:
    """Prefix renames that turn dropped names into missing ones (``layers.0`` -> ``midlayer``).

    Each dropped name votes with its longest tail (two parts at least) that some missing
    name ends with: for the rename of its head to each such missing name's head. The
    missing names are indexed by their tails once, so a dropped name costs its own length."""
    heads_by_tail: dict[str, list[str]] = defaultdict(list)
    for target in dict.fromkeys(missing):
        for head, tail in _tails(target):
            heads = heads_by_tail[tail]
            if len(heads) < MAX_HEADS_PER_TAIL:
                heads.append(head)
    votes: Counter[tuple[str, str]] = Counter()
    for name in dropped:
        for src, tail in _tails(name):
            if tail == name or "." not in tail:
                continue  # a rename needs a head to rewrite, and a tail of two parts at least ("weight" ends them all)
            found = heads_by_tail.get(tail)
            if found:
                for head in found:
                    votes[(src, head)] += 1
                break
    result: dict[str, str] = {}
    used: set[str] = set()
    for (src, dst), _ in votes.most_common():
        if dst.startswith("model.") and not src.startswith("model."):
            dst = dst[len("model.") :]  # engines add the "model." prefix themselves
        if src not in result and dst not in used:
            result[src] = dst
            used.add(dst)
    return result


def _listing(names: list[str], limit: int = MAX_NAMES) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


SEEN_NAMES = 3  # names in a finding's one-line observation; its evidence lists them all


def _said(n: int, noun: str, one: str, many: str) -> str:
    """``1 parameter was never written ...``, ``7 parameters were ...``: the verbs agree with the count."""
    return f"{n} {noun} was {one}" if n == 1 else f"{n} {noun}s were {many}"


def check_weights(weights: Weights) -> list[Finding]:
    findings: list[Finding] = []
    renames = rename_map(weights.ignored, weights.missing)
    rename_fix = None
    if renames:
        pairs = "; ".join(f"{src}.* -> {dst}.*" if dst else f"{src}.* -> (no prefix)" for src, dst in renames.items())
        # Where only old SGLang releases drop the names, upgrading is the other fix (the
        # loader map is then SGLang's own, since 0.5.14).
        upgrade = layer_rename_note(renames)
        rename_fix = f"rename the checkpoint keys {pairs}" + (f", or {upgrade}" if upgrade else " (or map them in the loader)")
    for code, names, key, what in (
        (
            "weights_dropped",
            weights.ignored,
            "dropped",
            _said(len(weights.ignored), "checkpoint tensor", "ignored by the loader", "ignored by the loader"),
        ),
        (
            "weights_missing",
            weights.missing,
            "missing",
            _said(
                len(weights.missing),
                "parameter",
                "never written and keeps its initial value",
                "never written and keep their initial values",
            ),
        ),
    ):
        if not names:
            continue
        groups = group_by_prefix(names)
        fix = rename_fix or _unpaired_fix(code, names)
        findings.append(
            finding(
                code,
                f"{what}: {_listing(names, SEEN_NAMES)}",
                module=weights.module,
                evidence={key: names, "by_prefix": {k: len(v) for k, v in groups.items()}, "rename_map": renames},
                fix=fix,
                source="checks.weights",
            )
        )
    return findings


def _unpaired_fix(code: str, names: list[str]) -> str:
    """The fix for tensors (or parameters) no rename pairs with the other side."""
    if code == "weights_dropped":
        return f"map {_listing(names)} to the draft's parameter names in the loader, or delete them from the checkpoint"
    heads = [n for n in names if n.split(".")[-2:-1] == ["lm_head"]]
    if heads:
        rest = [n for n in names if n not in heads]
        also = f", and {_listing(rest)}" if rest else ""
        return (
            f"add the trained lm_head.weight{also} to the checkpoint, or drop draft_vocab_size from config.json so "
            "the engine takes the target's head"
        )
    return f"add the trained {_listing(names)} to the checkpoint under these names"


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
            fix=f"save the trainer's d2t ({draft_vocab} int64 entries: target id - draft id) with the draft checkpoint",
            source=source,
        )
    ]

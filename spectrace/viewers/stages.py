"""Which calls make each stage of the EAGLE-3 data path: by role, or guessed from names.

The roles (``Call.role``, decided from the module tree when the hook was attached, named in
:mod:`spectrace.rules.roles`) make each stage. Traces written before roles existed carry
none: for them the stages fall back to suffix globs over names (``ROLE_PATTERNS``; roots
differ: ``draft.model.fc``, ``model.fc``, ``fc``) and the draft is guessed from its names
(:func:`guess_draft_calls`).
"""

from __future__ import annotations

from collections.abc import Iterable

from spectrace.records import Call
from spectrace.rules.roles import (
    DRAFT_FC,
    DRAFT_LAYER,
    DRAFT_LM_HEAD,
    DRAFT_NORM,
    TARGET_AUX_CONCAT,
    TARGET_LM_HEAD,
    is_draft_role,
)

from .parts import name_matches

STAGE_ROLES: dict[str, tuple[str, ...]] = {
    "aux": (TARGET_AUX_CONCAT,),
    "fc": (DRAFT_FC,),
    "layer": (DRAFT_LAYER,),
    "norm": (DRAFT_NORM,),
    "lm_head": (DRAFT_LM_HEAD,),
    "target_lm_head": (TARGET_LM_HEAD,),
}
ROLE_PATTERNS: dict[str, tuple[str, ...]] = {
    "aux": ("*aux_concat*", "*aux_hidden*"),
    "fc": ("fc",),
    "layer": ("layers.0", "midlayer"),
    "norm": ("norm",),
    "lm_head": ("lm_head",),
}
_DRAFT_WORDS = ("draft", "eagle")


def _is_draftish(c: Call) -> bool:
    text = f"{c.root} {c.module} {c.module_type}".lower()
    return any(w in text for w in _DRAFT_WORDS)


def guess_draft_calls(calls: list[Call]) -> list[Call]:
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


def is_eagle3_role(role: str) -> bool:
    """A role only an EAGLE-3 pair has: the draft's, or the target's aux concat."""
    return is_draft_role(role) or role == TARGET_AUX_CONCAT


def legacy_eagle3(calls: Iterable[Call]) -> bool:
    """A trace without roles holds an EAGLE-3 pair when a name says so: an fc, a midlayer,
    an aux concat, or draft/eagle in a root, name or type. A plain model has none of them."""
    for c in calls:
        if _is_draftish(c) or name_matches(c.module, "fc") or name_matches(c.module, "midlayer"):
            return True
        if any(name_matches(c.module, p) for p in ROLE_PATTERNS["aux"]):
            return True
    return False


def _final_norm_candidate(c: Call) -> bool:
    # Names only: a norm inside the decoder layer is not the final norm (a role says so itself).
    return not name_matches(c.module, "layers.**") and "midlayer" not in c.module


def legacy_role(c: Call, draft: set[int]) -> str | None:
    """The stage of a call in a trace without roles, as the role it would have had."""
    if any(name_matches(c.module, p) for p in ROLE_PATTERNS["aux"]):
        return STAGE_ROLES["aux"][0]
    if id(c) not in draft:
        return None
    for stage in ("fc", "layer", "norm", "lm_head"):
        if stage == "norm" and not _final_norm_candidate(c):
            continue
        if any(name_matches(c.module, p) for p in ROLE_PATTERNS[stage]):
            return STAGE_ROLES[stage][0]
    return None

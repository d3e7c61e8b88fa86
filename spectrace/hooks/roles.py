"""What a hooked module IS in the EAGLE-3 data path: its role, like a named hook point.

A role is decided once, when the hook is attached, from the module tree (never from
"draft"/"eagle" in a name) and travels in every ``call`` record (``Call.role``), so the
viewer and the checks need not guess which ``lm_head`` is the draft's.

A root (or one of its children, e.g. SGLang's ``LlamaForCausalLMEagle3.model``) is a
*draft body* when it has an ``fc`` projection whose input is 2-3x its hidden size and a
single decoder layer (``midlayer``, or ``layers`` of length 1). Every other root is a
target: its decoder stack is the ``layers`` list beside a token embedding.

    >>> role_of(draft, "model.fc", draft.model.fc)
    'draft.fc'
    >>> role_of(target, "model.model.layers.3", target.model.model.layers[3])
    'target.layer[3]'
    >>> role_of(target, "model.model.layers.3.mlp", target.model.model.layers[3].mlp) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

# The names and the torch-free rules live in rules/ (the checks and the viewers read them
# there); this module keeps only the walk over an nn.Module tree.
from ..rules.roles import (
    DRAFT_EMBED,
    DRAFT_FC,
    DRAFT_HIDDEN_NORM,
    DRAFT_LAYER,
    DRAFT_LM_HEAD,
    DRAFT_NORM,
    EMBED_ATTRS,
    STACK_ATTRS,
    TARGET_AUX_CONCAT,
    TARGET_EMBED,
    TARGET_LM_HEAD,
    TARGET_NORM,
    config_sizes,
    draft_role,
    fuses_hidden_states,
    linear_dims,
    side_of_hint,
    target_body_role,
    target_layer,
    target_leaf_role,
)

__all__ = [
    "DRAFT_EMBED",
    "DRAFT_FC",
    "DRAFT_HIDDEN_NORM",
    "DRAFT_LAYER",
    "DRAFT_LM_HEAD",
    "DRAFT_NORM",
    "TARGET_AUX_CONCAT",
    "TARGET_EMBED",
    "TARGET_LM_HEAD",
    "TARGET_NORM",
    "role_of",
    "target_layer",
]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def role_of(root: nn.Module, name: str, module: nn.Module, hint: str | None = None) -> str | None:
    """The role of ``module``, found at the dotted ``name`` under ``root``; None for any
    other module (a layer's attention, an MLP, a name that does not lead to ``module``).

    ``hint`` is the root's key in a ``{"target": ..., "draft": ...}`` mapping: a key that
    is literally ``draft`` or ``target`` (any case) decides the side whatever the tree
    looks like (a draft whose fc is the wrong width is still the draft); any other key is
    ignored and the tree decides.
    """
    parts = name.split(".") if name else []
    path = _path(root, parts)
    if path is None or path[-1] is not module or not parts:
        return None
    side = side_of_hint(hint)
    if side != "target":
        for depth, node in enumerate(path[:-1]):
            body = _draft_body(node, path[: depth + 1], loose=side == "draft" and depth == 0)
            if body is not None:
                return draft_role(parts[depth:], body)
        if side == "draft":
            return None
    return _target_role(parts, path)


# ------------------------------------------------------------------------------ helpers
def _path(root: nn.Module, parts: Sequence[str]) -> list[nn.Module] | None:
    """``root`` and every module on the way down ``parts``; None where a part is missing."""
    out = [root]
    node: Any = root
    for part in parts:
        node = getattr(node, "_modules", {}).get(part)
        if node is None:
            return None
        out.append(node)
    return out


def _draft_body(node: nn.Module, ancestors: Sequence[nn.Module], loose: bool) -> str | None:
    """The name of the draft body at ``node``: "" for ``node`` itself, a child's name, or None."""
    if isinstance(node, _CONTAINERS):
        return None  # a list of layers or experts holds no draft (and may hold hundreds)
    if _is_draft_body(node, ancestors, loose):
        return ""
    for child_name, child in node._modules.items():
        if child is not None and _is_draft_body(child, [*ancestors, child], loose):
            return child_name
    return None


def _is_draft_body(node: nn.Module, ancestors: Sequence[nn.Module], loose: bool) -> bool:
    children = node._modules
    fc = children.get("fc")
    if loose:
        return fc is not None or children.get("midlayer") is not None
    if fc is None or _single_layer(node) is None:
        return False
    dims = linear_dims(fc)
    if dims is None:
        return False
    width_in, width_out = dims
    return fuses_hidden_states(width_in, {width_out, *config_sizes(ancestors)})


def _single_layer(node: nn.Module) -> nn.Module | None:
    """The draft's one decoder layer: ``midlayer``, or ``layers`` holding exactly one."""
    mid = node._modules.get("midlayer")
    if mid is not None:
        return mid
    layers = node._modules.get("layers")
    if isinstance(layers, (nn.ModuleList, nn.Sequential)) and len(layers) == 1:
        return layers[0]
    return None


def _target_role(parts: Sequence[str], path: Sequence[nn.Module]) -> str | None:
    # The deepest language-model body on the path: a decoder stack beside a token embedding.
    for depth in range(len(path) - 2, -1, -1):
        if _is_lm_body(path[depth]):
            role = target_body_role(parts[depth:])
            if role is not None:
                return role
            break
    return target_leaf_role(parts[-1])


def _is_lm_body(node: nn.Module) -> bool:
    children = node._modules
    return any(isinstance(children.get(s), (nn.ModuleList, nn.Sequential)) for s in STACK_ATTRS) and any(
        children.get(e) is not None for e in EMBED_ATTRS
    )

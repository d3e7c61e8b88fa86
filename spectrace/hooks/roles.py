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

TARGET_EMBED = "target.embed"
TARGET_NORM = "target.norm"
TARGET_LM_HEAD = "target.lm_head"
TARGET_AUX_CONCAT = "target.aux_concat"
DRAFT_EMBED = "draft.embed"
DRAFT_FC = "draft.fc"
DRAFT_LAYER = "draft.layer"
DRAFT_HIDDEN_NORM = "draft.hidden_norm"
DRAFT_NORM = "draft.norm"
DRAFT_LM_HEAD = "draft.lm_head"


def target_layer(index: int) -> str:
    """The role of the target's decoder layer ``index``: ``target.layer[3]``."""
    return f"target.layer[{index}]"


# Attribute names, Hugging Face first (Llama, DeepSeek, Qwen, Mistral and SGLang's ports of
# them), then the GPT-2 / NeoX / Falcon spellings.
_EMBEDS = ("embed_tokens", "wte", "embed_in", "word_embeddings")
_STACKS = ("layers", "h")
_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
_HINTS = ("draft", "target")
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
_DRAFT_INNER: dict[tuple[str, ...], str] = {
    ("embed_tokens",): DRAFT_EMBED,
    ("fc",): DRAFT_FC,
    ("midlayer",): DRAFT_LAYER,
    ("layers", "0"): DRAFT_LAYER,
    ("midlayer", "hidden_norm"): DRAFT_HIDDEN_NORM,
    ("layers", "0", "hidden_norm"): DRAFT_HIDDEN_NORM,
    ("norm",): DRAFT_NORM,
    ("lm_head",): DRAFT_LM_HEAD,
}


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
    side = hint.lower() if isinstance(hint, str) and hint.lower() in _HINTS else None
    if side != "target":
        for depth, node in enumerate(path[:-1]):
            body = _draft_body(node, path[: depth + 1], loose=side == "draft" and depth == 0)
            if body is not None:
                return _draft_role(parts[depth:], body)
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
    dims = _linear_dims(fc)
    if dims is None:
        return False
    width_in, width_out = dims
    hidden = {width_out, *_config_sizes(ancestors)}
    return any(h > 0 and width_in % h == 0 and 2 <= width_in // h <= 3 for h in hidden)


def _single_layer(node: nn.Module) -> nn.Module | None:
    """The draft's one decoder layer: ``midlayer``, or ``layers`` holding exactly one."""
    mid = node._modules.get("midlayer")
    if mid is not None:
        return mid
    layers = node._modules.get("layers")
    if isinstance(layers, (nn.ModuleList, nn.Sequential)) and len(layers) == 1:
        return layers[0]
    return None


def _linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a projection: torch's Linear, SGLang/vLLM linears, or a 2-D weight."""
    for a, b in (("in_features", "out_features"), ("input_size", "output_size")):
        width_in, width_out = getattr(module, a, None), getattr(module, b, None)
        if isinstance(width_in, int) and isinstance(width_out, int):
            return width_in, width_out
    weight = getattr(module, "weight", None)
    shape = getattr(weight, "shape", None)
    if shape is not None and len(shape) == 2:
        return int(shape[1]), int(shape[0])
    return None


def _config_sizes(modules: Sequence[nn.Module]) -> list[int]:
    sizes = []
    for module in modules:
        config = getattr(module, "config", None)
        for attr in ("hidden_size", "target_hidden_size"):
            value = getattr(config, attr, None)
            if isinstance(value, int):
                sizes.append(value)
    return sizes


def _draft_role(rel: Sequence[str], body: str) -> str | None:
    """A draft module's role from its name below the draft's root (``body``: the body's
    name there, "" when the root is the body)."""
    rel = tuple(rel)
    if body and rel[:1] == (body,):
        return _DRAFT_INNER.get(rel[1:])
    if not body:
        return _DRAFT_INNER.get(rel)
    return DRAFT_LM_HEAD if rel == ("lm_head",) else None  # beside the body, like SGLang's


def _target_role(parts: Sequence[str], path: Sequence[nn.Module]) -> str | None:
    # The deepest language-model body on the path: a decoder stack beside a token embedding.
    for depth in range(len(path) - 2, -1, -1):
        if _is_lm_body(path[depth]):
            rel = tuple(parts[depth:])
            if len(rel) == 2 and rel[0] in _STACKS and rel[1].isdigit():
                return target_layer(int(rel[1]))
            if len(rel) == 1 and rel[0] in _EMBEDS:
                return TARGET_EMBED
            if len(rel) == 1 and rel[0] in _NORMS:
                return TARGET_NORM
            break
    last = parts[-1]
    if last == "lm_head":
        return TARGET_LM_HEAD
    if last == "aux_concat":
        return TARGET_AUX_CONCAT
    return None


def _is_lm_body(node: nn.Module) -> bool:
    children = node._modules
    return any(isinstance(children.get(s), (nn.ModuleList, nn.Sequential)) for s in _STACKS) and any(
        children.get(e) is not None for e in _EMBEDS
    )

"""The roles of the EAGLE-3 data path: their names and the rules that read them.

A role is decided once, when a hook is attached (:mod:`spectrace.hooks.roles` walks the
module tree), and travels in every ``call`` record (``Call.role``). The hooks, the checks
and the viewers all read the same names from here, so none of them re-spells a role, and
none needs torch to do so.

    >>> target_layer(3), layer_of_role("target.layer[3]"), boundary_role(4)
    ('target.layer[3]', 3, 'target.layer[3]')
    >>> boundary_of_role(TARGET_EMBED), boundary_of_role("target.layer[3]"), boundary_of_role(DRAFT_FC)
    (0, 4, None)
    >>> draft_role(("model", "fc"), "model"), target_body_role(("layers", "3"))
    ('draft.fc', 'target.layer[3]')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

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

DRAFT_PREFIX = "draft."
TARGET_PREFIX = "target."

# Attribute names, Hugging Face first (Llama, DeepSeek, Qwen, Mistral and SGLang's ports of
# them), then the GPT-2 / NeoX / Falcon spellings.
EMBED_ATTRS = ("embed_tokens", "wte", "embed_in", "word_embeddings")
STACK_ATTRS = ("layers", "h")
NORM_ATTRS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
# The keys of a ``{"target": ..., "draft": ...}`` mapping that decide a root's side.
SIDE_HINTS = ("draft", "target")
# A draft module's role by its name below the draft body.
DRAFT_INNER: dict[tuple[str, ...], str] = {
    ("embed_tokens",): DRAFT_EMBED,
    ("fc",): DRAFT_FC,
    ("midlayer",): DRAFT_LAYER,
    ("layers", "0"): DRAFT_LAYER,
    ("midlayer", "hidden_norm"): DRAFT_HIDDEN_NORM,
    ("layers", "0", "hidden_norm"): DRAFT_HIDDEN_NORM,
    ("norm",): DRAFT_NORM,
    ("lm_head",): DRAFT_LM_HEAD,
}

_LAYER_ROLE = re.compile(r"^target\.layer\[(\d+)\]$")


def target_layer(index: int) -> str:
    """The role of the target's decoder layer ``index``: ``target.layer[3]``."""
    return f"target.layer[{index}]"


def layer_of_role(role: str | None) -> int | None:
    """The layer index of a ``target.layer[k]`` role, else None."""
    m = _LAYER_ROLE.match(role) if role else None
    return int(m.group(1)) if m else None


def boundary_of_role(role: str | None) -> int | None:
    """The residual-stream boundary a target role measures (Hugging Face ``hidden_states``
    numbering): 0 for ``target.embed``, k+1 for ``target.layer[k]``, else None."""
    if role == TARGET_EMBED:
        return 0
    k = layer_of_role(role)
    return None if k is None else k + 1


def boundary_role(boundary: int) -> str:
    """The role whose output is ``boundary``: ``target.embed`` for 0, ``target.layer[b-1]`` else."""
    return TARGET_EMBED if boundary == 0 else target_layer(boundary - 1)


def is_draft_role(role: str | None) -> bool:
    return role is not None and role.startswith(DRAFT_PREFIX)


def is_target_role(role: str | None) -> bool:
    return role is not None and role.startswith(TARGET_PREFIX)


def side_of_hint(hint: object) -> str | None:
    """``draft`` or ``target`` when a root's key says so (any case), else None. A second
    pair adopted in one process is ``draft#2``: still the draft."""
    if not isinstance(hint, str):
        return None
    side = hint.lower().split("#", 1)[0]
    return side if side in SIDE_HINTS else None


def draft_role(rel: Sequence[str], body: str) -> str | None:
    """A draft module's role from its name below the draft's root (``body``: the body's
    name there, "" when the root is the body)."""
    rel = tuple(rel)
    if body and rel[:1] == (body,):
        return DRAFT_INNER.get(rel[1:])
    if not body:
        return DRAFT_INNER.get(rel)
    return DRAFT_LM_HEAD if rel == ("lm_head",) else None  # beside the body, like SGLang's


def target_body_role(rel: Sequence[str]) -> str | None:
    """A target module's role from its name below the language-model body (the decoder
    stack beside the token embedding): a layer, the embedding or the final norm."""
    if len(rel) == 2 and rel[0] in STACK_ATTRS and rel[1].isdigit():
        return target_layer(int(rel[1]))
    if len(rel) == 1 and rel[0] in EMBED_ATTRS:
        return TARGET_EMBED
    if len(rel) == 1 and rel[0] in NORM_ATTRS:
        return TARGET_NORM
    return None


def target_leaf_role(last: str) -> str | None:
    """A target module's role from its own name alone (outside the body): the LM head or
    the aux concat."""
    if last == "lm_head":
        return TARGET_LM_HEAD
    if last == "aux_concat":
        return TARGET_AUX_CONCAT
    return None


def linear_dims(module: Any) -> tuple[int, int] | None:
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


def config_sizes(modules: Iterable[Any]) -> list[int]:
    """The hidden sizes the modules' configs name (``hidden_size``, ``target_hidden_size``)."""
    sizes = []
    for module in modules:
        config = getattr(module, "config", None)
        for attr in ("hidden_size", "target_hidden_size"):
            value = getattr(config, attr, None)
            if isinstance(value, int):
                sizes.append(value)
    return sizes


def fuses_hidden_states(width_in: int, hidden: Iterable[int]) -> bool:
    """Whether a projection ``width_in`` wide fuses 2-3 hidden states of one of ``hidden``:
    what makes an ``fc`` an EAGLE-3 draft's."""
    return any(h > 0 and width_in % h == 0 and 2 <= width_in // h <= 3 for h in hidden)


__all__ = [
    "DRAFT_EMBED",
    "DRAFT_FC",
    "DRAFT_HIDDEN_NORM",
    "DRAFT_INNER",
    "DRAFT_LAYER",
    "DRAFT_LM_HEAD",
    "DRAFT_NORM",
    "DRAFT_PREFIX",
    "EMBED_ATTRS",
    "NORM_ATTRS",
    "SIDE_HINTS",
    "STACK_ATTRS",
    "TARGET_AUX_CONCAT",
    "TARGET_EMBED",
    "TARGET_LM_HEAD",
    "TARGET_NORM",
    "TARGET_PREFIX",
    "boundary_of_role",
    "boundary_role",
    "config_sizes",
    "draft_role",
    "fuses_hidden_states",
    "is_draft_role",
    "is_target_role",
    "layer_of_role",
    "linear_dims",
    "side_of_hint",
    "target_body_role",
    "target_layer",
    "target_leaf_role",
]

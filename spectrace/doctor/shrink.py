"""A model config shrunk to tiny widths, every structural key kept.

What the engine decides from a config (the class it builds, the layers the target
captures under which id rule, the rotary of each attention, the flags a class reads, the
vocabulary map) depends on the layer count, the capture ids, the rotary keys, the norm
flags and the architectures, not on the widths. So the widths go down and nothing else
moves: hidden size, heads, head and intermediate sizes, expert counts, the low ranks of
MLA. The vocabularies stay as they are: at a hidden size of 64 a full vocabulary costs a
few megabytes, and the draft's trained vocabulary map (``d2t``, ``t2d``) is only
meaningful against the real sizes. Quantization is dropped (the CPU build runs float32).

    >>> tiny = shrink_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
    ...                       "num_key_value_heads": 8, "num_hidden_layers": 32, "rope_theta": 500000.0})
    >>> tiny["hidden_size"], tiny["num_attention_heads"], tiny["num_key_value_heads"], tiny["num_hidden_layers"], tiny["rope_theta"]
    (64, 4, 2, 32, 500000.0)

Torch-free: the doctor's engine runs read the result.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

HIDDEN = 64
HEADS = 4
HEAD_DIM = 16
INTERMEDIATE = 128
MOE_INTERMEDIATE = 32
EXPERTS = 8
EXPERTS_PER_TOKEN = 2
# DeepSeek's multi-head latent attention: the ranks and head parts, tiny.
MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}

# Keys whose value is a width: each becomes the tiny width of its kind.
_WIDTHS = {
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "moe_intermediate_size": MOE_INTERMEDIATE,
    "shared_expert_intermediate_size": MOE_INTERMEDIATE,
    "head_dim": HEAD_DIM,
}
# Keys whose value counts experts (every model family names them its own way).
_EXPERT_COUNTS = ("n_routed_experts", "num_experts", "num_local_experts")
_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "moe_topk")
# Nested configs that hold a model of their own (a multimodal target's text model, a
# speculators draft's layer config, a vision tower): shrunk by the same rules.
_NESTED = ("text_config", "transformer_layer_config", "vision_config", "language_config")
# Keys dropped: the CPU build cannot run the checkpoint's quantization.
_DROPPED = ("quantization_config", "compression_config")


def _kv_heads(heads: int, kv: int) -> int:
    """The tiny key/value head count: as many as the heads when the model has no grouping,
    one when it has one shared head, a group of two otherwise."""
    if kv >= heads:
        return HEADS
    return 1 if kv <= 1 else HEADS // 2


def _draft_hidden(draft_hidden: int, target_hidden: int | None) -> int:
    """A draft as wide as its target stays as wide as the tiny target; another width keeps its ratio."""
    if not target_hidden or draft_hidden == target_hidden:
        return HIDDEN
    return max(HEADS * 8, round(HIDDEN * draft_hidden / target_hidden / HEADS) * HEADS)


def _shrink_level(d: dict[str, Any], target_hidden: int | None) -> None:
    full_hidden = d.get("hidden_size")
    for key, tiny in _WIDTHS.items():
        if isinstance(d.get(key), int):
            d[key] = tiny
    if isinstance(full_hidden, int) and target_hidden is not None:
        d["hidden_size"] = _draft_hidden(full_hidden, target_hidden)
    if isinstance(d.get("target_hidden_size"), int):
        d["target_hidden_size"] = HIDDEN  # the draft reads the tiny target's width
    heads, kv = d.get("num_attention_heads"), d.get("num_key_value_heads")
    if isinstance(heads, int):
        d["num_attention_heads"] = HEADS
        if isinstance(kv, int):
            d["num_key_value_heads"] = _kv_heads(heads, kv)
    for key, tiny in MLA.items():
        if isinstance(d.get(key), int):
            d[key] = tiny
    experts = next((d[k] for k in _EXPERT_COUNTS if isinstance(d.get(k), int)), None)
    for key in _EXPERT_COUNTS:
        if isinstance(d.get(key), int):
            d[key] = min(EXPERTS, d[key])
    for key in _PER_TOKEN:
        if isinstance(d.get(key), int):
            d[key] = min(EXPERTS_PER_TOKEN, d[key])
    if isinstance(d.get("n_shared_experts"), int):
        d["n_shared_experts"] = min(1, d["n_shared_experts"])
    if isinstance(d.get("n_group"), int) and experts is not None:
        # Grouped routing: the groups must divide the (tiny) experts; one group is picked.
        d["n_group"] = min(2, d["n_group"])
        if isinstance(d.get("topk_group"), int):
            d["topk_group"] = 1
    for key in _DROPPED:
        d.pop(key, None)


def shrink_config(config: Mapping[str, Any], *, target_hidden: int | None = None) -> dict[str, Any]:
    """A deep copy of ``config`` at tiny widths. ``target_hidden``: for a draft, its target's
    full hidden size (a draft narrower or wider than its target keeps that ratio)."""
    out = copy.deepcopy(dict(config))
    _shrink_level(out, target_hidden)
    for key in _NESTED:
        nested = out.get(key)
        if isinstance(nested, dict):
            _shrink_level(nested, target_hidden)
    return out


def width_map(full: Mapping[str, Any], tiny: Mapping[str, Any]) -> dict[int, int]:
    """Each full width of ``full`` and its tiny value in ``tiny``, for a tensor the doctor
    cannot place in the engine's model (a name the loader will drop): its shape still shrinks.
    Where two widths of the full config are equal, the first listed wins."""
    out: dict[int, int] = {}

    def put(a: Any, b: Any) -> None:
        if isinstance(a, int) and isinstance(b, int) and a > 0 and a not in out:
            out[a] = b

    hidden, tiny_hidden = full.get("hidden_size"), tiny.get("hidden_size")
    put(hidden, tiny_hidden)
    put(full.get("target_hidden_size"), tiny.get("target_hidden_size"))
    for key in ("intermediate_size", "moe_intermediate_size", *MLA):
        put(full.get(key), tiny.get(key))
    heads, kv, head_dim = full.get("num_attention_heads"), full.get("num_key_value_heads"), full.get("head_dim")
    t_heads, t_kv, t_head_dim = tiny.get("num_attention_heads"), tiny.get("num_key_value_heads"), tiny.get("head_dim")
    if isinstance(heads, int) and isinstance(hidden, int) and isinstance(t_heads, int) and isinstance(tiny_hidden, int):
        head_dim = head_dim if isinstance(head_dim, int) else hidden // heads
        t_head_dim = t_head_dim if isinstance(t_head_dim, int) else tiny_hidden // t_heads
        put(heads * head_dim, t_heads * t_head_dim)
        if isinstance(kv, int) and isinstance(t_kv, int):
            put(kv * head_dim, t_kv * t_head_dim)
    if isinstance(hidden, int) and isinstance(tiny_hidden, int):
        for n in (2, 3, 4, 5):  # the draft's first layer reads 2x, fc reads one hidden per captured layer
            put(n * hidden, n * tiny_hidden)
    return out

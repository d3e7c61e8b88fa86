"""The rotary embeddings a built model really uses, read from its modules.

Both engines build a rotary module per attention (SGLang's and vLLM's ``RotaryEmbedding``
and its scaling subclasses) with the same attributes: ``base``, ``rotary_dim``,
``head_size``, ``is_neox_style``, a ``scaling_factor`` (or ``scaling_factors``) for the
scaled kinds, and the ``cos_sin_cache`` the attention reads. What the config says is
only what the engine was asked for; these are what every position is rotated with. A
few rows of the cache are kept too, so two rotaries that agree on every attribute but
rotate differently (a llama3 ``low_freq_factor``) still compare as different.

Tensor methods only: this package stays free of torch imports. Read once, at load time.
"""

from __future__ import annotations

from typing import Any

from ...checks.rope import LiveRotary

# The class each engine builds for a scaling type (SGLang 0.5.23 layers/rotary_embedding/
# factory.py::get_rope; vLLM 0.32 model_executor/layers/rotary_embedding uses the same names).
SCALING_OF_CLASS = {
    "RotaryEmbedding": "default",
    "LinearScalingRotaryEmbedding": "linear",
    "DynamicNTKScalingRotaryEmbedding": "dynamic",
    "DynamicNTKAlphaRotaryEmbedding": "dynamic",
    "YaRNScalingRotaryEmbedding": "yarn",
    "DeepseekScalingRotaryEmbedding": "deepseek_yarn",
    "Llama3RotaryEmbedding": "llama3",
    "Phi3LongRoPEScaledRotaryEmbedding": "longrope",
    "MRotaryEmbedding": "default",
    "YaRNScalingMRotaryEmbedding": "yarn",
}
# Positions whose cos/sin rows are kept (cut to the cache's length): near and far ones,
# where a base or scaling difference shows most.
SAMPLE_POSITIONS = (1, 7, 63, 511, 4095)
# Rotaries of a vision tower rotate image patches, not the text positions the draft sees.
_NOT_TEXT = ("vision", "visual", "vit.", "image")


def _is_rotary(module: Any) -> bool:
    return all(hasattr(module, a) for a in ("base", "rotary_dim", "is_neox_style"))


def _factor(module: Any) -> float | None:
    value = getattr(module, "scaling_factor", None)
    if value is None:
        many = getattr(module, "scaling_factors", None)
        value = many[0] if isinstance(many, (list, tuple)) and len(many) == 1 else None
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _cache_rows(module: Any) -> tuple[list[int], list[list[float]]]:
    """The cos/sin rows at :data:`SAMPLE_POSITIONS` (one small host read); empty when unreadable."""
    cache = getattr(module, "cos_sin_cache", None)
    try:
        if cache is None or cache.is_meta or cache.dim() != 2:
            return [], []
        positions = [p for p in SAMPLE_POSITIONS if p < cache.shape[0]]
        if not positions:
            return [], []
        index = cache.new_zeros(0).long().new_tensor(positions)
        return positions, cache.detach()[index].double().cpu().tolist()
    except Exception:  # a cache in an odd layout: the attributes still compare
        return [], []


def read_rotary(name: str, module: Any) -> LiveRotary:
    cls = type(module).__name__
    positions, rows = _cache_rows(module)
    head = getattr(module, "head_size", None)
    return LiveRotary(
        module=name,
        cls=cls,
        base=float(module.base),
        rope_type=SCALING_OF_CLASS.get(cls, cls),
        factor=_factor(module),
        rotary_dim=int(module.rotary_dim),
        head_size=int(head) if isinstance(head, int) else None,
        neox=bool(module.is_neox_style),
        positions=positions,
        cos_sin=rows,
    )


def live_rotaries(model: Any) -> list[LiveRotary]:
    """Each distinct text rotary of ``model`` (SGLang caches one object per set of parameters,
    so a target's layers usually share one), in module order."""
    out: list[LiveRotary] = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in seen or not _is_rotary(module) or any(s in name.lower() for s in _NOT_TEXT):
            continue
        seen.add(id(module))
        try:
            out.append(read_rotary(name, module))
        except (TypeError, ValueError):
            continue  # a module with these names that is not a rotary embedding
    return out

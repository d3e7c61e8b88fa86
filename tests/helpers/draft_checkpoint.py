"""A trained EAGLE-3 draft's tensors as the trainers save them, for an engine's fused parameters.

vLLM and SGLang both fuse q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``; the
trainers' checkpoints hold them apart. Each harness names the rest of its engine's
parameters itself (SGLang's ``midlayer.`` prefix, vLLM's none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def unfused(name: str, shape: Sequence[int], g: Any, q_rows: int, kv_rows: int) -> dict[str, Any] | None:
    """The separate random tensors (std 0.02, drawn from ``g`` in q, k, v / gate, up order) for
    the fused parameter ``name`` of ``shape``; None for a parameter that is not fused."""
    import torch

    if ".qkv_proj." in name:
        parts = (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows))
        return {name.replace("qkv_proj", part): torch.randn(rows, shape[1], generator=g) * 0.02 for part, rows in parts}
    if ".gate_up_proj." in name:
        half = shape[0] // 2
        return {name.replace("gate_up_proj", part): torch.randn(half, shape[1], generator=g) * 0.02 for part in ("gate_proj", "up_proj")}
    return None

"""Layer-id conventions: who means what by "capture layer k".

Canonical index **b** is Hugging Face ``hidden_states[b]``: b=0 is the embedding output,
b=k the output of block k-1 (the input of block k). Every capture list spectrace reports
is in boundaries, so ids written under different conventions can be compared.

    >>> engine_boundaries([2, 30, 58], "sglang_deepseek_old", 61).boundaries
    [3, 31, 59]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

Convention = Literal[
    "speculators",  # speculators / vLLM: id k is boundary k (0 = embedding)
    "specforge",  # SpecForge: id k is the output of block k, boundary k+1
    "sglang_llama",  # SGLang Llama target: boundary k+1, -1 = embedding, ids past the end dropped silently
    "sglang_deepseek_old",  # SGLang DeepSeek before 0.5.23: always +1
    "sglang_deepseek",  # SGLang DeepSeek 0.5.23: +1 only when the first id is 1, otherwise literal
]
CONVENTIONS: tuple[str, ...] = (
    "speculators",
    "specforge",
    "sglang_llama",
    "sglang_deepseek_old",
    "sglang_deepseek",
)
TRAINER_CONVENTIONS: tuple[str, ...] = ("speculators", "specforge")


@dataclass(frozen=True)
class CaptureResult:
    """The boundaries an engine really captures for the ids it was given."""

    ids: list[int]
    boundaries: list[int]
    convention: str
    num_layers: int
    dropped_ids: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def short(self) -> bool:
        return len(self.boundaries) < len(self.ids)


def trainer_boundaries(ids: Sequence[int], convention: str) -> list[int]:
    """Boundaries a trainer means by ``ids`` (what the draft was trained on)."""
    if convention == "speculators":
        return [int(i) for i in ids]
    if convention == "specforge":
        return [int(i) + 1 for i in ids]
    raise ValueError(f"{convention!r} is not a trainer convention ({', '.join(TRAINER_CONVENTIONS)})")


def engine_boundaries(ids: Sequence[int], convention: str, num_layers: int) -> CaptureResult:
    """Boundaries a serving engine captures for ``ids`` on an ``num_layers`` target.

    Mirrors the engines' own loops: SGLang captures the residual stream entering layer
    i for each i in its (shifted) set, walking layers in order, so the result is sorted,
    de-duplicated, and an i outside ``[0, num_layers)`` is never reached.
    """
    ids = [int(i) for i in ids]
    if convention in TRAINER_CONVENTIONS:
        wanted = trainer_boundaries(ids, convention)
        kept = [b for b in wanted if 0 <= b <= num_layers]
        dropped = [i for i, b in zip(ids, wanted) if not 0 <= b <= num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped)
    if convention in ("sglang_llama", "sglang_deepseek_old"):
        shifted = {i + 1 for i in ids}
        kept = [b for b in range(num_layers) if b in shifted]
        dropped = [i for i in ids if not 0 <= i + 1 < num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped)
    if convention == "sglang_deepseek":
        shift = 1 if ids and ids[0] == 1 else 0
        wanted = {i + shift for i in ids}
        kept = [b for b in range(num_layers) if b in wanted]
        error = None
        if len(kept) != len(ids):
            error = f"captured {len(kept)} of {len(ids)} aux hidden states"
        dropped = [i for i in ids if not 0 <= i + shift < num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped, error)
    raise ValueError(f"unknown convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def default_ids(convention: str, num_layers: int) -> list[int]:
    """The ids a trainer or engine uses when none are configured."""
    n = num_layers
    if convention == "specforge":
        return [1, n // 2 - 1, n - 4]
    # speculators, vLLM and SGLang (taken literally) all write [2, n//2, n-3].
    return [2, n // 2, n - 3]


def engine_rule(architecture: str, sglang_version: str | None = None) -> str:
    """The capture convention SGLang applies for a target architecture."""
    arch = architecture.lower()
    if "deepseek" in arch or "kimi" in arch:
        if sglang_version is not None and _version_tuple(sglang_version) < (0, 5, 23):
            return "sglang_deepseek_old"
        return "sglang_deepseek"
    return "sglang_llama"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)

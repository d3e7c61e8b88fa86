"""Tensor statistics computed on the tensor's own device, read back in one copy per step.

A hook never calls ``.item()``: :func:`device_stats` returns a small device vector, the
step's vectors are stacked and copied to the host once (non-blocking on CUDA), and
:func:`to_stats` turns each row into a :class:`TensorStats`. A statistic that makes no
sense for a tensor kind (bool, meta, sparse, empty) is simply absent.

    >>> row = device_stats(torch.randn(4, 8), "basic")
    >>> to_stats(row.tolist(), 32).std
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..records import TensorMeta, TensorStats

# Row layout of one statistics vector.
SUM, SUMSQ, ABSMAX, NAN, INF = range(5)
ROW = 5

_FLOAT8 = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
)


def stats_supported(tensor: torch.Tensor) -> bool:
    """Whether statistics mean anything for this tensor (and can be computed safely)."""
    if tensor.is_meta or tensor.numel() == 0 or tensor.dtype == torch.bool:
        return False
    if tensor.layout != torch.strided or tensor.is_quantized:
        return False
    return True


def _as_real(tensor: torch.Tensor) -> torch.Tensor:
    """A view or small copy whose dtype torch reductions accept."""
    if tensor.is_complex():
        return tensor.abs()
    if tensor.dtype in _FLOAT8:
        return tensor.to(torch.float16)
    if not tensor.is_floating_point():
        # Integer tensors (ids, packed int4 in uint8) are small next to activations.
        return tensor.to(torch.float32)
    return tensor


def device_stats(tensor: torch.Tensor, mode: str) -> torch.Tensor:
    """One float32 vector ``[sum, sumsq, absmax, nan, inf]`` on ``tensor``'s device.

    Reductions accumulate in float32 through ``dtype=`` instead of materialising a
    float32 copy of a large bf16 tensor (the logits).
    """
    x = _as_real(tensor.detach())
    total = torch.sum(x, dtype=torch.float32)
    sumsq = torch.linalg.vector_norm(x, 2, dtype=torch.float32).square()
    absmax = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
    if mode == "full" or x.is_floating_point():
        nan = torch.isnan(x).sum(dtype=torch.float32)
        inf = torch.isinf(x).sum(dtype=torch.float32)
    else:
        nan = inf = torch.zeros((), dtype=torch.float32, device=x.device)
    return torch.stack([total, sumsq, absmax, nan, inf])


def to_stats(row: Sequence[float], numel: int) -> TensorStats:
    """Host-side statistics from one row, in float64."""
    total, sumsq, absmax, nan, inf = (float(v) for v in row[:ROW])
    mean = total / numel
    # Population variance from the two sums; clamp the tiny negatives rounding leaves.
    var = max(sumsq / numel - mean * mean, 0.0) if numel > 0 else 0.0
    std = math.sqrt(var) if math.isfinite(var) else var
    return TensorStats(
        mean=_finite_or_none(mean),
        std=_finite_or_none(std),
        absmax=absmax if not math.isnan(absmax) else None,
        nan=int(nan),
        inf=int(inf),
        numel=numel,
    )


def _finite_or_none(value: float) -> float | None:
    # JSON has no NaN; a NaN mean says nothing the nan count does not say better.
    return value if math.isfinite(value) else None


class PendingStats:
    """Device statistics rows of one step, waiting for their single host copy."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []
        self.targets: list[tuple[TensorMeta, int]] = []

    def add(self, meta: TensorMeta, row: torch.Tensor, numel: int) -> None:
        self.rows.append(row)
        self.targets.append((meta, numel))

    def resolve(self) -> None:
        """One stack and one copy per device; fills ``meta.stats`` in place."""
        if not self.rows:
            return
        by_device: dict[torch.device, list[int]] = {}
        for index, row in enumerate(self.rows):
            by_device.setdefault(row.device, []).append(index)
        for indices in by_device.values():
            host = torch.stack([self.rows[i] for i in indices]).to("cpu", torch.float64).tolist()
            for i, values in zip(indices, host):
                meta, numel = self.targets[i]
                meta.stats = to_stats(values, numel)
        self.rows.clear()
        self.targets.clear()

"""The math of tensor statistics: which tensors get them, their row, and the fields it gives.

A hook never calls ``.item()`` on an accelerator: :func:`.readback.device_stats` returns a
small device tensor, the step's tensors are reduced and copied to the host together
(:mod:`.readback`), and :func:`to_stats` turns each row into a :class:`TensorStats`. A
statistic that makes no sense for a tensor kind (bool, meta, sparse, empty, index dtypes;
mean and std of a complex tensor) is simply absent.

Three paths, all giving the same numbers (``[sum, sumsq, absmax, nan, inf]``):

- **CPU** (:func:`cpu_stats`): three fused reductions (sum, dot product, aminmax); the
  NaN/inf counts are only computed when the sum is not finite (a finite sum proves there
  are none), which CPU can test for free because nothing there is asynchronous.
- **CUDA with Triton**: the fused kernel, in :mod:`.fused_stats`, writes per-program
  partial rows that :func:`reduce_rows` and :func:`reduce_partials` combine.
- **Anything else** (no Triton, non-contiguous, float8, integer; :func:`torch_stats`):
  torch reductions with ``dtype=float32`` accumulation.

This module is the math only: it imports neither the kernel nor the read-back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..records import TensorStats

# Row layout of one statistics vector.
SUM, SUMSQ, ABSMAX, NAN, INF = range(5)
ROW = 5

_FLOAT8 = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
)


# Index dtypes hold token ids, positions and id maps: their mean is no statistic, and for
# a one-token decode step it *is* the token id. They get shape and dtype only.
INDEX_DTYPES = frozenset({"int16", "int32", "int64", "uint16", "uint32", "uint64"})


# Sub-byte and bit dtypes: no arithmetic kernels exist for them.
_NO_ARITHMETIC = tuple(
    getattr(torch, name)
    for name in ("float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
                 *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)))
    if hasattr(torch, name)
)  # fmt: skip


def stats_supported(tensor: torch.Tensor) -> bool:
    """Whether statistics mean anything for this tensor (and can be computed safely).

    No for meta, fake and other tensor subclasses, nested, empty, bool, sparse or other
    non-strided, quantized and sub-byte tensors. Integers (int8, packed int4 in uint8),
    float8 and complex are; a trace drops the statistics of index dtypes (see
    :data:`INDEX_DTYPES`) when it fills them in.
    """
    try:
        # A subclass (FakeTensor, DTensor, ...) may trace, fake or communicate on every op.
        if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
            return False
        # (is_meta is the device test for these two types: no torch.device is built.)
        if tensor.is_meta or tensor.is_nested or tensor.layout != torch.strided or tensor.is_quantized:
            return False
        dtype = tensor.dtype
        if dtype == torch.bool or dtype in _NO_ARITHMETIC:
            return False
        return tensor.numel() != 0
    except Exception:  # a tensor subclass that cannot even say this has no statistics
        return False


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


# ------------------------------------------------------------------ one tensor
def cpu_stats(x: torch.Tensor) -> torch.Tensor:
    """Exact float32-accumulated statistics on the CPU (float64 row, no extra passes)."""
    return torch.tensor(cpu_row(x), dtype=torch.float64)


# A CPU float32 tensor up to this many elements may be summarised with others of its size
# in one pass (cpu_rows). The pass copies them, so big ones (a prefill's logits) go alone,
# where the reads cost more than the launches; a group smaller than ROWS_BATCH_MIN too.
ROWS_BATCH_NUMEL = 1 << 16
ROWS_BATCH_MIN = 4


def rows_batchable(x: torch.Tensor) -> bool:
    """Whether :func:`cpu_rows` takes ``x`` (a contiguous CPU float32 tensor, not too big)."""
    return x.dtype is torch.float32 and x.is_contiguous() and x.numel() <= ROWS_BATCH_NUMEL


def cpu_rows(xs: Sequence[torch.Tensor]) -> list[list[float]]:
    """:func:`cpu_row` of several contiguous float32 CPU tensors of one size, in one pass:
    one copy and four reductions for the lot instead of three reductions and as many
    host reads per tensor (about half the time for a decode step's hidden states). The
    sums are float32-accumulated as :func:`cpu_row`'s, in another order: they agree to
    float32 rounding. A row whose sums are not finite is redone by :func:`cpu_row`
    (NaN/inf counted, squares past float32 taken in float64)."""
    stacked = torch.cat([x.view(-1) for x in xs]).view(len(xs), -1)
    totals = stacked.sum(1).tolist()
    squares = torch.linalg.vecdot(stacked, stacked).tolist()
    highs = stacked.amax(1).tolist()
    lows = stacked.amin(1).tolist()
    rows = []
    for x, total, sumsq, high, low in zip(xs, totals, squares, highs, lows):
        if math.isfinite(total) and math.isfinite(sumsq):
            rows.append([total, sumsq, max(-low, high), 0.0, 0.0])
        else:
            rows.append(cpu_row(x))
    return rows


def cpu_row(x: torch.Tensor) -> list[float]:
    """:func:`cpu_stats` as a host list (a traced CPU step keeps it so: no tensor per row,
    no reduction at the step's end). The same numbers: float64 holds each one exactly."""
    if x.dtype is torch.float32 and x.is_contiguous():
        # The common CPU case, without the dtype dispatch below: the same reductions.
        flat = x.view(-1)
        total = torch.sum(flat).item()
        sumsq = torch.dot(flat, flat).item()
        if math.isinf(sumsq) and math.isfinite(total):
            sumsq = float(torch.linalg.vector_norm(x, 2, dtype=torch.float64)) ** 2
        low, high = torch.aminmax(flat)
        absmax = max(-low.item(), high.item())
        if math.isfinite(total):
            return [total, sumsq, absmax, 0.0, 0.0]
        nan = int(torch.isnan(flat).sum())
        return [total, sumsq, math.nan if nan else absmax, float(nan), float(torch.isinf(flat).sum())]
    x = _as_real(x)
    if x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
        flat = x.view(-1)
        total = float(torch.sum(flat))
        sumsq = float(torch.dot(flat, flat))
        if math.isinf(sumsq) and math.isfinite(total):
            # Values above 1.8e19 overflow a float32 square; the norm does not.
            sumsq = float(torch.linalg.vector_norm(x, 2, dtype=torch.float64)) ** 2
    else:
        total = float(torch.sum(x, dtype=torch.float32))
        sumsq = float(torch.linalg.vector_norm(x, 2, dtype=torch.float64)) ** 2
    low, high = torch.aminmax(x)
    absmax = max(-float(low), float(high))
    nan = inf = 0
    if not math.isfinite(total):
        # Only a non-finite sum can hide NaN or inf elements.
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        if nan:
            absmax = math.nan
    return [total, sumsq, absmax, float(nan), float(inf)]


def torch_stats(x: torch.Tensor) -> torch.Tensor:
    """The portable accelerator path: torch reductions accumulating in float32."""
    x = _as_real(x)
    total = torch.sum(x, dtype=torch.float32)
    # Accumulated in float64: squares of activations above 1.8e19 overflow float32.
    sumsq = torch.linalg.vector_norm(x, 2, dtype=torch.float64).square()
    absmax = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
    nan = torch.isnan(x).sum(dtype=torch.float32)
    inf = torch.isinf(x).sum(dtype=torch.float32)
    return torch.stack([total.double(), sumsq, absmax.double(), nan.double(), inf.double()])


# ------------------------------------------------------------- rows -> stats
def reduce_rows(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Combine rows (each ``(5,)`` or ``(P, 5)``, all on one device) into ``(T, 5)`` float64.

    Sums add, absmax takes the max, counts add: a few launches for a whole step.
    """
    if all(r.dim() == 1 for r in rows):
        return torch.stack([r.to(torch.float64) for r in rows])
    if len(rows) == 1 and rows[0].dim() == 3:
        return reduce_partials(rows[0])
    parts = [r.reshape(-1, ROW) for r in rows]
    if len({p.shape[0] for p in parts}) == 1:
        return reduce_partials(torch.stack(parts))
    return torch.cat([reduce_rows([p]) for p in parts])


def reduce_partials(p: torch.Tensor) -> torch.Tensor:
    """``(T, P, 5)`` partial rows (a step buffer) -> ``(T, 5)`` float64, one row per tensor."""
    p = p.to(torch.float64)
    return torch.cat([p[..., :ABSMAX].sum(1), p[..., ABSMAX : ABSMAX + 1].amax(1), p[..., NAN:].sum(1)], dim=-1)


def to_stats(row: Sequence[float], numel: int) -> TensorStats:
    """Host-side statistics from one row, in float64.

    ``absmax`` is None when the tensor holds a NaN (the nan count says so), on every path.
    """
    return TensorStats(**stats_fields(row, numel))


def stats_fields(row: Sequence[float], numel: int) -> dict[str, Any]:
    """The fields of :class:`TensorStats` from one row (what :func:`to_stats` validates)."""
    total, sumsq, absmax, nan, inf = map(float, row[:ROW])
    mean = total / numel
    # Population variance from the two sums; clamp the tiny negatives rounding leaves.
    var = max(sumsq / numel - mean * mean, 0.0) if numel > 0 else 0.0
    std = math.sqrt(var) if math.isfinite(var) else var
    return {
        # (JSON has no NaN; a NaN mean says nothing the nan count does not say better)
        "mean": mean if math.isfinite(mean) else None,
        "std": std if math.isfinite(std) else None,
        "absmax": absmax if not math.isnan(absmax) and nan == 0 else None,
        "nan": int(nan),
        "inf": int(inf),
        "numel": numel,
    }


def stats_for(values: list[float], numel: int, dtype: str) -> dict[str, Any] | None:
    """The recorded statistics fields of one tensor from its row (None for index dtypes)."""
    if dtype in INDEX_DTYPES:
        return None  # ids stay out of the trace (see INDEX_DTYPES)
    stats = stats_fields(values, numel)
    if dtype.startswith("complex"):
        # Rows of a complex tensor describe |z|: absmax is max |z|, but a "mean" of
        # magnitudes would read as the mean of z. Drop it.
        stats["mean"] = stats["std"] = None
    return stats

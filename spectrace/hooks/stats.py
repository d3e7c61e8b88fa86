"""Tensor statistics computed on the tensor's own device, read back in one copy per step.

A hook never calls ``.item()`` on an accelerator: :func:`device_stats` returns a small
device tensor, the step's tensors are reduced and copied to the host together, and
:func:`to_stats` turns each row into a :class:`TensorStats`. A statistic that makes no
sense for a tensor kind (bool, meta, sparse, empty, index dtypes; mean and std of a
complex tensor) is simply absent.

    >>> row = device_stats(torch.randn(4, 8), "basic")
    >>> to_stats(reduce_rows([row])[0].tolist(), 32).std

Three paths, all giving the same numbers (``[sum, sumsq, absmax, nan, inf]``):

- **CPU**: three fused reductions (sum, dot product, aminmax); the NaN/inf counts are
  only computed when the sum is not finite (a finite sum proves there are none), which
  CPU can test for free because nothing there is asynchronous.
- **CUDA with Triton**: one kernel per tensor reads it once and writes per-program
  partial rows (``[P, 5]``); the partials of the whole step are reduced together at the
  step's end. No float32 copy of the tensor is ever made (a bf16 logits tensor is read
  as bf16). The kernel is checked against a float64 reference on first use per device
  and disabled if it disagrees.
- **Anything else** (no Triton, non-contiguous, float8, integer): torch reductions with
  ``dtype=float32`` accumulation.

A tensor seen twice in one step (layer ``i``'s output is layer ``i+1``'s input) is
reduced once: the row is reused while the same tensor object is alive and unmodified.

Read-back: :meth:`PendingStats.resolve` is blocking (one copy per device per step).
:meth:`PendingStats.resolve_async` instead enqueues a non-blocking copy into pinned
memory plus an event, and :meth:`PendingStats.drain` fills the metas (and runs the
step's callback) once the copy has landed: no host sync inside the forward.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import deque
from typing import Any, Callable, Sequence

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
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# Index dtypes hold token ids, positions and id maps: their mean is no statistic, and for
# a one-token decode step it *is* the token id. They get shape and dtype only.
_INDEX_DTYPES = ("int16", "int32", "int64", "uint16", "uint32", "uint64")


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
    :data:`_INDEX_DTYPES`) when it fills them in.
    """
    try:
        # A subclass (FakeTensor, DTensor, ...) may trace, fake or communicate on every op.
        if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
            return False
        if tensor.is_meta or tensor.is_nested or tensor.layout != torch.strided or tensor.is_quantized:
            return False
        if tensor.dtype == torch.bool or tensor.dtype in _NO_ARITHMETIC:
            return False
        if tensor.device.type == "meta" or tensor.numel() == 0:
            return False
        return True
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
class _SeenCache:
    """Rows of tensors already reduced in this step, keyed by object identity.

    A hit needs the very same tensor object, still alive (a weak reference, so a freed
    tensor whose id is reused never matches) and with the same version counter (an
    in-place write in between makes it a miss).
    """

    CAP = 4096

    def __init__(self) -> None:
        self._rows: dict[int, tuple[Any, int, torch.Tensor]] = {}

    def get(self, tensor: torch.Tensor) -> torch.Tensor | None:
        entry = self._rows.get(id(tensor))
        if entry is None:
            return None
        ref, version, row = entry
        if ref() is tensor and tensor._version == version:
            return row
        return None

    def put(self, tensor: torch.Tensor, row: torch.Tensor) -> None:
        try:
            ref = weakref.ref(tensor)
        except TypeError:
            return
        if len(self._rows) >= self.CAP:
            self._rows.clear()
        self._rows[id(tensor)] = (ref, tensor._version, row)

    def clear(self) -> None:
        self._rows.clear()


_seen = _SeenCache()


def device_stats(tensor: torch.Tensor, mode: str) -> torch.Tensor:
    """Statistics of ``tensor`` on its device, without a host sync on accelerators.

    Returns either a row ``[sum, sumsq, absmax, nan, inf]`` (shape ``(5,)``) or, on the
    fused CUDA path, per-program partial rows (shape ``(P, 5)``) that
    :func:`reduce_rows` (called by :class:`PendingStats`) combines. ``mode`` ("basic" or
    "full") gives the same numbers today; it is kept for callers that pass it.
    """
    x = tensor.detach()
    hit = _seen.get(tensor)
    if hit is not None:
        return hit
    if x.device.type == "cpu":
        row = _cpu_stats(x)
    elif _fused_ok(x):
        row = _fused_partials(x)
    else:
        row = _torch_stats(x)
    _seen.put(tensor, row)
    return row


def _cpu_stats(x: torch.Tensor) -> torch.Tensor:
    """Exact float32-accumulated statistics on the CPU (float64 row, no extra passes)."""
    x = _as_real(x)
    if x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
        flat = x.view(-1)
        total = float(torch.sum(flat))
        sumsq = float(torch.dot(flat, flat))
    else:
        total = float(torch.sum(x, dtype=torch.float32))
        sumsq = float(torch.linalg.vector_norm(x, 2, dtype=torch.float32)) ** 2
    low, high = torch.aminmax(x)
    absmax = max(-float(low), float(high))
    nan = inf = 0
    if not math.isfinite(total):
        # Only a non-finite sum can hide NaN or inf elements.
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        if nan:
            absmax = math.nan
    return torch.tensor([total, sumsq, absmax, nan, inf], dtype=torch.float64)


def _torch_stats(x: torch.Tensor) -> torch.Tensor:
    """The portable accelerator path: torch reductions accumulating in float32."""
    x = _as_real(x)
    total = torch.sum(x, dtype=torch.float32)
    sumsq = torch.linalg.vector_norm(x, 2, dtype=torch.float32).square()
    absmax = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
    nan = torch.isnan(x).sum(dtype=torch.float32)
    inf = torch.isinf(x).sum(dtype=torch.float32)
    return torch.stack([total, sumsq, absmax, nan, inf])


# ------------------------------------------------------------ fused CUDA kernel
_triton_state: dict[Any, Any] = {}
_lock = threading.Lock()
BLOCK = 2048


def _load_triton() -> Any | None:
    """The compiled kernel, or None when Triton is missing or disabled."""
    if "kernel" in _triton_state:
        return _triton_state["kernel"]
    kernel = None
    if os.environ.get("SPECTRACE_FUSED_STATS", "1").strip().lower() not in ("0", "false", "no", "off"):
        try:
            kernel = _build_kernel()
        except Exception:
            kernel = None
    _triton_state["kernel"] = kernel
    return kernel


def _build_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _stats_partials(x_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr):
        # Program `pid` reads x[pid*chunk : (pid+1)*chunk] once, in its own dtype, and
        # writes [sum, sumsq, absmax (NaN ignored), nan count, inf count] to out[pid].
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * chunk
        lanes = tl.arange(0, BLOCK)
        acc_s = tl.zeros([BLOCK], dtype=tl.float32)
        acc_q = tl.zeros([BLOCK], dtype=tl.float32)
        acc_m = tl.zeros([BLOCK], dtype=tl.float32)
        acc_nan = tl.zeros([BLOCK], dtype=tl.int32)
        acc_inf = tl.zeros([BLOCK], dtype=tl.int32)
        for off in tl.range(0, chunk, BLOCK):
            idx = start + off + lanes
            v = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
            is_nan = v != v
            a = tl.abs(v)
            acc_s += v
            acc_q += v * v
            acc_m = tl.maximum(acc_m, tl.where(is_nan, 0.0, a))
            acc_nan += is_nan.to(tl.int32)
            acc_inf += (a == float("inf")).to(tl.int32)
        base = out_ptr + pid * 5
        tl.store(base + 0, tl.sum(acc_s, axis=0))
        tl.store(base + 1, tl.sum(acc_q, axis=0))
        tl.store(base + 2, tl.max(acc_m, axis=0))
        tl.store(base + 3, tl.sum(acc_nan, axis=0).to(tl.float32))
        tl.store(base + 4, tl.sum(acc_inf, axis=0).to(tl.float32))

    return _stats_partials


def programs_for(device: torch.device) -> int:
    """How many partial rows the fused kernel writes per tensor on ``device``."""
    key = ("programs", str(device))
    if key not in _triton_state:
        sms = 1
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
        _triton_state[key] = max(1, 2 * sms)
    return _triton_state[key]


def launch_partials(x: torch.Tensor, out: torch.Tensor) -> None:
    """Enqueue the fused kernel: contiguous float ``x`` -> ``out`` of shape ``(P, 5)``."""
    kernel = _load_triton()
    programs = out.shape[0]
    n = x.numel()
    chunk = max(1, -(-n // programs))
    chunk = -(-chunk // BLOCK) * BLOCK
    kernel[(programs,)](x, out, n, chunk, BLOCK=BLOCK, num_warps=8)


def fused_supported(x: torch.Tensor) -> bool:
    """Whether the fused kernel can read ``x`` as it is (dtype, layout, device)."""
    return x.is_cuda and x.dtype in _TRITON_DTYPES and x.is_contiguous() and _load_triton() is not None


def _fused_ok(x: torch.Tensor) -> bool:
    if not fused_supported(x):
        return False
    key = ("checked", x.device.index)
    ok = _triton_state.get(key)
    if ok is None:
        ok = _triton_state[key] = check_fused(x.device)
    return ok


def check_fused(device: torch.device | str) -> bool:
    """Run the kernel once against a float64 reference (syncs; call before tracing).

    Returns False (and the slower torch path is used) when the kernel is missing, fails
    to compile, or disagrees. :func:`prepare` calls it ahead of time.
    """
    device = torch.device(device)
    with _lock:
        try:
            gen = torch.Generator(device="cpu").manual_seed(7)
            ref = torch.randn(3 * BLOCK + 17, generator=gen, dtype=torch.float64) * 3
            ref[5], ref[BLOCK + 3], ref[-1] = math.nan, math.inf, -math.inf
            got = []
            for dtype in _TRITON_DTYPES:
                x = ref.to(device=device, dtype=dtype)
                out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float32)
                launch_partials(x, out)
                got.append((reduce_rows([out])[0].tolist(), None))
            for row, _ in got:
                # +inf and -inf and a NaN: the sum is NaN, absmax is inf (NaN ignored).
                if not (math.isnan(row[SUM]) and row[NAN] == 1 and row[INF] == 2 and row[ABSMAX] == math.inf):
                    return False
            # A finite tensor: sums against float64.
            x = (torch.randn(5 * BLOCK + 3, generator=gen, dtype=torch.float64) + 0.5).to(device=device, dtype=torch.float32)
            out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float32)
            launch_partials(x, out)
            row = reduce_rows([out])[0].tolist()
            r = x.double().cpu()
            return (
                abs(row[SUM] - float(r.sum())) <= 1e-4 * float(r.abs().sum())
                and abs(row[SUMSQ] - float((r * r).sum())) <= 1e-4 * float((r * r).sum())
                and row[ABSMAX] == float(r.abs().max())
                and row[NAN] == 0
                and row[INF] == 0
            )
        except Exception:
            return False


def prepare(device: torch.device | str) -> bool:
    """Compile and check the fused kernel for ``device`` now (outside any forward).

    Returns whether the fused path is in use there. Tracing works without calling it;
    the first traced tensor then pays the compile and one sync.
    """
    device = torch.device(device)
    if device.type != "cuda" or _load_triton() is None:
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = ("checked", device.index)
    if key not in _triton_state:
        _triton_state[key] = check_fused(device)
    return bool(_triton_state[key])


def _fused_partials(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(programs_for(x.device), ROW, device=x.device, dtype=torch.float32)
    launch_partials(x, out)
    return out


# ------------------------------------------------------------- rows -> stats
def reduce_rows(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Combine rows (each ``(5,)`` or ``(P, 5)``, all on one device) into ``(T, 5)`` float64.

    Sums add, absmax takes the max, counts add: a few launches for a whole step.
    """
    if all(r.dim() == 1 for r in rows):
        return torch.stack([r.to(torch.float64) for r in rows])
    parts = [r.reshape(-1, ROW) for r in rows]
    if len({p.shape[0] for p in parts}) == 1:
        p = torch.stack(parts).to(torch.float64)  # (T, P, 5)
        return torch.cat([p[..., :ABSMAX].sum(1), p[..., ABSMAX : ABSMAX + 1].amax(1), p[..., NAN:].sum(1)], dim=-1)
    return torch.cat([reduce_rows([p]) for p in parts])


def to_stats(row: Sequence[float], numel: int) -> TensorStats:
    """Host-side statistics from one row, in float64.

    ``absmax`` is None when the tensor holds a NaN (the nan count says so), on every path.
    """
    total, sumsq, absmax, nan, inf = (float(v) for v in row[:ROW])
    mean = total / numel
    # Population variance from the two sums; clamp the tiny negatives rounding leaves.
    var = max(sumsq / numel - mean * mean, 0.0) if numel > 0 else 0.0
    std = math.sqrt(var) if math.isfinite(var) else var
    return TensorStats(
        mean=_finite_or_none(mean),
        std=_finite_or_none(std),
        absmax=absmax if not math.isnan(absmax) and nan == 0 else None,
        nan=int(nan),
        inf=int(inf),
        numel=numel,
    )


def _finite_or_none(value: float) -> float | None:
    # JSON has no NaN; a NaN mean says nothing the nan count does not say better.
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------ read-back
class _Copy:
    """One device's rows of one step, copied (or being copied) to host memory."""

    __slots__ = ("indices", "host", "event")

    def __init__(self, indices: list[int], host: torch.Tensor, event: Any) -> None:
        self.indices = indices
        self.host = host
        self.event = event

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class _Batch:
    __slots__ = ("targets", "copies", "then")

    def __init__(self, targets: list[tuple[TensorMeta, int]], copies: list[_Copy], then: Callable[[], Any] | None) -> None:
        self.targets = targets
        self.copies = copies
        self.then = then


class PendingStats:
    """Device statistics rows of one step, waiting for their host copy."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []
        self.targets: list[tuple[TensorMeta, int]] = []
        self._inflight: deque[_Batch] = deque()

    def add(self, meta: TensorMeta, row: torch.Tensor, numel: int) -> None:
        self.rows.append(row)
        self.targets.append((meta, numel))

    def resolve(self) -> None:
        """One reduction and one copy per device; fills ``meta.stats`` in place now."""
        self.resolve_async()
        self.drain(wait=True)

    def resolve_async(self, then: Callable[[], Any] | None = None) -> None:
        """Start this step's read-back; ``then`` runs once its metas are filled.

        CPU rows are filled at once. Accelerator rows are reduced on the device and
        copied with ``non_blocking=True`` into pinned memory behind an event: nothing
        here waits for the device. :meth:`drain` finishes the job, in step order.
        """
        rows, targets = self.rows, self.targets
        self.rows, self.targets = [], []
        _seen.clear()
        copies: list[_Copy] = []
        failed: BaseException | None = None
        if rows:
            by_device: dict[torch.device, list[int]] = {}
            for index, row in enumerate(rows):
                by_device.setdefault(row.device, []).append(index)
            for device, indices in by_device.items():
                try:
                    reduced = reduce_rows([rows[i] for i in indices])
                    if device.type == "cuda":
                        host = torch.empty(reduced.shape, dtype=reduced.dtype, pin_memory=True)
                        host.copy_(reduced, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record()
                        copies.append(_Copy(indices, host, event))
                    else:
                        copies.append(_Copy(indices, reduced.to("cpu"), None))
                except Exception as exc:
                    # Those tensors keep no statistics; the step's calls still go on.
                    failed = failed or exc
        if copies or then is not None:
            self._inflight.append(_Batch(targets, copies, then))
            if all(c.event is None for c in copies):
                self.drain(wait=False)
        if failed is not None:
            raise failed

    def drain(self, wait: bool = True) -> int:
        """Fill the metas of finished copies (all of them when ``wait``); returns batches done.

        Batches finish in order: a later step never overtakes an earlier one. With
        ``wait=False`` this never blocks (events are only queried).
        """
        done = 0
        first_error: BaseException | None = None
        while self._inflight:
            batch = self._inflight[0]
            if not wait and not all(c.ready() for c in batch.copies):
                break
            self._inflight.popleft()
            try:
                for copy in batch.copies:
                    copy.wait()
                    for i, values in zip(copy.indices, copy.host.tolist()):
                        meta, numel = batch.targets[i]
                        if meta.dtype in _INDEX_DTYPES:
                            meta.stats = None  # ids stay out of the trace (see _INDEX_DTYPES)
                            continue
                        meta.stats = to_stats(values, numel)
                        if meta.dtype.startswith("complex"):
                            # Rows of a complex tensor describe |z|: absmax is max |z|, but a
                            # "mean" of magnitudes would read as the mean of z. Drop it.
                            meta.stats.mean = meta.stats.std = None
            except Exception as exc:
                first_error = first_error or exc
            if batch.then is not None:
                try:
                    batch.then()
                except Exception as exc:
                    first_error = first_error or exc
            done += 1
        if first_error is not None:
            raise first_error
        return done

    @property
    def in_flight(self) -> int:
        """Steps whose statistics are still being copied."""
        return len(self._inflight)

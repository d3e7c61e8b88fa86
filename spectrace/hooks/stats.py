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
  partial rows (``[P, 5]``, float64 sums) into the next slot of a reused step buffer;
  the partials of the whole step are reduced together at the step's end. No float32
  copy of the tensor is ever made (a bf16 logits tensor is read as bf16). The kernel
  is checked against a float64 reference on first use per device and disabled if it
  disagrees.
- **Anything else** (no Triton, non-contiguous, float8, integer): torch reductions with
  ``dtype=float32`` accumulation.

A tensor seen twice in one step (layer ``i``'s output is layer ``i+1``'s input) is
reduced once: the row is reused while the same tensor object is alive and unmodified.

Read-back: :meth:`StepStats.start_readback` ends a step by enqueueing one reduction
and one non-blocking copy into pinned memory (plus an event) per device; nothing waits
for the device there. :meth:`Readback.values` blocks until the copy landed, and is
called by the record worker thread, never inside the forward.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import weakref
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
def device_stats(tensor: torch.Tensor, mode: str = "basic") -> torch.Tensor:
    """Statistics of one ``tensor`` on its device, without a host sync on accelerators.

    Returns either a row ``[sum, sumsq, absmax, nan, inf]`` (shape ``(5,)``) or, on the
    fused CUDA path, per-program partial rows (shape ``(P, 5)``) that :func:`reduce_rows`
    combines. A traced step goes through :class:`StepStats` instead, which writes fused
    partials into a reused buffer. ``mode`` ("basic" or "full") gives the same numbers.
    """
    x = tensor.detach()
    if x.device.type == "cpu":
        return _cpu_stats(x)
    if _fused_ok(x):
        out = torch.empty(programs_for(x.device), ROW, device=x.device, dtype=torch.float64)
        launch_partials(x, out)
        return out
    return _torch_stats(x)


def _cpu_stats(x: torch.Tensor) -> torch.Tensor:
    """Exact float32-accumulated statistics on the CPU (float64 row, no extra passes)."""
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
    return torch.tensor([total, sumsq, absmax, nan, inf], dtype=torch.float64)


def _torch_stats(x: torch.Tensor) -> torch.Tensor:
    """The portable accelerator path: torch reductions accumulating in float32."""
    x = _as_real(x)
    total = torch.sum(x, dtype=torch.float32)
    # Accumulated in float64: squares of activations above 1.8e19 overflow float32.
    sumsq = torch.linalg.vector_norm(x, 2, dtype=torch.float64).square()
    absmax = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
    nan = torch.isnan(x).sum(dtype=torch.float32)
    inf = torch.isinf(x).sum(dtype=torch.float32)
    return torch.stack([total.double(), sumsq, absmax.double(), nan.double(), inf.double()])


# ------------------------------------------------------------ fused CUDA kernel
_triton_state: dict[Any, Any] = {}
_lock = threading.Lock()
# Launch shape of the fused kernel: PROGRAMS_PER_SM programs per multiprocessor, each
# looping over its chunk BLOCK elements at a time with WARPS warps. Enough programs must
# be resident to keep loads in flight, and each loads TILE blocks per iteration (more
# bytes in flight for the same accumulators: the 525 MB logits of a 4x512 prefill went
# from 304 to 173 us, 1.7 -> 3.0 TB/s, a 4x512x4096 hidden state from 13.7 to 9.3 us);
# measured on the H200 (bench/profile_step.py --sweep), see bench/results/stats-kernel-sweep-h200-2026-11-30.csv.
BLOCK = 1024
WARPS = 4
PROGRAMS_PER_SM = 8
TILE = 8
MIN_BLOCKS_PER_PROGRAM = 4  # below that, fewer programs: a decode-step tensor needs a handful


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
    # Imported on first use only: Triton is optional and slow to import.
    from .stats_kernel import stats_partials

    return stats_partials


def programs_for(device: torch.device) -> int:
    """How many partial rows the fused kernel writes per tensor on ``device``."""
    key = ("programs", str(device))
    if key not in _triton_state:
        sms = 1
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
        _triton_state[key] = max(1, PROGRAMS_PER_SM * sms)
    return _triton_state[key]


def launch_partials(x: torch.Tensor, out: torch.Tensor, slot: int = 0, written: list[int] | None = None) -> None:
    """Enqueue the fused kernel: contiguous float ``x`` -> float64 ``out[slot]``.

    ``out`` is ``(P, 5)`` (then ``slot`` is 0) or a ``(slots, P, 5)`` buffer; passing the
    whole buffer and a slot number saves a slicing op per tensor. ``written[slot]``, when
    given, is how many leading rows of the slot may hold values (the rest are known to be
    zero): the kernel then zeroes only if this launch writes fewer rows, and the count is
    updated. Without it every launch zeroes the rows it does not write.
    """
    kernel = _load_triton()
    rows = out.shape[-2]
    n = x.numel()
    full = n // BLOCK
    grid = min(rows, max(1, -(-full // MIN_BLOCKS_PER_PROGRAM)))
    per = -(-full // grid)  # whole blocks per program
    per = -(-per // TILE) * TILE  # whole tiles, so only the last program reads single blocks
    grid = max(1, min(grid, -(-full // per))) if full else 1
    zero_rest = written is None or grid < written[slot]
    kernel[(grid,)](x, out, n, per, slot, rows, BLOCK=BLOCK, TILE=TILE, ZERO_REST=zero_rest, num_warps=WARPS)
    if written is not None:
        written[slot] = grid


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
            for dtype in _TRITON_DTYPES:
                x = ref.to(device=device, dtype=dtype)
                out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float64)
                launch_partials(x, out)
                reduced = reduce_rows([out])
                row = reduced[0].tolist()
                # +inf and -inf and a NaN: the sum is NaN, absmax is inf (NaN ignored).
                if not (math.isnan(row[SUM]) and row[NAN] == 1 and row[INF] == 2 and row[ABSMAX] == math.inf):
                    return False
                # The variant that leaves known-zero rows alone (graph-safe slots), per
                # dtype: compiled here, outside any capture, and it must agree.
                kept = torch.zeros(1, programs_for(device), ROW, device=device, dtype=torch.float64)
                launch_partials(x, kept, 0, [0])
                if not torch.equal(reduce_rows([kept[0]]).nan_to_num(nan=-1.0), reduced.nan_to_num(nan=-1.0)):
                    return False
            # A finite tensor: sums against float64.
            x = (torch.randn(5 * BLOCK + 3, generator=gen, dtype=torch.float64) + 0.5).to(device=device, dtype=torch.float32)
            out = torch.zeros(3, programs_for(device), ROW, device=device, dtype=torch.float64)
            launch_partials(x, out, slot=2)  # the slot argument lands where it says
            if bool(out[:2].any()):
                return False
            row = reduce_rows([out[2]])[0].tolist()
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
    total, sumsq, absmax, nan, inf = (float(v) for v in row[:ROW])
    mean = total / numel
    # Population variance from the two sums; clamp the tiny negatives rounding leaves.
    var = max(sumsq / numel - mean * mean, 0.0) if numel > 0 else 0.0
    std = math.sqrt(var) if math.isfinite(var) else var
    return {
        "mean": _finite_or_none(mean),
        "std": _finite_or_none(std),
        "absmax": absmax if not math.isnan(absmax) and nan == 0 else None,
        "nan": int(nan),
        "inf": int(inf),
        "numel": numel,
    }


def _finite_or_none(value: float) -> float | None:
    # JSON has no NaN; a NaN mean says nothing the nan count does not say better.
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------ one step
class _SlotBuffer:
    """A ``(capacity, P, 5)`` float64 device buffer: one slot of partial rows per tensor.

    A traced step takes one from the pool, each fused launch writes the next slot, and the
    buffer goes back to the pool once its read-back has landed (so no step overwrites a
    buffer whose reduction has not run yet). Allocating ``(P, 5)`` per tensor instead
    costs a caching-allocator call per hook.
    """

    __slots__ = ("tensor", "used")

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.tensor = torch.empty(capacity, programs_for(device), ROW, device=device, dtype=torch.float64)
        self.used = 0


class _BufferPool:
    def __init__(self) -> None:
        self._free: dict[torch.device, list[_SlotBuffer]] = {}
        self._capacity: dict[torch.device, int] = {}
        self._lock = threading.Lock()

    def take(self, device: torch.device) -> _SlotBuffer:
        with self._lock:
            free = self._free.get(device)
            if free:
                return free.pop()
            capacity = self._capacity.get(device, 64)
        return _SlotBuffer(device, capacity)

    def give_back(self, buffer: _SlotBuffer, wanted: int) -> None:
        device = buffer.tensor.device
        with self._lock:
            if wanted > buffer.tensor.shape[0]:
                # The step needed more slots than the buffer had (the rest took the slow
                # path): later buffers are sized for it, this one is dropped.
                self._capacity[device] = max(self._capacity.get(device, 64), 2 * wanted)
                return
            buffer.used = 0
            free = self._free.setdefault(device, [])
            if len(free) < 8:
                free.append(buffer)


_pool = _BufferPool()
_generations = itertools.count()  # next() is atomic: steps of all threads get distinct numbers


class StepStats:
    """The statistics of one step on one thread: launched per tensor, read back once.

    :meth:`add` enqueues a tensor's reduction and returns its index in the step (a tensor
    seen twice in one step, layer ``i``'s output being layer ``i+1``'s input, is reduced
    once while the same object is alive and unmodified). :meth:`start_readback` ends the
    step: per device one reduction and one non-blocking copy into pinned memory behind
    an event, returned as a :class:`Readback` that another thread may wait on.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # A call may start in one step and end in the next (a hooked module around a
        # wrapped root): its rows are found by (generation, index).
        self.generation = next(_generations)
        # entry: ("slot", buffer, slot) for fused partials, ("row", tensor) otherwise
        self.entries: list[tuple[Any, ...]] = []
        self._buffers: dict[torch.device, _SlotBuffer] = {}
        self._wanted: dict[torch.device, int] = {}
        self._seen: dict[int, tuple[Any, int, int]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, tensor: torch.Tensor) -> int:
        """Enqueue ``tensor``'s statistics; returns its index in this step."""
        key = id(tensor)
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is tensor and tensor._version == hit[1]:
            return hit[2]
        x = tensor.detach()
        device = x.device
        if device.type == "cpu":
            entry: tuple[Any, ...] = ("row", _cpu_stats(x))
        elif _fused_ok(x):
            entry = self._fused(x, device)
        else:
            entry = ("row", _torch_stats(x))
        index = len(self.entries)
        self.entries.append(entry)
        try:
            self._seen[key] = (weakref.ref(tensor), tensor._version, index)
        except TypeError:
            pass
        return index

    def _fused(self, x: torch.Tensor, device: torch.device) -> tuple[Any, ...]:
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = self._buffers[device] = _pool.take(device)
        self._wanted[device] = self._wanted.get(device, 0) + 1
        if buffer.used < buffer.tensor.shape[0]:
            slot = buffer.used
            launch_partials(x, buffer.tensor, slot)
            buffer.used += 1
            return ("slot", buffer, slot)
        out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float64)
        launch_partials(x, out)
        return ("row", out)

    def start_readback(self) -> Readback | None:
        """End the step: enqueue the reduction and host copy of every row (no sync on CUDA).

        Returns None when the step computed no statistics. A device whose reduction fails
        leaves its entries without values; the error is kept on the read-back.
        """
        entries, buffers, wanted, generation = self.entries, self._buffers, self._wanted, self.generation
        self._reset()
        if not entries:
            for device, buffer in buffers.items():
                _pool.give_back(buffer, wanted.get(device, 0))
            return None
        by_device: dict[torch.device, list[int]] = {}
        for index, entry in enumerate(entries):
            device = entry[1].tensor.device if entry[0] == "slot" else entry[1].device
            by_device.setdefault(device, []).append(index)
        copies: list[_Copy] = []
        error: BaseException | None = None
        for device, indices in by_device.items():
            try:
                copies.append(_copy_rows(device, [entries[i] for i in indices], indices, buffers.get(device)))
            except Exception as exc:
                error = error or exc
        returns = [(buffer, wanted.get(device, 0)) for device, buffer in buffers.items()]
        return Readback(generation, len(entries), copies, returns, error)


def _copy_rows(device: torch.device, entries: list[tuple[Any, ...]], indices: list[int], buffer: _SlotBuffer | None) -> _Copy:
    """Reduce one device's entries to ``(T, 5)`` float64 and start their host copy."""
    slots = [e for e in entries if e[0] == "slot"]
    rows = [e[1] for e in entries if e[0] == "row"]
    parts = []
    if slots:
        assert buffer is not None
        parts.append(reduce_partials(buffer.tensor[: buffer.used]))  # slots are 0..used-1 in order
    if rows:
        parts.append(reduce_rows(rows))
    reduced = parts[0] if len(parts) == 1 else torch.cat(parts)
    # Row order in ``reduced``: the slots in slot order, then the other rows in entry order.
    order = [i for i, e in zip(indices, entries) if e[0] == "slot"] + [i for i, e in zip(indices, entries) if e[0] == "row"]
    if device.type == "cuda":
        host = torch.empty(reduced.shape, dtype=reduced.dtype, pin_memory=True)
        host.copy_(reduced, non_blocking=True)
        # blocking: the worker that waits on it sleeps instead of spinning a core.
        event = torch.cuda.Event(blocking=True)
        event.record()
        return _Copy(order, host, event)
    return _Copy(order, reduced.to("cpu"), None)


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


class Readback:
    """One step's statistics on their way to the host; :meth:`values` waits for them."""

    def __init__(
        self, generation: int, count: int, copies: list[_Copy], buffers: list[tuple[_SlotBuffer, int]], error: BaseException | None
    ) -> None:
        self.generation = generation
        self.count = count
        self.copies = copies
        self.error = error
        self._buffers = buffers

    def ready(self) -> bool:
        """Whether every copy has landed (never blocks)."""
        return all(c.ready() for c in self.copies)

    def busy(self) -> bool:
        return not self.ready()

    def has_events(self) -> bool:
        return any(c.event is not None for c in self.copies)

    def values(self) -> list[list[float] | None]:
        """Row ``[sum, sumsq, absmax, nan, inf]`` per index (None where the device failed).

        Blocks until the copies landed (``event.synchronize`` releases the GIL), then
        hands the step's buffers back to the pool.
        """
        out: list[list[float] | None] = [None] * self.count
        try:
            for copy in self.copies:
                copy.wait()
                for i, values in zip(copy.indices, copy.host.tolist()):
                    out[i] = values
        finally:
            for buffer, wanted in self._buffers:
                _pool.give_back(buffer, wanted)
            self._buffers = []
        return out


def stats_for(values: list[float], numel: int, dtype: str) -> dict[str, Any] | None:
    """The recorded statistics fields of one tensor from its row (None for index dtypes)."""
    if dtype in _INDEX_DTYPES:
        return None  # ids stay out of the trace (see _INDEX_DTYPES)
    stats = stats_fields(values, numel)
    if dtype.startswith("complex"):
        # Rows of a complex tensor describe |z|: absmax is max |z|, but a "mean" of
        # magnitudes would read as the mean of z. Drop it.
        stats["mean"] = stats["std"] = None
    return stats

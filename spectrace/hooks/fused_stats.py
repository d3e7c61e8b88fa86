"""The fused Triton statistics kernel, host side: loading, launch shape, self-check.

**CUDA with Triton**: one kernel per tensor reads it once and writes per-program partial
rows (``[P, 5]``, float64 sums) into the next slot of a reused step buffer
(:mod:`.readback`); the partials of the whole step are reduced together at the step's end
(:func:`.tensor_stats.reduce_partials`). No float32 copy of the tensor is ever made (a
bf16 logits tensor is read as bf16). The kernel is checked against a float64 reference on
first use per device and disabled if it disagrees.

The ``@triton.jit`` device code lives in :mod:`.fused_stats_kernel`, imported on first
use only; ``SPECTRACE_FUSED_STATS=0`` disables the kernel.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from ..settings import fused_stats_on
from .tensor_stats import ABSMAX, INF, NAN, ROW, SUM, SUMSQ, reduce_rows

# The dtypes the fused kernel reads as they are.
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

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


def load_triton() -> Any | None:
    """The compiled kernel, or None when Triton is missing or disabled."""
    if "kernel" in _triton_state:
        return _triton_state["kernel"]
    kernel = None
    if fused_stats_on():  # parsed once, in settings.py (a bad value: one warning)
        try:
            kernel = _build_kernel()
        except Exception:
            kernel = None
    _triton_state["kernel"] = kernel
    return kernel


def _build_kernel() -> Any:
    # Imported on first use only: Triton is optional and slow to import.
    from .fused_stats_kernel import stats_partials

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


def set_programs(device: torch.device | str, count: int | None) -> None:
    """Pin :func:`programs_for` of ``device`` to ``count`` rows (None: recompute on next use).

    For tests and launch-shape sweeps; buffers already allocated keep their row count.
    """
    key = ("programs", str(torch.device(device)))
    if count is None:
        _triton_state.pop(key, None)
    else:
        _triton_state[key] = count


def forget_programs() -> None:
    """Drop every device's cached :func:`programs_for` (after changing ``PROGRAMS_PER_SM``)."""
    for key in [k for k in _triton_state if isinstance(k, tuple) and k[0] == "programs"]:
        del _triton_state[key]


def launch_partials(x: torch.Tensor, out: torch.Tensor, slot: int = 0, written: list[int] | None = None, direct: bool | None = None) -> int:
    """Enqueue the fused kernel: contiguous float ``x`` -> float64 ``out[slot]``; returns
    how many leading rows of the slot hold partials (the programs launched; the rest are zero).

    ``out`` is ``(P, 5)`` (then ``slot`` is 0) or a ``(slots, P, 5)`` buffer; passing the
    whole buffer and a slot number saves a slicing op per tensor. ``written[slot]``, when
    given, is how many leading rows of the slot may hold values (the rest are known to be
    zero): the kernel then zeroes only if this launch writes fewer rows, and the count is
    updated. Without it every launch zeroes the rows it does not write. ``direct``:
    through the compiled kernel (None: where :func:`check_fused` allowed it).
    """
    rows = out.shape[-2]
    n = x.numel()
    full = n // BLOCK
    grid = min(rows, max(1, -(-full // MIN_BLOCKS_PER_PROGRAM)))
    per = -(-full // grid)  # whole blocks per program
    if full >= TILE * MIN_BLOCKS_PER_PROGRAM:
        per = -(-per // TILE) * TILE  # whole tiles, so only the last program reads single blocks
    # (a small tensor keeps its programs: a tile each would leave one program reading it all)
    grid = max(1, min(grid, -(-full // per))) if full else 1
    zero_rest = written is None or grid < written[slot]
    # The compiled variant assumes what Triton specialised it on: both addresses 16-byte
    # aligned and every integer argument a 32-bit one.
    plain = n <= _INT32_MAX and x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
    key = (out.get_device(), x.dtype, zero_rest)
    if direct is None:
        direct = bool(_triton_state.get(("direct", key[0], "single")))
    compiled = _compiled_single.get(key) if direct and plain else None
    launched = False
    if compiled is not None:
        try:
            _launch_compiled(compiled, (grid, 1, 1), (x, out, n, per, slot, rows, BLOCK, TILE, zero_rest))
            launched = True
        except Exception:  # an unforeseen Triton: the regular launch from now on
            _triton_state[("direct", key[0], "single")] = False
    if not launched:
        kernel = load_triton()
        compiled = kernel[(grid,)](x, out, n, per, slot, rows, BLOCK=BLOCK, TILE=TILE, ZERO_REST=zero_rest, num_warps=WARPS)
        if plain and compiled is not None and hasattr(compiled, "function"):  # (Triton's interpreter returns none)
            _compiled_single.setdefault(key, compiled)
    if written is not None:
        written[slot] = grid
    return grid


# The single-tensor kernel as compiled, per (device index, x dtype, ZERO_REST): a prefill
# launches one per tensor above the batched launch's size, and Triton's per-launch argument
# binding and cache lookup cost several times what the launch itself does on a slow host.
# Used only for aligned tensors of fewer than 2**31 elements (what the variant was compiled
# for), and only on a device where check_fused saw it write what the regular launch writes.
_compiled_single: dict[tuple[int, torch.dtype, bool], Any] = {}
_INT32_MAX = 2**31 - 1


_TL_DTYPES: dict[torch.dtype, Any] = {}


def _tl_dtype(dtype: torch.dtype) -> Any:
    if not _TL_DTYPES:
        import triton.language as tl

        _TL_DTYPES.update({torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16})
    return _TL_DTYPES[dtype]


# The batched kernel as compiled, per (device index, dtype): launched through it directly,
# without Triton's per-launch argument binding and cache lookup (about as costly as the
# launch itself for the kernel's 38 arguments). Valid for any argument values: every
# integer argument is unspecialised, the buffer is a whole allocation, and the constants
# are the key. Used only for a device and dtype where check_multi saw it write what the
# regular launch writes.
_compiled_multi: dict[tuple[int, Any], Any] = {}


def launch_multi(xs: list[torch.Tensor], out: torch.Tensor, slot0: int, direct: bool | None = None) -> int:
    """Enqueue one fused launch for up to :data:`MULTI` tensors of one dtype: tensor ``i``'s
    partial rows land in slot ``slot0 + i`` of the ``(slots, P, 5)`` buffer ``out``, as
    :func:`launch_partials` would write them one launch each (every row of each slot is
    written: the ones no program reads are zeroed). ``direct``: through the compiled
    kernel (None: where :func:`check_multi` allowed it). Returns the programs per tensor:
    the leading rows of each slot that hold partials."""
    from .fused_stats_kernel import MULTI, stats_partials_multi

    count = len(xs)
    if not 0 < count <= MULTI:
        raise ValueError(f"launch_multi takes 1..{MULTI} tensors, not {count}")
    rows = out.shape[-2]
    addrs: list[int] = []
    sizes: list[int] = []
    for x in xs:
        addrs.append(x.data_ptr())
        sizes.append(x.numel())
    # Programs per tensor: as many as the largest tensor takes alone (launch_partials' rule).
    grid = min(rows, max(1, -(-(max(sizes) // BLOCK) // MIN_BLOCKS_PER_PROGRAM)))
    # Unused pairs repeat the first tensor's address with no elements: every address
    # argument keeps one integer type, so one compiled variant serves any count.
    addrs += [addrs[0]] * (MULTI - count)
    sizes += [0] * (MULTI - count)
    # (by the tensors' device: ``out`` may be pinned host memory the device writes, see host_rows_ok)
    key = (xs[0].get_device(), xs[0].dtype)
    if direct is None:
        direct = bool(_triton_state.get(("direct", *key)))
    compiled = _compiled_multi.get(key) if direct else None
    if compiled is not None:
        try:
            _launch_compiled(compiled, (count, grid, 1), (out, slot0, rows, *addrs, *sizes, _tl_dtype(xs[0].dtype), BLOCK, TILE))
            return grid
        except Exception:  # an unforeseen Triton: the regular launch from now on
            _triton_state[("direct", *key)] = False
    compiled = stats_partials_multi[(count, grid)](
        out, slot0, rows, *addrs, *sizes, DTYPE=_tl_dtype(xs[0].dtype), BLOCK=BLOCK, TILE=TILE, num_warps=WARPS
    )
    if compiled is not None and hasattr(compiled, "function"):  # (Triton's interpreter returns none)
        _compiled_multi.setdefault(key, compiled)
    return grid


# Triton's current-stream and current-device functions and its runtime knobs, looked up
# once (through its lazy driver proxy they cost more than the launch's own arguments).
_launch_env: list[Any] = []


def _launch_compiled(compiled: Any, grid: tuple[int, int, int], args: tuple[Any, ...]) -> None:
    """What Triton's ``JITFunction.run`` does once it has found the compiled kernel."""
    if not _launch_env:
        from triton import knobs
        from triton.runtime.driver import driver

        _launch_env[:] = [driver.active.get_current_stream, driver.active.get_current_device, knobs.runtime]
    current_stream, current_device, runtime = _launch_env
    stream = current_stream(current_device())
    enter = runtime.launch_enter_hook
    # (launch_metadata is None without an enter hook: Triton asks the same)
    metadata = None if enter is None else compiled.launch_metadata(grid, stream, *args)
    compiled.run(
        grid[0],
        grid[1],
        grid[2],
        stream,
        compiled.function,
        compiled.packed_metadata,
        metadata,
        enter,
        runtime.launch_exit_hook,
        *args,
    )


def fused_supported(x: torch.Tensor) -> bool:
    """Whether the fused kernel can read ``x`` as it is (dtype, layout, device)."""
    return x.is_cuda and x.dtype in TRITON_DTYPES and x.is_contiguous() and load_triton() is not None


def fused_ok(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the fused path: :func:`fused_supported`, and the kernel passed
    :func:`check_fused` on ``x``'s device (checked on first use, then cached)."""
    if not fused_supported(x):
        return False
    key = ("checked", x.get_device())  # the device's index, without building a torch.device
    ok = _triton_state.get(key)
    if ok is None:
        ok = _triton_state[key] = check_fused(x.device)
    return ok


def route(x: torch.Tensor) -> tuple[torch.device, bool, bool]:
    """Where an accelerator tensor's statistics go: (its device, whether the fused kernel
    takes its dtype there, contiguity aside, whether the batched launch does too).

    Kept per (device index, dtype) once the device's checks have run: a statistics step
    asks this for every tensor, and ``x.device`` builds a new object on every access."""
    key = ("route", x.is_cuda, x.get_device(), x.dtype)
    hit = _triton_state.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    device = x.device
    fused = x.is_cuda and x.dtype in TRITON_DTYPES and load_triton() is not None
    if fused:
        checked = ("checked", device.index)
        ok = _triton_state.get(checked)
        if ok is None:
            ok = _triton_state[checked] = check_fused(device)
        fused = bool(ok)
    result = (device, fused, fused and multi_ok(device))
    if not fused or ("multi", device.index) in _triton_state:  # (decided for good)
        _triton_state[key] = result
    return result


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
            for dtype in TRITON_DTYPES:
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
            # The batched launch: the same partial rows as one launch per tensor.
            _triton_state[("multi", device.index)] = check_multi(device)
            _triton_state[("direct", device.index, "single")] = _direct_single_agrees(device, gen)
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


def check_multi(device: torch.device) -> bool:
    """Whether :func:`launch_multi` writes what :func:`launch_partials` writes, tensor by
    tensor (sizes below, at and above a block, NaN and inf, both float dtypes)."""
    try:
        gen = torch.Generator(device="cpu").manual_seed(11)
        sizes = (3, BLOCK, 5 * BLOCK + 7, 70 * BLOCK + 1)
        for dtype in (torch.float32, torch.bfloat16):
            xs = [(torch.randn(n, generator=gen, dtype=torch.float64) * 2).to(device=device, dtype=dtype) for n in sizes]
            xs[1][7] = math.nan
            xs[2][-1] = math.inf
            rows = programs_for(device)
            one = torch.zeros(len(xs), rows, ROW, device=device, dtype=torch.float64)
            for i, x in enumerate(xs):
                launch_partials(x, one, i)
            batched = torch.full((len(xs) + 1, rows, ROW), 3.0, device=device, dtype=torch.float64)
            launch_multi(xs, batched, 1, direct=False)
            want = reduce_rows([one[i] for i in range(len(xs))]).nan_to_num(nan=-1.0)
            got = reduce_rows([batched[i + 1] for i in range(len(xs))]).nan_to_num(nan=-1.0)
            if not torch.allclose(got, want, rtol=1e-9, atol=1e-9) or not bool((batched[0] == 3.0).all()):
                return False
            # The launch through the compiled kernel: the very same rows, or never used here.
            _triton_state[("direct", batched.get_device(), dtype)] = _direct_agrees(xs, batched)
            if dtype == torch.float32 and device.type == "cuda":
                _triton_state[("host_rows", device.index)] = _host_rows_agree(xs[:3], batched[1:4])
        return True
    except Exception:
        return False


def _direct_agrees(xs: list[torch.Tensor], regular: torch.Tensor) -> bool:
    try:
        if _compiled_multi.get((xs[0].get_device(), xs[0].dtype)) is None:
            return False
        direct = torch.full_like(regular, 3.0)
        launch_multi(xs[1:], direct, 2, direct=True)  # other slots and counts than the regular launch
        launch_multi(xs[:1], direct, 1, direct=True)
        return bool(torch.equal(direct.nan_to_num(nan=-1.0), regular.nan_to_num(nan=-1.0)))
    except Exception:
        return False


def _direct_single_agrees(device: torch.device, gen: torch.Generator) -> bool:
    """Whether a launch through the compiled single-tensor kernel writes what the regular
    launch writes: every dtype, both ZERO_REST variants, sizes below and above a tile."""
    try:
        rows = programs_for(device)
        for dtype in TRITON_DTYPES:
            for n in (BLOCK // 2 + 3, 70 * BLOCK + 5):
                x = (torch.randn(n, generator=gen, dtype=torch.float64) * 2).to(device=device, dtype=dtype)
                x[n // 3] = math.nan
                regular = torch.full((3, rows, ROW), 3.0, device=device, dtype=torch.float64)
                launch_partials(x, regular, 1, direct=False)  # zeroes the rows it does not write
                launch_partials(x, regular, 2, [0, 0, 0], direct=False)  # leaves them alone
                if any(_compiled_single.get((regular.get_device(), dtype, z)) is None for z in (True, False)):
                    return False
                direct = torch.full_like(regular, 3.0)
                launch_partials(x, direct, 1, direct=True)
                launch_partials(x, direct, 2, [0, 0, 0], direct=True)
                if not torch.equal(direct.nan_to_num(nan=-1.0), regular.nan_to_num(nan=-1.0)):
                    return False
        return True
    except Exception:
        return False


def _host_rows_agree(xs: list[torch.Tensor], regular: torch.Tensor) -> bool:
    """Whether the batched launch, writing into pinned host memory (where
    :class:`.readback.StepStats` has small tensors' rows land, read back with no copy),
    writes what it wrote into the device buffer ``regular`` (the rows of ``xs``). Syncs."""
    try:
        host = torch.full((len(xs) + 1, 64, ROW), 3.0, dtype=torch.float64, pin_memory=True)  # (readback.RAW_ROWS_MAX rows)
        launch_multi(xs, host, 1)  # (the launch the step takes: direct where allowed)
        torch.cuda.current_stream().synchronize()
        want = reduce_rows([regular[i] for i in range(len(xs))]).nan_to_num(nan=-1.0).cpu()
        got = reduce_rows([host[i + 1] for i in range(len(xs))]).nan_to_num(nan=-1.0)
        return bool(torch.allclose(got, want, rtol=1e-9, atol=1e-9) and (host[0] == 3.0).all())
    except Exception:
        return False


def host_rows_ok(device: torch.device) -> bool:
    """Whether the batched launch may write its rows into pinned host memory on ``device``
    (its check passed there). Off CUDA (Triton's interpreter) the memory is the host's own."""
    if device.type != "cuda":
        return bool(_triton_state.get(("host_rows", device.index), True))
    return bool(_triton_state.get(("host_rows", device.index), False))


def disable_host_rows(device: torch.device) -> None:
    """Launch into the device slots on ``device`` from now on (a host-rows launch failed)."""
    _triton_state[("host_rows", device.index)] = False


def multi_ok(device: torch.device) -> bool:
    """Whether the batched launch passed :func:`check_multi` on ``device`` (after :func:`fused_ok`)."""
    return bool(_triton_state.get(("multi", device.index), False))


def prepare(device: torch.device | str) -> bool:
    """Compile and check the fused kernel for ``device`` now (outside any forward).

    Returns whether the fused path is in use there. Tracing works without calling it;
    the first traced tensor then pays the compile and one sync.
    """
    device = torch.device(device)
    if device.type != "cuda" or load_triton() is None:
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = ("checked", device.index)
    if key not in _triton_state:
        _triton_state[key] = check_fused(device)
    return bool(_triton_state[key])

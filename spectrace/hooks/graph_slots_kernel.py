"""The masked statistics kernel of graph slots (Triton, device code), imported by :mod:`.graph_slots` on first use.

A variant of :mod:`.fused_stats_kernel` for tensors inside a captured CUDA graph: the rows
past ``real_bs * rows_per_seq`` (padding of the captured batch size) are skipped on the
device, the tensor may be a column range of a wider one (a row stride), an optional second
tensor is added elementwise, and the programs combine their results atomically into one
final row ``[sum, sumsq, absmax, nan, inf]`` of the table (no partial rows to reduce later).
"""

import triton
import triton.language as tl


# Every int changes with the tensor (and may be 1 or divisible by 16 for the first time
# mid-capture): without do_not_specialize Triton would compile a new variant then, which
# a stream capture cannot survive. The tensor pointers may point into the middle of an
# allocation (a view), so their alignment is not specialised either; the loads are
# masked against an unspecialised width anyway, so nothing is lost.
@triton.jit(
    do_not_specialize=["x_stride", "y_stride", "col_start", "width", "col_blocks", "padded_rows", "rows_per_seq", "slot"],
    do_not_specialize_on_alignment=["x_ptr", "y_ptr"],
)
def masked_stats(
    x_ptr,
    y_ptr,
    out_ptr,
    real_bs_ptr,
    x_stride,
    y_stride,
    col_start,
    width,
    col_blocks,
    padded_rows,
    rows_per_seq,
    slot,
    HAS_Y: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Work items are (row, column block) pairs of the *padded* rows, taken grid-stride:
    # the grid and the items are fixed at capture. Every padded row is memory of the
    # tensor, so the loads never wait for ``real_bs``: the device scalar's read overlaps
    # them, and the rows past the real ones are dropped by a select afterwards (a load
    # masked by it would stall every replay's kernel on one more round trip to memory).
    # The price: a replay whose real batch is far below the captured one reads its padding
    # too (at batch 64 x 4096 in bf16, 512 KB a slot, well under a microsecond on an H200).
    # A block is BLOCK contiguous elements of one row, so loads stay coalesced whatever
    # the row stride.
    pid = tl.program_id(0).to(tl.int64)
    grid = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    real = tl.load(real_bs_ptr).to(tl.int64)
    # Clamped both ways: a real_bs never written (a table allocated during capture) is
    # garbage, and must still keep the statistics to rows of the padded tensor.
    valid = tl.maximum(tl.minimum(real * rows_per_seq, padded_rows), 0)
    total = padded_rows * col_blocks
    acc_s = tl.zeros([BLOCK], dtype=tl.float64)
    acc_q = tl.zeros([BLOCK], dtype=tl.float64)
    acc_m = tl.zeros([BLOCK], dtype=tl.float32)
    acc_nan = tl.zeros([BLOCK], dtype=tl.int32)
    acc_inf = tl.zeros([BLOCK], dtype=tl.int32)
    for item in tl.range(pid, total, grid):
        row = item // col_blocks
        col = (item - row * col_blocks) * BLOCK + lanes
        mask = col < width
        v = tl.load(x_ptr + (row * x_stride + col_start + col), mask=mask, other=0.0).to(tl.float32)
        if HAS_Y:
            # The sum is taken in float32, not rounded to the tensors' dtype.
            v += tl.load(y_ptr + (row * y_stride + col_start + col), mask=mask, other=0.0).to(tl.float32)
        # Padding may hold NaN or inf (stale or never written): selected away, never multiplied.
        v = tl.where(row < valid, v, 0.0)
        is_nan = v != v
        a = tl.abs(v)
        w = v.to(tl.float64)
        # float64 sums: a bf16 value above 1.8e19 squared overflows float32.
        acc_s += w
        acc_q += w * w
        acc_m = tl.maximum(acc_m, tl.where(is_nan, 0.0, a))
        acc_nan += is_nan.to(tl.int32)
        acc_inf += (a == float("inf")).to(tl.int32)
    out = out_ptr + slot.to(tl.int64) * 5
    tl.atomic_add(out + 0, tl.sum(acc_s, axis=0), sem="relaxed")
    tl.atomic_add(out + 1, tl.sum(acc_q, axis=0), sem="relaxed")
    # The counts are zero in almost every program: their atomics are skipped then (fewer
    # atomics on one row, where all the programs of a slot meet).
    nans = tl.sum(acc_nan, axis=0)
    infs = tl.sum(acc_inf, axis=0)
    tl.atomic_add(out + 3, nans.to(tl.float64), mask=nans != 0, sem="relaxed")
    tl.atomic_add(out + 4, infs.to(tl.float64), mask=infs != 0, sem="relaxed")
    # absmax is >= 0 and never NaN here: the int64 bit patterns of non-negative float64
    # values order like the values (+inf included), so an integer atomic max is exact.
    m = tl.max(acc_m, axis=0).to(tl.float64).to(tl.int64, bitcast=True)
    tl.atomic_max(out.to(tl.pointer_type(tl.int64)) + 2, m, sem="relaxed")

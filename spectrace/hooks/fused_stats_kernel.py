"""The fused statistics kernel (Triton, device code), imported by :mod:`.fused_stats` on first use.

One pass over a tensor in its own dtype gives per-program partial rows
``[sum, sumsq, absmax, nan, inf]``; :func:`spectrace.hooks.fused_stats.launch_partials` launches
it and :func:`spectrace.hooks.tensor_stats.reduce_partials` combines the rows.
"""

import triton
import triton.language as tl


@triton.jit
def accumulate(v, acc_s, acc_q, acc_m, acc_nan, acc_inf):
    # A [TILE, BLOCK] tile of values (float32) into the per-lane [BLOCK] accumulators
    # (inlined by Triton; the sums over the tile's rows stay inside each thread).
    is_nan = v != v
    a = tl.abs(v)
    w = v.to(tl.float64)
    acc_s += tl.sum(w, axis=0)
    acc_q += tl.sum(w * w, axis=0)
    acc_m = tl.maximum(acc_m, tl.max(tl.where(is_nan, 0.0, a), axis=0))
    acc_nan += tl.sum(is_nan.to(tl.int32), axis=0)
    acc_inf += tl.sum((a == float("inf")).to(tl.int32), axis=0)
    return acc_s, acc_q, acc_m, acc_nan, acc_inf


@triton.jit
def program_row(x_ptr, n, per, pid, grid, slot_base, rows, BLOCK: tl.constexpr, TILE: tl.constexpr, ZERO_REST: tl.constexpr):
    # Program `pid` of `grid` reads whole blocks [pid*per, (pid+1)*per) of x (n elements)
    # and writes its row to slot_base[pid]; see stats_partials for why it reads so.
    lanes = tl.arange(0, BLOCK)
    tile_rows = tl.arange(0, TILE)
    acc_s = tl.zeros([BLOCK], dtype=tl.float64)
    acc_q = tl.zeros([BLOCK], dtype=tl.float64)
    acc_m = tl.zeros([BLOCK], dtype=tl.float32)
    acc_nan = tl.zeros([BLOCK], dtype=tl.int32)
    acc_inf = tl.zeros([BLOCK], dtype=tl.int32)
    full = n // BLOCK
    first = pid.to(tl.int64) * per
    last = tl.minimum(first + per, full)
    tiled = first + tl.maximum(last - first, 0) // TILE * TILE
    for b in tl.range(first, tiled, TILE):
        offsets = (b + tile_rows[:, None]) * BLOCK + lanes[None, :]
        v = tl.load(x_ptr + offsets).to(tl.float32)
        acc_s, acc_q, acc_m, acc_nan, acc_inf = accumulate(v, acc_s, acc_q, acc_m, acc_nan, acc_inf)
    for b in tl.range(tiled, last):
        v = tl.load(x_ptr + (b * BLOCK + lanes[None, :])).to(tl.float32)
        acc_s, acc_q, acc_m, acc_nan, acc_inf = accumulate(v, acc_s, acc_q, acc_m, acc_nan, acc_inf)
    if pid == 0:
        idx = full.to(tl.int64) * BLOCK + lanes[None, :]
        v = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
        acc_s, acc_q, acc_m, acc_nan, acc_inf = accumulate(v, acc_s, acc_q, acc_m, acc_nan, acc_inf)
    if ZERO_REST:
        # Rows [grid, rows) of the slot get no program: zero them, BLOCK values at a time.
        for z in tl.range(grid * 5 + pid * BLOCK, rows * 5, grid * BLOCK):
            tl.store(slot_base + z + lanes, tl.zeros([BLOCK], dtype=tl.float64), mask=z + lanes < rows * 5)
    base = slot_base + pid * 5
    tl.store(base + 0, tl.sum(acc_s, axis=0))
    tl.store(base + 1, tl.sum(acc_q, axis=0))
    tl.store(base + 2, tl.max(acc_m, axis=0).to(tl.float64))
    tl.store(base + 3, tl.sum(acc_nan, axis=0).to(tl.float64))
    tl.store(base + 4, tl.sum(acc_inf, axis=0).to(tl.float64))


# n, per and slot change with every tensor: without do_not_specialize Triton would
# compile a new variant (a stall of a second, mid-forward) whenever one of them is 1
# or divisible by 16 for the first time.
@triton.jit(do_not_specialize=["n", "per", "slot", "rows"])
def stats_partials(x_ptr, out_ptr, n, per, slot, rows, BLOCK: tl.constexpr, TILE: tl.constexpr, ZERO_REST: tl.constexpr):
    # Program `pid` reads whole blocks [pid*per, (pid+1)*per) of x once, in its own
    # dtype, unmasked: a block starts at a multiple of BLOCK, so loads are vectorised
    # (a mask against an unspecialised n would make every load scalar). TILE blocks are
    # loaded at once (more bytes in flight for the same accumulators); the blocks that
    # do not fill a tile are read one by one. The last, partial block is read masked by
    # program 0. Each writes [sum, sumsq, absmax (NaN ignored), nan count, inf count] to
    # out[slot, pid]. Sums accumulate in float64:
    # a bf16 value above 1.8e19 squared overflows float32, and the mean of a large
    # residual stream keeps its digits. A small tensor gets fewer programs than the
    # slot has rows (launching idle programs costs more than it reads); the programs
    # then zero the rows nobody writes, so the slot still sums right (ZERO_REST; a
    # caller that knows those rows already hold zeros skips it: graph-safe slots get the
    # same tensor size on every replay).
    pid = tl.program_id(0)
    slot_base = out_ptr + slot.to(tl.int64) * rows * 5
    program_row(x_ptr, n, per, pid, tl.num_programs(0), slot_base, rows, BLOCK, TILE, ZERO_REST)


# Up to MULTI tensors per launch, passed as (address, numel) integer pairs: one launch for
# a batch of a step's tensors, where one each cost a launch of ~26 us of host time (the
# driver's share alone is 21 us on the H200 host). Addresses are integers, not pointers,
# so that Triton compiles one variant per dtype and not one per alignment pattern. 64: a
# decode step's 40 to 60 small tensors in one launch (16 took four); the launch's extra
# arguments cost the host less than one more launch does.
MULTI = 64


@triton.jit
def _pick(t, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    # The t-th of 16 scalars (t is uniform across a program: a select chain, no branch).
    v = tl.where(t == 0, a0, a1)
    v = tl.where(t == 2, a2, v)
    v = tl.where(t == 3, a3, v)
    v = tl.where(t == 4, a4, v)
    v = tl.where(t == 5, a5, v)
    v = tl.where(t == 6, a6, v)
    v = tl.where(t == 7, a7, v)
    v = tl.where(t == 8, a8, v)
    v = tl.where(t == 9, a9, v)
    v = tl.where(t == 10, a10, v)
    v = tl.where(t == 11, a11, v)
    v = tl.where(t == 12, a12, v)
    v = tl.where(t == 13, a13, v)
    v = tl.where(t == 14, a14, v)
    v = tl.where(t == 15, a15, v)
    return v


@triton.jit
def _pick64(
    t,
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
    a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
    a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46, a47,
    a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60, a61, a62, a63,
):  # fmt: skip
    # The t-th of 64 scalars: the t-th of each group of 16, then the group's.
    v0 = _pick(t - 0, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
    v1 = _pick(t - 16, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31)
    v2 = _pick(t - 32, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46, a47)
    v3 = _pick(t - 48, a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60, a61, a62, a63)
    v = tl.where(t < 16, v0, tl.where(t < 32, v1, tl.where(t < 48, v2, v3)))
    return v


@triton.jit(do_not_specialize=[f"{k}{i}" for k in ("p", "n") for i in range(64)] + ["slot0", "rows"])
def stats_partials_multi(
    out_ptr, slot0, rows,
    p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15,
    p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31,
    p32, p33, p34, p35, p36, p37, p38, p39, p40, p41, p42, p43, p44, p45, p46, p47,
    p48, p49, p50, p51, p52, p53, p54, p55, p56, p57, p58, p59, p60, p61, p62, p63,
    n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
    n16, n17, n18, n19, n20, n21, n22, n23, n24, n25, n26, n27, n28, n29, n30, n31,
    n32, n33, n34, n35, n36, n37, n38, n39, n40, n41, n42, n43, n44, n45, n46, n47,
    n48, n49, n50, n51, n52, n53, n54, n55, n56, n57, n58, n59, n60, n61, n62, n63,
    DTYPE: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    # Grid (tensors, programs): program `pid` of tensor `t` reads its share of whole
    # blocks as stats_partials does (the same tiles, the tail block by program 0) and
    # writes its row to out[slot0 + t, pid]; rows [programs, rows) of the slot are
    # zeroed by the tensor's programs, so the slot sums right whatever it held.
    t = tl.program_id(0)
    pid = tl.program_id(1)
    grid = tl.num_programs(1)
    addr = _pick64(
        t,
        p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15,
        p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31,
        p32, p33, p34, p35, p36, p37, p38, p39, p40, p41, p42, p43, p44, p45, p46, p47,
        p48, p49, p50, p51, p52, p53, p54, p55, p56, p57, p58, p59, p60, p61, p62, p63,
    )  # fmt: skip
    n = _pick64(
        t,
        n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
        n16, n17, n18, n19, n20, n21, n22, n23, n24, n25, n26, n27, n28, n29, n30, n31,
        n32, n33, n34, n35, n36, n37, n38, n39, n40, n41, n42, n43, n44, n45, n46, n47,
        n48, n49, n50, n51, n52, n53, n54, n55, n56, n57, n58, n59, n60, n61, n62, n63,
    ).to(tl.int64)  # fmt: skip
    x_ptr = addr.to(tl.pointer_type(DTYPE))
    full = n // BLOCK
    per = (full + grid - 1) // grid
    per = (per + TILE - 1) // TILE * TILE
    slot_base = out_ptr + (slot0 + t).to(tl.int64) * rows * 5
    program_row(x_ptr, n, per, pid, grid, slot_base, rows, BLOCK, TILE, True)

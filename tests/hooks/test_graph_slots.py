"""Graph slots: masked, in-graph statistics with an asynchronous read-back.

Every scenario runs twice: here on the torch path (CPU, no interpreter), and, through
``test_triton_interpreter.py``, in a child pytest with
``TRITON_INTERPRET=1`` set before Triton is imported, where the same tests use the Triton
kernel. The CPU has no graphs: :func:`replay` does what a replay does (the memset, then
every captured reduction again, reading ``real_bs`` from the device scalar).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from spectrace.hooks import graph_slots as G
from spectrace.hooks.tensor_stats import ABSMAX, INF, NAN, SUM, SUMSQ

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("SPECTRACE_FUSED_STATS", raising=False)


def slots(**kw: Any) -> G.GraphSlots:
    gs = G.GraphSlots("cpu", fused=INTERP, **kw)
    assert gs.fused is INTERP  # the kernel in the child run, the torch path here
    return gs


# ------------------------------------------------------------------ helpers
def capture(gs: G.GraphSlots, key: Any, capture_bs: int, calls: list[dict[str, Any]]) -> tuple[G.SlotTable, list[dict[str, Any]]]:
    """begin_capture -> record per call -> end_capture; returns the table and the calls that got a slot."""
    gs.begin_capture(key, capture_bs=capture_bs, label=f"bs={capture_bs}", meta={"mode": "decode"})
    kept = []
    for i, call in enumerate(calls):
        args = {k: v for k, v in call.items() if k != "tensor"}
        if gs.record(call["tensor"], name=f"t{i}", role="hidden", module_type="Linear", arg="output", **args) is not None:
            kept.append(call)
    table = gs.end_capture()
    assert table is not None and gs.capturing_table() is None
    return table, kept


def replay(gs: G.GraphSlots, key: Any, real_bs: int, calls: list[dict[str, Any]], context: dict | None = None) -> bool:
    """A graph replay, emulated on the CPU (tests only): the memset node, then each slot's reduction.

    The reductions read ``table.real_bs`` as written by before_replay, exactly as the
    captured kernels do.
    """
    sampled = gs.before_replay(key, real_bs)
    table = gs.tables[key]
    table.rows.zero_()
    for slot, call in zip(table.slots, calls):
        p = gs._prepare(call["tensor"], call.get("add"), call.get("cols"))
        gs._enqueue(table.rows, table.real_bs, slot.index, p, slot.rows_per_seq)
    gs.after_replay(key, context if context is not None else {})
    return sampled


def ref(t: torch.Tensor) -> dict[str, Any]:
    r = t.detach().to(torch.float64)
    nan = int(torch.isnan(r).sum())
    inf = int(torch.isinf(r).sum())
    finite = not (nan or inf)
    return {
        "mean": r.mean().item() if finite else None,
        "std": r.std(unbiased=False).item() if finite else None,
        "absmax": r[~torch.isnan(r)].abs().max().item() if nan == 0 else None,
        "nan": nan,
        "inf": inf,
        "numel": r.numel(),
    }


def assert_stats(got: dict[str, Any], want: dict[str, Any], rel: float = 1e-9) -> None:
    assert (got["numel"], got["nan"], got["inf"]) == (want["numel"], want["nan"], want["inf"])
    for field in ("mean", "std", "absmax"):
        if want[field] is None:
            assert got[field] is None, field
        else:
            assert got[field] == pytest.approx(want[field], rel=rel, abs=1e-12), field


def garbage(t: torch.Tensor, real_rows: int, seed: int = 0) -> None:
    """Fill the padded rows as a replay leaves them: NaN, inf, huge values, leftovers."""
    pad = t[real_rows:]
    if pad.numel() == 0:
        return
    big = 6e4 if t.dtype == torch.float16 else 1e30
    pad.copy_(torch.randn(pad.shape, generator=torch.Generator().manual_seed(seed)) * big)
    flat = pad.view(-1) if pad.is_contiguous() else pad.reshape(-1)
    flat[::3] = math.nan
    flat[1::5] = -math.inf
    if not pad.is_contiguous():
        pad.copy_(flat.view(pad.shape))


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale + 0.3).to(dtype)


# ------------------------------------------------------------------ statistics
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_rows_do_not_count(dtype):
    gs = slots()
    capture_bs, per_seq, width = 8, 2, 2 * 40 + 3  # partial blocks and more than one per row
    x = randn(capture_bs * per_seq, width, dtype=dtype, seed=1)
    special = randn(capture_bs, 7, dtype=dtype, seed=2)
    special[1, 2], special[2, 3], special[3, 0] = math.nan, math.inf, -math.inf
    calls = [{"tensor": x}, {"tensor": special}, {"tensor": randn(capture_bs, dtype=dtype, seed=3)}]
    table, kept = capture(gs, "k", capture_bs, calls)
    assert [s.rows_per_seq for s in table.slots] == [per_seq, 1, 1]
    assert [s.row_elems for s in table.slots] == [width, 7, 1]
    real_bs = 5
    for call in calls:
        garbage(call["tensor"], real_bs * (per_seq if call["tensor"] is x else 1))
    assert replay(gs, "k", real_bs, kept)
    (out,) = gs.poll()
    assert out.real_bs == real_bs and out.table is table
    assert_stats(gs.stats_of(out, table.slots[0]), ref(x[: real_bs * per_seq]))
    assert_stats(gs.stats_of(out, 1), ref(special[:real_bs]))  # a NaN and infs of real rows do count
    assert_stats(gs.stats_of(out, 2), ref(calls[2]["tensor"][:real_bs]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_gives_the_statistics_of_the_sum(dtype):
    gs = slots()
    mlp, residual = randn(6, 50, dtype=dtype, seed=4), randn(6, 50, dtype=dtype, seed=5, scale=20)
    table, kept = capture(gs, "k", 6, [{"tensor": mlp, "add": residual}])
    garbage(mlp, 4)
    garbage(residual, 4, seed=1)
    replay(gs, "k", 4, kept)
    (out,) = gs.poll()
    # Summed in float32 by the kernel, not rounded to the dtype: the float64 sum of the inputs.
    assert_stats(gs.stats_of(out, 0), ref(mlp[:4].double() + residual[:4].double()), rel=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cols_reduce_one_chunk_of_a_concat(dtype):
    gs = slots()
    hidden = 37
    aux = randn(8, 3 * hidden, dtype=dtype, seed=6)
    other = randn(8, 3 * hidden, dtype=dtype, seed=7)
    calls = [{"tensor": aux, "cols": (i * hidden, (i + 1) * hidden)} for i in range(3)]
    calls.append({"tensor": aux, "add": other, "cols": (hidden, 2 * hidden)})
    table, kept = capture(gs, "k", 8, calls)
    assert [s.row_elems for s in table.slots] == [hidden] * 4
    assert table.slots[1].padded_shape == [8, 3 * hidden]
    garbage(aux, 3)
    replay(gs, "k", 3, kept)
    (out,) = gs.poll()
    for i in range(3):
        assert_stats(gs.stats_of(out, i), ref(aux[:3, i * hidden : (i + 1) * hidden]))
    summed = aux[:3, hidden : 2 * hidden].double() + other[:3, hidden : 2 * hidden].double()
    assert_stats(gs.stats_of(out, 3), ref(summed), rel=1e-6)


def test_replays_with_different_real_batches_give_their_own_statistics():
    gs = slots()
    x = randn(8, 64, dtype=torch.bfloat16, seed=8)
    x[3:] *= 50  # later rows are much larger: each real batch has its own statistics
    table, kept = capture(gs, "k", 8, [{"tensor": x}])
    for n, real_bs in enumerate((3, 7, 3)):
        replay(gs, "k", real_bs, kept, {"replay": n})
        (out,) = gs.poll()
        assert out.context == {"replay": n}
        assert_stats(gs.stats_of(out, 0), ref(x[:real_bs]))
    assert gs.replays == gs.sampled == 3


def test_unmaskable_tensors_are_reduced_whole_and_strided_ones_take_the_torch_path():
    gs = slots()
    odd = randn(5, 9, seed=9)  # 5 rows at capture_bs 4: not batch-major, never masked
    strided = randn(16, 8, seed=10).t()  # [8, 16], columns not contiguous
    scalar = torch.tensor(2.5)
    table, kept = capture(gs, "k", 4, [{"tensor": odd}, {"tensor": strided}, {"tensor": scalar}, {"tensor": odd, "rows_per_seq": 1}])
    assert table.slots[0].rows_per_seq == 5 and table.slots[1].rows_per_seq == 2
    replay(gs, "k", 2, kept)
    (out,) = gs.poll()
    assert_stats(gs.stats_of(out, 0), ref(odd))
    assert_stats(gs.stats_of(out, 1), ref(strided[:4]))
    assert_stats(gs.stats_of(out, 2), ref(scalar.reshape(1)))
    assert_stats(gs.stats_of(out, 3), ref(odd[:2]))  # an explicit rows_per_seq masks


def test_a_replay_of_no_real_rows_has_no_statistics():
    gs = slots()
    table, kept = capture(gs, "k", 4, [{"tensor": randn(4, 3)}])
    replay(gs, "k", 0, kept)
    (out,) = gs.poll()
    assert out.values[0] == [0.0] * 5
    assert gs.stats_of(out, 0) == {"mean": None, "std": None, "absmax": None, "nan": 0, "inf": 0, "numel": 0}


# ------------------------------------------------------------------ tables
def test_slot_metadata_and_table_memory():
    gs = slots(capacity=8)
    x = randn(4, 6, dtype=torch.float16)
    gs.begin_capture(("draft", 4), capture_bs=4, label="draft bs=4", meta={"mode": "draft_decode"})
    assert gs.record(torch.arange(4), name="ids", role=None, module_type="Embedding", arg="input") is None
    index = gs.record(x, name="layer.0", role="hidden", module_type="LlamaDecoderLayer", arg="output", draft_step=2, meta={"k": 1})
    table = gs.end_capture()
    assert index == 0 and table is gs.tables[("draft", 4)]
    info = table.slots[0]
    assert (info.name, info.role, info.module_type, info.arg, info.draft_step) == ("layer.0", "hidden", "LlamaDecoderLayer", "output", 2)
    assert (info.call_index, info.padded_shape, info.rows_per_seq, info.row_elems, info.dtype) == (1, [4, 6], 1, 6, "float16")
    assert info.meta == {"k": 1} and table.meta == {"mode": "draft_decode"} and table.capture_bs == 4 and table.label == "draft bs=4"
    assert table.rows.shape == (8, 5) and table.rows.dtype == torch.float64 and table.real_bs.tolist() == [4]
    assert table.memory_bytes() == 8 * 5 * 8 + 8


def test_recapture_of_a_key_replaces_its_table():
    gs = slots()
    old, _ = capture(gs, "k", 4, [{"tensor": randn(4, 3)}, {"tensor": randn(4, 3)}])
    new_x = randn(4, 5, seed=3)
    new, kept = capture(gs, "k", 4, [{"tensor": new_x}])
    assert gs.tables["k"] is new and new is not old and len(gs.tables) == 1
    assert [s.index for s in new.slots] == [0] and new.slots[0].padded_shape == [4, 5]
    replay(gs, "k", 4, kept)
    (out,) = gs.poll()
    assert out.table is new and len(out.values) == 1
    assert_stats(gs.stats_of(out, 0), ref(new_x))


def test_full_table_and_unsupported_tensors_are_dropped_and_counted():
    gs = slots(capacity=2)
    assert gs.record(randn(2, 2), name="x", role=None, module_type="M", arg="output") is None  # not capturing: ignored
    assert gs.dropped_slots == 0
    gs.begin_capture("k", capture_bs=2, label="bs=2")
    kw = {"role": None, "module_type": "M", "arg": "output"}
    assert gs.record(torch.ones(2, 2, dtype=torch.int64), name="ids", **kw) is None
    assert gs.record(torch.ones(2, dtype=torch.bool), name="mask", **kw) is None
    assert gs.record(torch.empty(0, 4), name="empty", **kw) is None
    assert gs.record(randn(2, 4), name="bad cols", cols=(3, 9), **kw) is None
    assert gs.record(randn(2, 4), name="bad add", add=randn(3, 4), **kw) is None
    assert gs.record(randn(2, 4), name="a", **kw) == 0
    assert gs.record(randn(2, 4), name="b", **kw) == 1
    assert gs.record(randn(2, 4), name="c", **kw) is None  # full
    table = gs.end_capture()
    assert gs.dropped_slots == 6 and [s.name for s in table.slots] == ["a", "b"]
    assert [s.call_index for s in table.slots] == [5, 6]


# ------------------------------------------------------------------ read-back
def test_a_full_ring_drops_read_backs_and_counts_them():
    gs = slots(ring=2)
    table, kept = capture(gs, "k", 2, [{"tensor": randn(2, 3)}])
    for n in range(3):
        replay(gs, "k", 2, kept, {"n": n})
    assert gs.dropped_ring == 1 and gs.sampled == 3
    assert [r.context["n"] for r in gs.poll()] == [0, 1]
    assert gs.poll() == []
    replay(gs, "k", 1, kept, {"n": 3})  # entries came back with the poll
    assert [r.context["n"] for r in gs.poll()] == [3] and gs.dropped_ring == 1


def test_unsampled_replays_are_not_read_back():
    gs = slots(sample=3)
    x = randn(4, 8, seed=12)
    table, kept = capture(gs, "k", 4, [{"tensor": x}])
    sampled = [replay(gs, "k", 1 + n % 4, kept, {"n": n}) for n in range(9)]
    assert sampled == [True, False, False] * 3
    assert (gs.replays, gs.sampled) == (9, 3)
    outs = gs.poll()
    assert [r.context["n"] for r in outs] == [0, 3, 6]
    for r in outs:
        assert_stats(gs.stats_of(r, 0), ref(x[: r.real_bs]))
    assert gs.after_replay("k", {}) is False  # nothing armed


def test_unknown_keys_and_empty_tables_read_nothing():
    gs = slots()
    assert gs.before_replay("nope", 3) is False and gs.after_replay("nope", {}) is False
    gs.begin_capture("empty", capture_bs=2, label="")
    gs.end_capture()
    assert gs.before_replay("empty", 2) is True and gs.after_replay("empty", {}) is False
    assert gs.poll() == [] and gs.replays == 1


# ------------------------------------------------------------------ the kernel itself
needs_interp = pytest.mark.skipif(not INTERP, reason="the Triton kernel on the CPU needs TRITON_INTERPRET=1")


@needs_interp
def test_kernel_matches_the_torch_path_and_passes_its_self_check():
    assert G.check_kernel("cpu")
    real_bs = torch.tensor([3], dtype=torch.int64)
    for dtype in DTYPES:
        x = randn(8, 2 * 40 + 9, dtype=dtype, seed=13)
        y = randn(8, 2 * 40 + 9, dtype=dtype, seed=14)
        x[0, 1], x[2, 5], x[1, 0] = math.nan, math.inf, -math.inf
        garbage(x, 6)
        # Each launch shape (the narrow one of small tensors, the wide one), each case.
        for (add, cols), small in itertools.product(((None, None), (y, None), (None, (9, 60)), (y, (40, 89))), (True, False)):
            start, stop = cols or (0, x.shape[1])
            rows = torch.zeros(3, 5, dtype=torch.float64)
            G._launch(rows, real_bs, 2, x, add, start, stop - start, 2, small=small)
            want = G.masked_row(x[:, start:stop], None if add is None else add[:, start:stop], real_bs, 2)
            got = rows[2]
            assert bool((rows[:2] == 0).all())
            assert got[NAN] == want[NAN] and got[INF] == want[INF] and got[ABSMAX] == want[ABSMAX]
            for i in (SUM, SUMSQ):
                assert got[i].item() == pytest.approx(want[i].item(), rel=1e-12, nan_ok=True)


def test_small_tensors_take_the_narrow_launch_and_large_ones_the_wide_one():
    assert G.launch_shape(1, 4096) == G.SMALL_LAUNCH  # a decode step's hidden state at batch 1
    assert G.launch_shape(4, G.SMALL_ELEMENTS // 4) == G.SMALL_LAUNCH
    assert G.launch_shape(64, 4096) == (G.BLOCK, G.WARPS, G.MIN_BLOCKS_PER_PROGRAM)


@needs_interp
def test_warm_compiles_each_variant_once():
    gs = slots()
    x = randn(4, 8, dtype=torch.float16)
    for small in (True, False):
        G._warmed.discard(("cpu", torch.float16, torch.float32, small))
    gs.warm(x, add=randn(4, 8))
    # Both launch shapes: a capture at a larger batch takes the wide one.
    assert {("cpu", torch.float16, torch.float32, small) for small in (True, False)} <= G._warmed
    gs.warm(x, add=randn(4, 8), cols=(2, 5))  # a no-op now
    gs.warm(torch.ones(4, dtype=torch.int64))  # unsupported: nothing to compile


def test_kernel_is_off_without_the_interpreter_or_when_disabled(monkeypatch):
    if not INTERP:
        assert G.GraphSlots("cpu", fused=True).fused is False  # no CUDA, no interpreter
    monkeypatch.setitem(G._kernel_state, "kernel", None)  # as SPECTRACE_FUSED_STATS=0 leaves it
    assert G.GraphSlots("cpu").fused is False


# ------------------------------------------------------------------ a real CUDA graph
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replays_mask_padding_and_read_back_without_a_sync():
    dev = torch.device("cuda", torch.cuda.current_device())
    gs = G.GraphSlots(dev, capacity=8, ring=8)
    assert gs.fused, "the kernel failed its self-check on this GPU"
    capture_bs, per_seq, hidden = 8, 2, 1024
    x = torch.randn(capture_bs * per_seq, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) * 0.03

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ w
        aux = torch.cat([h, h * 2, x], dim=-1)
        kw = {"name": "layer", "role": "hidden", "module_type": "Layer"}
        gs.record(h, arg="output", **kw)  # outside a capture: ignored
        gs.record(h, arg="output.residual_stream", add=x, **kw)
        gs.record(aux, arg="output.chunk[1]", cols=(hidden, 2 * hidden), **kw)
        return h, aux

    h0, aux0 = step()  # eager, outside any capture: the records are ignored
    for args in ((h0,), (h0, x), (aux0, None, (hidden, 2 * hidden))):
        gs.warm(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graphs = {}
    gs.begin_capture("before", capture_bs=capture_bs, label="allocated before capture")
    graphs["before"] = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graphs["before"]):
        outs = {"before": step()}
    gs.end_capture()
    graphs["inside"] = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graphs["inside"]):
        gs.begin_capture("inside", capture_bs=capture_bs, label="allocated during capture")
        outs["inside"] = step()
        gs.end_capture()
    assert gs.unwarmed == 0 and gs.dropped_slots == 0
    assert all(len(gs.tables[k].slots) == 3 for k in graphs)
    # The default: every kernel inline (a side branch is opt-in).
    assert gs.tables["inside"].branch is None and gs.tables["before"].branch is None
    assert gs.branch.forks == 0

    refs, landed = [], []
    for n, (key, real_bs) in enumerate([("before", 3), ("inside", 5), ("before", 8), ("inside", 1), ("before", 6)]):
        real = real_bs * per_seq
        x.copy_(torch.randn_like(x) * (n + 1))
        x[real:] = math.nan  # padding: garbage every replay
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            assert gs.before_replay(key, real_bs)
            graphs[key].replay()
            assert gs.after_replay(key, {"n": n})
            landed += gs.poll()  # never waits: the copy may or may not have landed yet
        finally:
            torch.cuda.set_sync_debug_mode(0)
        h, aux = outs[key]
        refs.append([ref(h[:real]), ref(h[:real].double() + x[:real].double()), ref(aux[:real, hidden : 2 * hidden])])
    torch.cuda.synchronize()
    readouts = landed + gs.poll()
    assert sorted(r.context["n"] for r in readouts) == [0, 1, 2, 3, 4]
    for r in readouts:
        want = refs[r.context["n"]]
        for slot in r.table.slots:
            assert_stats(gs.stats_of(r, slot), want[slot.index], rel=1e-5)
    assert gs.sampled == 5 and gs.dropped_ring == 0


def capture_and_replay(
    gs: G.GraphSlots, x: torch.Tensor, bs: int, step: Any, replays: int = 3
) -> Iterator[tuple[G.Readout, list[torch.Tensor]]]:
    """Warm ``step(record=False)`` on a side stream, capture ``step(record=True)`` into one
    table, then replay on new inputs in ``x``: yields each replay's read-back and the
    tensors ``step(record=False)`` gives eagerly on the same inputs (the same kernels)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(record=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gs.begin_capture("decode", capture_bs=bs, label="decode")
        step(record=True)
        gs.end_capture()
    for n in range(replays):
        x.copy_(torch.randn_like(x) * (n + 1))
        assert gs.before_replay("decode", bs)
        graph.replay()
        assert gs.after_replay("decode", {"n": n})
        torch.cuda.synchronize()
        (readout,) = gs.poll()
        yield readout, step(record=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("overlap", [True, False], ids=["side_branch", "inline"])
def test_cuda_graph_side_branch_reads_each_tensor_before_its_memory_is_reused(overlap):
    """Each layer's output is dropped at once; the graph's pool would hand its block to the
    next layers while a side-branch kernel still has to read it. Every replay's statistics
    must be those of the values the layer wrote."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gs = G.GraphSlots(dev, capacity=16, ring=8, overlap=overlap)
    assert gs.fused, "the kernel failed its self-check on this GPU"
    bs, hidden, layers = 4, 2048, 8
    x = torch.randn(bs, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) * (1.0 / hidden**0.5)

    def step(record: bool) -> list[torch.Tensor]:
        h, outs = x, []
        for i in range(layers):
            y = h @ w + (i + 1)
            if record:
                gs.record(y, name=f"layers.{i}", role="hidden", module_type="Layer", arg="output")
            else:
                outs.append(y)
            h = torch.tanh(y) * 3  # y's block is free from the next layer on
        return outs

    gs.warm(x @ w)
    for readout, want in capture_and_replay(gs, x, bs, step):
        assert len(readout.table.slots) == layers and gs.branch.forks == (layers if overlap else 0)
        for slot in readout.table.slots:
            assert_stats(gs.stats_of(readout, slot), ref(want[slot.index]), rel=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "side_branch"])
def test_cuda_graph_a_tensor_rewritten_in_place_later_is_read_as_written_or_flagged(overlap):
    """An engine's fused add + RMSNorm rewrites the residual stream it is handed. The default
    (inline) kernels see each tensor as its module left it, whatever runs after; on the side
    branch a torch op's in-place write is seen at the join and the slot gives no statistics."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gs = G.GraphSlots(dev, capacity=16, ring=8, overlap=overlap)
    assert gs.fused and (gs.branch.stream is not None) == overlap
    bs, hidden, layers = 4, 2048, 6
    x = torch.randn(bs, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) * (1.0 / hidden**0.5)
    residual = torch.zeros(bs, hidden, device=dev, dtype=torch.bfloat16)

    def step(record: bool) -> list[torch.Tensor]:
        residual.copy_(x)
        seen = []
        for i in range(layers):
            if record:
                gs.record(residual, name=f"layers.{i}", role="hidden", module_type="Layer", arg="input[1]")
            else:
                seen.append(residual.clone())
            residual.add_(torch.tanh(residual @ w))  # the next kernel writes the recorded tensor in place
        return seen

    gs.warm(residual)
    for readout, want in capture_and_replay(gs, x, bs, step):
        for slot in readout.table.slots:
            if overlap:
                assert slot.meta["written_in_place"]
                assert gs.stats_of(readout, slot)["mean"] is None
            else:
                assert_stats(gs.stats_of(readout, slot), ref(want[slot.index]), rel=1e-5)
    assert gs.written_in_place == (layers if overlap else 0)

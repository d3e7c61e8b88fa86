"""Graph-safe statistics (static buffer slots) and the deferred read-back of StepStats.

The CUDA-graph parts run only where CUDA is present; on the CPU the same objects run
eagerly, which tests slots, reduction and values against float64. With
``TRITON_INTERPRET=1`` and Triton importable, the fused kernel itself is checked on CPU.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch

from spectrace.hooks import fused_stats as F
from spectrace.hooks import readback as R
from spectrace.hooks import tensor_stats as T
from spectrace.hooks.graphsafe import GraphStats
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


@pytest.fixture
def cpu_programs():
    """Pin the fused kernel's partial rows per tensor on the CPU; recomputed after the test."""
    yield lambda count: F.set_programs("cpu", count)
    F.set_programs("cpu", None)


def _ref(t: torch.Tensor) -> dict:
    r = t.detach().to(torch.float64)
    nan = int(torch.isnan(r).sum())
    return {
        "mean": r.mean().item(),
        "std": r.std(unbiased=False).item(),
        "absmax": r[~torch.isnan(r)].abs().max().item() if nan == 0 else None,
        "nan": nan,
        "inf": int(torch.isinf(r).sum()),
        "numel": r.numel(),
    }


def _assert_close(stats, ref: dict) -> None:
    assert stats.numel == ref["numel"] and stats.nan == ref["nan"] and stats.inf == ref["inf"]
    if ref["nan"] or ref["inf"]:
        assert stats.mean is None
    else:
        assert stats.mean == pytest.approx(ref["mean"], abs=1e-5)
        assert stats.std == pytest.approx(ref["std"], rel=1e-4)
    if ref["absmax"] is None:
        assert stats.absmax is None
    else:
        assert stats.absmax == pytest.approx(ref["absmax"], rel=1e-6)


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weird = torch.randn(5, 7, generator=gen)
    weird[0, 0], weird[1, 1], weird[2, 2] = math.nan, math.inf, -math.inf
    only_inf = torch.randn(9, generator=gen)
    only_inf[4] = math.inf
    return {
        "f32": torch.randn(3, 257, generator=gen) * 2 + 0.5,
        "bf16": (torch.randn(4, 64, generator=gen) + 1).to(torch.bfloat16),
        "f16": torch.randn(2, 33, generator=gen).to(torch.float16),
        "strided": torch.randn(16, 12, generator=gen).t(),
        "int8": torch.randint(-50, 50, (6, 6), generator=gen).to(torch.int8),
        "weird": weird,
        "only_inf": only_inf,
        "scalar": torch.tensor(-3.25),
    }


def test_graph_stats_slots_and_values_match_float64_on_cpu():
    gs = GraphStats(capacity=16, device="cpu")
    tensors = _tensors()
    for name, t in tensors.items():
        assert gs.record(name, t)
    assert not gs.record("bool", torch.ones(3, dtype=torch.bool))
    assert not gs.record("empty", torch.empty(0))
    assert not gs.record("token_ids", torch.randint(0, 100, (1, 4)))  # int64 ids: never summarised
    assert list(gs.slots) == list(tensors)
    got = gs.read()
    for name, t in tensors.items():
        _assert_close(got[name], _ref(t))
    # Recording again into the same slots overwrites them (what a replay does).
    gs.record("f32", tensors["f32"] * 3)
    assert gs.read(["f32"])["f32"].mean == pytest.approx(_ref(tensors["f32"] * 3)["mean"], abs=1e-5)


def test_graph_stats_capacity_is_enforced():
    gs = GraphStats(capacity=2, device="cpu")
    gs.record("a", torch.ones(2))
    gs.record("b", torch.ones(2))
    with pytest.raises(IndexError):
        gs.record("c", torch.ones(2))


def test_graph_stats_for_modules_refreshes_per_call_and_removes_hooks():
    model = tiny_llama()
    seen = {}
    h = model.model.layers[1].register_forward_hook(
        lambda m, a, o: seen.__setitem__("x", (o[0] if isinstance(o, tuple) else o).detach().clone())
    )
    gs = GraphStats.for_modules(model, ["model.layers.*", "lm_head"])
    assert list(gs.slots) == [f"model.layers.{i}" for i in range(4)] + ["lm_head"]
    with torch.no_grad():
        model(torch.randint(0, 128, (2, 9)))
    first = gs.read()
    _assert_close(first["model.layers.1"], _ref(seen["x"]))
    with torch.no_grad():
        model(torch.randint(0, 128, (2, 9)) + 0)
        model(torch.arange(18).view(2, 9))
    second = gs.read()
    _assert_close(second["model.layers.1"], _ref(seen["x"]))
    assert second["lm_head"].mean != first["lm_head"].mean
    gs.remove()
    h.remove()
    assert all(not m._forward_hooks for m in model.modules())


def test_step_stats_reduce_an_unchanged_tensor_once():
    x = torch.randn(8, 8)
    step = R.StepStats()
    a = step.add(x)
    assert step.add(x) == a and len(step) == 1  # layer i's output is layer i+1's input
    x.add_(1.0)  # in place: a new version, so a new row
    b = step.add(x)
    assert b != a and len(step) == 2
    readback = step.start_readback()
    assert len(step) == 0 and step.generation != readback.generation  # the next step starts clean
    values = readback.values()
    assert values[b][T.SUM] == pytest.approx(x.double().sum().item(), abs=1e-3)
    assert values[a][T.SUM] == pytest.approx(x.double().sum().item() - 64, abs=1e-3)


def test_step_stats_read_back_in_entry_order_and_empty_steps_give_none():
    step = R.StepStats()
    tensors = [torch.full((4,), float(i + 1)) for i in range(3)]
    indices = [step.add(t) for t in tensors]
    values = step.start_readback().values()
    assert [T.to_stats(values[i], 4).mean for i in indices] == [1.0, 2.0, 3.0]
    assert step.start_readback() is None


def test_statistics_of_huge_values_do_not_overflow():
    x = torch.full((16,), 3e20)  # a float32 square overflows above 1.8e19
    stats = T.to_stats(R.device_stats(x).tolist(), 16)
    assert stats.std == pytest.approx(0.0, abs=1e15) and stats.mean == pytest.approx(3e20, rel=1e-6)


def test_reduce_rows_combines_partials():
    x = torch.randn(1000, dtype=torch.float64)
    x[17] = math.nan
    parts = torch.zeros(4, 5)
    for i, chunk in enumerate(x.chunk(4)):
        finite = chunk[~torch.isnan(chunk)]
        parts[i] = torch.tensor([chunk.sum(), (chunk * chunk).sum(), finite.abs().max(), torch.isnan(chunk).sum(), 0])
    row = T.reduce_rows([parts])[0].tolist()
    stats = T.to_stats(row, 1000)
    assert stats.nan == 1 and stats.mean is None and stats.absmax is None
    assert row[T.ABSMAX] == pytest.approx(x[~torch.isnan(x)].abs().max().item(), rel=1e-6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="fused kernel on CPU needs TRITON_INTERPRET=1")
def test_fused_kernel_matches_float64_in_the_interpreter():
    pytest.importorskip("triton")
    assert F.check_fused("cpu")
    gs = GraphStats(capacity=16, device="cpu", fused=True)
    tensors = _tensors()
    for name, t in tensors.items():
        gs.record(name, t)
    got = gs.read()
    for name, t in tensors.items():
        _assert_close(got[name], _ref(t))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="fused kernel on CPU needs TRITON_INTERPRET=1")
def test_fused_kernel_zeroes_the_rows_a_small_tensor_leaves_unwritten(cpu_programs):
    pytest.importorskip("triton")
    cpu_programs(700)  # 700 rows, far more than programs
    for n in (1, 100, 4 * F.BLOCK, 13 * F.BLOCK + 5, 3000 * F.BLOCK + 3):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
        out = torch.full((3, 700, 5), 7.0, dtype=torch.float64)  # stale values from an earlier step
        F.launch_partials(x, out, 1)
        row = T.reduce_partials(out[1:2])[0].tolist()
        r = x.double()
        assert row[T.SUM] == pytest.approx(r.sum().item(), abs=1e-6 * r.abs().sum().item())
        assert row[T.SUMSQ] == pytest.approx((r * r).sum().item(), rel=1e-9)
        assert row[T.ABSMAX] == r.abs().max().item() and row[T.NAN] == 0 and row[T.INF] == 0
        assert bool((out[0] == 7).all() and (out[2] == 7).all())  # neighbouring slots untouched


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _capture(step, overlapped: GraphStats | None = None):
    """Warm ``step`` on a side stream, then capture it (inside ``overlapped.overlapped()``
    when given, joined before the capture ends); returns the graph and the step's output."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        if overlapped is None:
            return g, step()
        with overlapped.overlapped():
            return g, step()


@cuda
@pytest.mark.parametrize(
    "overlap, in_place", [(False, False), (True, False), (True, True)], ids=["inline", "side_branch", "side_branch_written_in_place"]
)
def test_graph_capture_refreshes_stats_on_replay(overlap, in_place):
    """Every replay refreshes the slots. On a side branch, a tensor a torch op writes in
    place after its record (the branch may read either value) is seen at the join and
    reads None; the others keep their statistics."""
    dev = torch.device("cuda")
    w = torch.randn(256, 256, device=dev, dtype=torch.bfloat16) * 0.05
    x = torch.randn(8, 256, device=dev, dtype=torch.bfloat16)
    gs = GraphStats(capacity=4, device=dev)

    def step():
        h = x @ w
        gs.record("h", h)
        h = h.relu_() if in_place else torch.relu(h)
        o = h @ w
        gs.record("o", o)
        return o

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, out = _capture(step, gs if overlap else None)
    said = [str(w.message) for w in caught if "written in place" in str(w.message)]
    assert said == (
        [
            "spectrace GraphStats: 1 slot(s) written in place after their statistics kernel was forked (h): they read None; record them outside overlapped()"
        ]
        if in_place
        else []
    )
    assert gs._branch.forks == (2 if overlap else 0)
    assert gs.written_in_place == ({gs.slots["h"]} if in_place else set())
    for scale in (1.0, 3.0):
        x.mul_(scale)
        g.replay()
        got = gs.read()
        _assert_close(got["o"], _ref(out))
        assert (got["h"] is None) == in_place


@cuda
def test_traced_forward_has_no_host_sync():
    import spectrace

    model = tiny_llama().cuda()
    ids = torch.randint(0, 128, (2, 9), device="cuda")
    F.prepare("cuda")
    with torch.no_grad(), spectrace.trace(model) as t:
        model(ids)  # warm-up: kernels compiled, pinned buffers cached
        t.tracer.finish_step()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(ids)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # Every output has statistics but the embedding's (a function of one token id: privacy.py).
    calls = t.calls()
    assert all(m.stats is not None for c in calls if c.module != "model.embed_tokens" for m in c.outputs)
    assert all(m.stats is None for c in calls if c.module == "model.embed_tokens" for m in c.outputs)


def test_step_readback_reduces_each_slot_of_a_step_buffer():
    """The fused path's read-back: one row per slot, then the torch-path rows, back in entry order."""
    tensors = [torch.randn(40, generator=torch.Generator().manual_seed(i)) * (i + 1) for i in range(3)]
    buffer = R.SlotBuffer(torch.device("cpu"), capacity=4)
    programs = buffer.tensor.shape[1]
    entries = []
    for slot, t in enumerate(tensors[:2]):
        buffer.tensor[slot].zero_()
        for p, chunk in enumerate(t.chunk(programs)):  # what the kernel writes: partials per program
            c = chunk.double()
            buffer.tensor[slot, p] = torch.tensor([c.sum(), (c * c).sum(), c.abs().max(), 0, 0])
        buffer.used += 1
        entries.append(("slot", buffer, slot))
    entries.insert(1, ("row", T.cpu_stats(tensors[2])))  # a slow-path row between the slots
    copy = R.copy_rows(torch.device("cpu"), entries, [0, 1, 2], buffer)
    values = dict(zip(copy.indices, copy.host.tolist()))
    for index, t in zip([0, 2, 1], tensors):
        got = T.to_stats(values[index], t.numel())
        assert got.mean == pytest.approx(t.double().mean().item(), abs=1e-6)
        assert got.absmax == pytest.approx(t.abs().max().item(), rel=1e-6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="fused kernel on CPU needs TRITON_INTERPRET=1")
def test_graph_slots_skip_zeroing_only_when_the_rows_left_are_known_zero(cpu_programs):
    pytest.importorskip("triton")
    cpu_programs(64)
    assert F.check_fused("cpu")  # compiles and checks both kernel variants
    gs = GraphStats(capacity=2, device="cpu", fused=True)
    big = torch.randn(40 * F.BLOCK, generator=torch.Generator().manual_seed(1)) * 2
    small = torch.randn(3 * F.BLOCK + 7, generator=torch.Generator().manual_seed(2)) + 1
    for t in (small, small, big, small):  # same size (no zeroing), larger, then smaller again (must zero)
        gs.record("h", t)
        _assert_close(gs.read()["h"], _ref(t))
    assert gs._written[gs.slots["h"]] == 1  # the small tensor's single program


def test_a_torch_path_record_clears_rows_a_fused_launch_left_in_its_slot():
    gs = GraphStats(capacity=1, device="cpu", fused=True)  # P rows per slot; nothing launched below
    assert gs.programs > 1
    gs.buffer[0, 1:] = 5.0  # as a fused launch with more programs would have left them
    gs._written[0] = gs.programs
    x = torch.randn(100, generator=torch.Generator().manual_seed(3), dtype=torch.float64)  # not a kernel dtype
    gs.record("x", x)
    _assert_close(gs.read()["x"], _ref(x))
    assert gs._written[0] == 1


@cuda
def test_the_compiled_kernel_launched_directly_writes_what_the_regular_launch_writes():
    dev = torch.device("cuda", torch.cuda.current_device())
    assert F.prepare(dev)
    assert F._triton_state[("direct", dev.index, "single")], "the direct launch failed its check on this GPU"
    rows = F.programs_for(dev)
    base = (torch.randn(300_001, device=dev, dtype=torch.float32) * 3).to(torch.bfloat16)
    base[77] = math.nan
    # aligned; one element off (not 16-byte aligned: the regular launch); aligned again
    for x in (base, base[1:], base[8:]):
        regular = torch.full((2, rows, T.ROW), 3.0, device=dev, dtype=torch.float64)
        direct = torch.full_like(regular, 3.0)
        F.launch_partials(x, regular, 1, direct=False)
        F.launch_partials(x, direct, 1, direct=True)
        assert torch.equal(direct.nan_to_num(nan=-1.0), regular.nan_to_num(nan=-1.0))
        row = T.reduce_rows([direct[1]])[0].tolist()
        r = x.double().cpu()
        finite = r[~torch.isnan(r)]
        assert row[T.NAN] == 1 and row[T.ABSMAX] == float(finite.abs().max())

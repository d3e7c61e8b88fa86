"""Batched statistics launches: small accelerator tensors wait, held, for one launch per batch.

The kernel (``fused_stats.launch_multi``) must write exactly what one launch per tensor
(``launch_partials``) writes; the step's bookkeeping (``readback.StepStats`` with
``defer``) must give every tensor its own row in entry order, never read a tensor that was
written in place while held, and hold at most a batch. On the CPU the kernel runs under
Triton's interpreter (``test_triton_interpreter.py`` runs them in a child pytest that sets
``TRITON_INTERPRET=1`` before Triton loads), with
the step routing CPU tensors to the kernel path as CUDA tensors go; on a GPU the same
tests run on CUDA, plus a traced model compared with and without batching.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

from spectrace.hooks import fused_stats as F
from spectrace.hooks import readback as R
from spectrace.hooks.tensor_stats import ROW, cpu_row, reduce_partials, reduce_rows, stats_fields

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
needs_kernel = pytest.mark.skipif(not (INTERP or CUDA), reason="the Triton kernel needs CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture
def few_programs():
    device = torch.device(DEVICE, 0) if CUDA else torch.device("cpu")
    F.set_programs(device, 6)  # few partial rows: small tensors leave rows for the kernel to zero
    yield
    F.set_programs(device, None)


@pytest.fixture
def kernel_path(monkeypatch):
    """The step routes this device's float tensors to the fused kernel, batched where small."""
    if not CUDA:
        monkeypatch.setattr(R, "_route", lambda x: (x.device, True, True) if x.dtype in F.TRITON_DTYPES else None)
    else:
        assert F.prepare("cuda") and F.multi_ok(torch.device("cuda", torch.cuda.current_device()))


def _tensors(dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    xs = [(torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 0.25).to(dtype) for n in (1, 5, 1024, 3 * 1024 + 7, 41 * 1024 + 3)]
    xs[2][9] = math.nan
    xs[3][0] = -math.inf
    return [x.to(DEVICE) for x in xs]


def _rows(values: torch.Tensor) -> list[list[float]]:
    return values.nan_to_num(nan=-1.0).tolist()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_batched_launch_writes_what_one_launch_per_tensor_writes(dtype, few_programs):
    xs = _tensors(dtype)
    rows = F.programs_for(torch.device(DEVICE))
    one = torch.zeros(len(xs), rows, ROW, dtype=torch.float64, device=DEVICE)
    for i, x in enumerate(xs):
        F.launch_partials(x, one, i)
    # Stale values everywhere: every row of the batch's slots must be written, no other slot.
    batched = torch.full((len(xs) + 2, rows, ROW), 9.0, dtype=torch.float64, device=DEVICE)
    F.launch_multi(xs, batched, 1)
    # The batch splits each tensor over as many programs as its largest member takes, so
    # the partial rows may be cut elsewhere; their sums are the same numbers.
    got = reduce_rows([batched[1 + i] for i in range(len(xs))]).nan_to_num(nan=-1.0)
    want = reduce_rows([one[i] for i in range(len(xs))]).nan_to_num(nan=-1.0)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert bool((batched[0] == 9.0).all()) and bool((batched[-1] == 9.0).all())


@pytest.mark.skipif(not CUDA, reason="the compiled kernel is launched directly on a GPU only (the interpreter compiles nothing)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_kernel_launched_directly_writes_what_the_regular_launch_writes(dtype, monkeypatch):
    assert F.prepare("cuda")
    device = torch.cuda.current_device()
    assert F._triton_state.get(("direct", device, dtype)), "the direct launch was refused by its self-check"
    direct: list[int] = []
    real = F._launch_compiled
    monkeypatch.setattr(F, "_launch_compiled", lambda *a: (direct.append(1), real(*a)))
    gen = torch.Generator().manual_seed(5)
    xs = [(torch.randn(n, generator=gen) * 3).to("cuda", dtype) for n in (1, 700, 5000, 3 * 1024 + 5, 40_000)]
    xs[2][17] = math.nan
    rows = F.programs_for(torch.device("cuda", device))
    regular = torch.full((8, rows, ROW), 2.0, device="cuda", dtype=torch.float64)
    through = torch.full_like(regular, 2.0)
    F.launch_multi(xs, regular, 3, direct=False)
    F.launch_multi(xs, through, 3)
    assert direct == [1]
    assert torch.equal(regular.nan_to_num(nan=-1.0), through.nan_to_num(nan=-1.0))


@needs_kernel
def test_the_batched_launch_passes_its_self_check_and_refuses_more_than_a_batch():
    assert F.check_multi(torch.device(DEVICE))
    from spectrace.hooks.fused_stats_kernel import MULTI

    x = torch.ones(4, device=DEVICE)
    out = torch.zeros(MULTI + 1, F.programs_for(torch.device(DEVICE)), ROW, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match=f"1..{MULTI}"):
        F.launch_multi([x] * (MULTI + 1), out, 0)
    with pytest.raises(ValueError):
        F.launch_multi([], out, 0)


@needs_kernel
def test_held_tensors_get_their_own_rows_in_entry_order(kernel_path, few_programs, monkeypatch):
    # One tensor too big to hold launches at once between held ones: its slot comes first,
    # the held ones' later, and each index still reads its own tensor's row.
    monkeypatch.setattr(R, "DEFER_TENSOR_BYTES", 20_000)
    xs = _tensors(torch.float32) + [torch.randn(2, 100, device=DEVICE)]
    step = R.StepStats(defer=True)
    indices = [step.add(x, reuse=False) for x in xs]
    assert indices == list(range(len(xs)))
    assert step.entries[4][0] == "slot" and all(step.entries[i] == ("held",) for i in (0, 1, 2, 3, 5))
    values = step.start_readback().values()
    for x, row in zip(xs, values):
        assert row is not None
        # As recorded (absmax None where a NaN is; the rows' NaN conventions differ by path).
        got, want = stats_fields(row, x.numel()), stats_fields(cpu_row(x.cpu().double()), x.numel())
        assert got.keys() == want.keys()
        for key in got:
            if want[key] is None:
                assert got[key] is None, key
            else:
                assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


@pytest.mark.skipif(not CUDA, reason="the read-back of slot rows is a CUDA copy")
@pytest.mark.parametrize(
    "sizes", [(4096,) * 20, (4096, 41 * 1024 + 3, 7, 200_000), (4096, 300_000)], ids=["one_row_each", "mixed_rows", "reduced_first"]
)
def test_the_read_back_copies_only_the_rows_that_hold_partials(sizes, monkeypatch):
    # A decode step's slots hold one row each of P: only those rows are copied, and a
    # bigger tensor in the same step widens the copy to its rows; past RAW_ROWS_MAX rows
    # they are reduced on the device first. Garbage in the unread rows (GPU memory starts
    # uninitialised) must not matter.
    # The rows are gathered on the device before the host copy (a strided host copy costs
    # the host far more); the next step of the same shape reuses that buffer and its views.
    assert F.prepare("cuda")
    monkeypatch.setattr(R, "HOST_ROWS_NUMEL", 0)  # every held batch in the device slots (see the host-rows test)
    gen = torch.Generator().manual_seed(5)
    device = torch.device("cuda", torch.cuda.current_device())
    first = R._pool.take(device)
    first.tensor.fill_(float("nan"))
    for round_ in range(2):
        xs = [(torch.randn(n, generator=gen, dtype=torch.float64) * 2 + 0.5).to(device, torch.bfloat16) for n in sizes]
        step = R.StepStats(defer=True)
        buffer = first if round_ == 0 else R._pool.take(device)
        assert buffer is first  # (values() gave it back to the pool)
        step._buffers[device] = buffer
        for x in xs:
            step.add(x, reuse=False)
        readback = step.start_readback()
        assert buffer.rows < F.programs_for(device)
        if buffer.rows <= R.RAW_ROWS_MAX:
            assert readback.copies[0].partials and readback.copies[0].host.shape[1] == buffer.rows
            assert buffer.stage is not None  # (a slot's leading rows are a strided piece of the buffer)
        else:
            assert isinstance(readback.copies[0].host, tuple)
        for x, row in zip(xs, readback.values()):
            want = cpu_row(x.cpu().double())
            assert row == pytest.approx(want, rel=1e-5, abs=1e-9)


@needs_kernel
def test_small_held_tensors_write_their_rows_into_host_memory_and_nothing_is_copied(kernel_path, monkeypatch):
    # A decode step's tensors: the batched kernel writes their partial rows into the step
    # buffer's host memory (pinned on CUDA), read back with no copy; a batch holding a
    # tensor above HOST_ROWS_NUMEL goes to the device slots. Garbage in the host rows (pinned
    # memory starts uninitialised; a buffer is reused) must not matter, nor a row count that
    # differs between two batches of a step.
    device = torch.device(DEVICE, torch.cuda.current_device()) if CUDA else torch.device("cpu")
    if CUDA:
        assert F.host_rows_ok(device), "the host-rows launch was refused by its self-check"
    copies: list[int] = []
    real_copy = R.copy_rows
    monkeypatch.setattr(R, "copy_rows", lambda *a: (copies.append(1), real_copy(*a))[1])
    gen = torch.Generator().manual_seed(9)
    buffer = R._pool.take(device)
    for round_, sizes in enumerate(((4096,) * 5 + (64 * 4096,), (7, 4096, 3 * 1024 + 5), (R.HOST_ROWS_NUMEL + 1, 4096))):
        xs = [(torch.randn(n, generator=gen, dtype=torch.float64) * 2 + 0.5).to(device, torch.bfloat16) for n in sizes]
        if round_ == 1:
            xs.insert(1, torch.randn(9, 300, generator=gen).to(device))  # a second dtype: a second launch, other rows
        step = R.StepStats(defer=True)
        step._buffers[device] = buffer
        if buffer.direct is not None:
            buffer.direct.fill_(float("nan"))
        for x in xs:
            step.add(x, reuse=False)
        step.launch_held()
        host = round_ < 2
        assert [e[0] for e in step.entries] == ["direct" if host else "slot"] * len(xs)
        readback = step.start_readback()
        assert copies == ([] if host else [1])
        for x, row in zip(xs, readback.values()):
            assert row == pytest.approx(cpu_row(x.cpu().double()), rel=1e-5, abs=1e-9)
        copies.clear()
        buffer = R._pool.take(device)  # the same one: values() gave it back


@needs_kernel
def test_a_failing_host_rows_launch_falls_back_to_the_device_slots_for_good(kernel_path, monkeypatch):
    device = torch.device(DEVICE, torch.cuda.current_device()) if CUDA else torch.device("cpu")
    monkeypatch.setitem(F._triton_state, ("host_rows", device.index), True)
    real = R.launch_multi

    def refuse_host_memory(xs, out, slot0):
        if out.shape[1] == R.RAW_ROWS_MAX:  # the host rows (the device slots have programs_for(device) rows)
            raise RuntimeError("pointer argument cannot be accessed")
        return real(xs, out, slot0)

    monkeypatch.setattr(R, "launch_multi", refuse_host_memory)
    xs = [torch.randn(4096, device=DEVICE) for _ in range(3)]
    for _ in range(2):
        step = R.StepStats(defer=True)
        for x in xs:
            step.add(x, reuse=False)
        step.launch_held()
        assert [e[0] for e in step.entries] == ["slot"] * 3
        for x, row in zip(xs, step.start_readback().values()):
            assert row == pytest.approx(cpu_row(x.cpu().double()), rel=1e-5, abs=1e-9)
    assert not F.host_rows_ok(device)


@needs_kernel
def test_a_tensor_written_in_place_while_held_is_skipped_and_counted(kernel_path):
    step = R.StepStats(defer=True)
    kept, written = torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE)
    before = cpu_row(written.cpu())
    step.add(kept)
    step.add(written)
    written.mul_(100.0)  # what a later op of the same forward may do to a module's output
    values = step.start_readback().values()
    assert values[0] is not None and values[0][0] == pytest.approx(float(kept.double().sum()), rel=1e-9, abs=1e-9)  # float64 sums
    assert values[1] is None  # never the statistics of the written values, nor of the old ones
    assert step.skipped_modified == 1 and before[0] != pytest.approx(float(written.sum()))


@needs_kernel
def test_a_step_holds_at_most_one_batch_and_each_batch_is_one_launch(kernel_path, monkeypatch):
    launches: list[int] = []
    real = R.launch_multi
    monkeypatch.setattr(R, "launch_multi", lambda xs, out, slot0: (launches.append(len(xs)), real(xs, out, slot0))[1])
    step = R.StepStats(defer=True)
    xs = [torch.full((8,), float(i), device=DEVICE) for i in range(2 * R.DEFER_BATCH + 3)]
    # (room for them all: past a buffer's slots, tensors take launches of their own, and the
    # pool sizes later buffers for that step)
    step._buffers[xs[0].device] = R.SlotBuffer(xs[0].device, len(xs))
    for x in xs:
        step.add(x)
        assert sum(len(v) for v in step._held.values()) < R.DEFER_BATCH
    values = step.start_readback().values()
    assert launches == [R.DEFER_BATCH, R.DEFER_BATCH, 3]
    assert [v[0] for v in values] == [8.0 * i for i in range(len(xs))]


@needs_kernel
def test_a_traced_model_gives_the_same_statistics_batched_or_not(kernel_path):
    import spectrace
    from tests.helpers.models import tiny_llama

    model = tiny_llama(layers=3, hidden=64).to(DEVICE)
    ids = torch.randint(0, 128, (2, 8), device=DEVICE)
    runs = []
    for defer in (True, False):
        with torch.no_grad(), spectrace.trace(model, stats="basic") as t:
            t.tracer.defer_stats = defer
            model(ids)
            t.tracer.finish_step()
            runs.append([(c.module, [m.stats for m in (*c.inputs, *c.outputs)]) for c in t.calls()])
            if defer:
                assert t.tracer._thread().stats.defer  # the batched path did run
    assert len(runs[0]) == len(runs[1]) > 0
    for (name_a, stats_a), (name_b, stats_b) in zip(*runs):
        assert name_a == name_b
        for a, b in zip(stats_a, stats_b):
            assert (a is None) == (b is None), name_a
            if a is not None:
                assert a.mean == pytest.approx(b.mean, rel=1e-5, abs=1e-7) and a.std == pytest.approx(b.std, rel=1e-5)
                assert a.absmax == b.absmax and a.nan == b.nan and a.inf == b.inf


def test_no_batching_under_a_serving_engine():
    from spectrace.hooks.engine import Tracer, _engine_loaded
    from spectrace.recorder import Recorder
    from spectrace.settings import Settings

    tracer = Tracer(Recorder(Settings(), sinks=[]))
    assert tracer.defer_stats
    assert tracer._thread().stats.defer is (not _engine_loaded())
    assert _engine_loaded() is ("sglang" in sys.modules or "vllm" in sys.modules)


def test_the_buffers_a_worker_backlog_holds_come_back_and_serve_the_next_steps():
    """A host-bound decode loop has about ten steps' buffers out at once (the record worker
    lets eight wait): back in the pool, they serve the next ten steps with none built (each
    new one costs a pinned host allocation at its first read-back)."""
    pool, device = R._BufferPool(), torch.device("cpu")
    for _round in range(3):
        out = [pool.take(device) for _ in range(10)]
        assert len({id(b) for b in out}) == 10
        for buffer in out:
            buffer.used = 3
            pool.give_back(buffer, 3)
    assert pool.made == 10
    assert all(b.used == 0 and b.rows == 0 for b in out)
    # Beyond what it keeps, a burst's extra buffers are dropped, not hoarded.
    many = [pool.take(device) for _ in range(R.RETAINED + 4)]
    for buffer in many:
        pool.give_back(buffer, 1)
    assert len(pool._free[device]) == R.RETAINED


def test_reduce_rows_of_held_slots_matches_entry_order_without_a_kernel():
    # The bookkeeping alone: slots filled out of entry order read back in entry order.
    step = R.StepStats()
    buffer = R._pool.take(torch.device("cpu"))
    step._buffers[torch.device("cpu")] = buffer
    for slot, value in ((0, 5.0), (1, 7.0)):
        buffer.tensor[slot].zero_()
        buffer.tensor[slot, 0, 0] = value
    buffer.used = 2
    step.entries = [("slot", buffer, 1), ("slot", buffer, 0)]
    values = step.start_readback().values()
    assert [v[0] for v in values] == [7.0, 5.0]
    assert reduce_rows([buffer.tensor[0]]).shape == (1, ROW)


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("numpy", [True, False], ids=["numpy", "torch"])
def test_partial_rows_combined_on_the_host_match_the_device_reduction(rows, numpy, monkeypatch):
    # The read-back copies a step's partial rows as they are; the worker combines them.
    # Both ways (NumPy where installed, torch otherwise) must give reduce_partials' rows,
    # NaN in a sum and in an absmax partial included.
    if not numpy:
        monkeypatch.setattr(R, "_np", None)
    gen = torch.Generator().manual_seed(rows)
    part = torch.rand(7, rows, ROW, generator=gen, dtype=torch.float64) * 10
    part[2, 0, 0] = math.nan
    part[3, -1, 2] = math.nan
    got, want = R.combine_partials(part), reduce_partials(part).tolist()
    assert len(got) == len(want) == 7
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-12, nan_ok=True)

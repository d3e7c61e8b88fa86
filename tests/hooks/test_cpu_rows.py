"""CPU statistics taken together: the calls kept in a traced forward are read in one pass,
and that pass summarises their same-sized float32 tensors with one copy and four
reductions (``tensor_stats.cpu_rows``) instead of three reductions per tensor.

Each row must agree with float64 statistics of its own tensor, non-finite values must be
counted as the per-tensor path counts them, and a traced model's records must carry the
values each call saw.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import spectrace
from spectrace.hooks import engine, readback
from spectrace.hooks.tensor_stats import cpu_row, cpu_rows, stats_fields


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_engine_loaded", lambda: False)


def _reference(x: torch.Tensor) -> dict[str, float]:
    d = x.double()
    return {"mean": float(d.mean()), "std": float(d.std(unbiased=False)), "absmax": float(d.abs().max())}


def test_rows_taken_together_agree_with_float64_and_count_non_finite_values() -> None:
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 33, generator=gen) * (i + 1) + i for i in range(6)]
    xs[2] = xs[2] * 1e20  # squares past float32: the float64 norm
    xs[3][1, 5] = math.nan
    xs[4][0, 0] = math.inf
    rows = cpu_rows(xs)
    for i, (x, row) in enumerate(zip(xs, rows)):
        got = stats_fields(row, x.numel())
        if i in (3, 4):
            assert repr(row) == repr(cpu_row(x))  # the per-tensor path, NaN and inf counted
            continue
        want = _reference(x)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5), (i, key)
    assert stats_fields(rows[3], xs[3].numel())["nan"] == 1 and stats_fields(rows[3], xs[3].numel())["absmax"] is None
    assert stats_fields(rows[4], xs[4].numel())["inf"] == 1


class _Chain(nn.Module):
    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x)) * 3
        return x


def test_a_traced_forward_takes_its_cpu_statistics_together_and_each_call_reads_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _Chain()
    seen: list[torch.Tensor] = []
    for layer in model.layers:
        layer.register_forward_hook(lambda _m, _a, out: seen.append(out.detach().clone()))
    passes: list[int] = []
    real = readback.cpu_rows

    def counting(xs):  # the real function, counted
        passes.append(len(xs))
        return real(xs)

    monkeypatch.setattr(readback, "cpu_rows", counting)
    x = torch.randn(3, 16)
    with torch.no_grad(), spectrace.trace(model, ["layers.*"], stats="basic") as t:
        model(x)
        model(x * -2)
    assert passes and max(passes) >= 8  # one pass per step: every layer's output at once
    calls = t.calls()
    assert len(calls) == len(seen) == 16
    for call, out in zip(calls, seen):
        stats = call.outputs[0].stats
        assert stats is not None
        want = _reference(out)
        assert stats.mean == pytest.approx(want["mean"], rel=1e-5, abs=1e-6)
        assert stats.std == pytest.approx(want["std"], rel=1e-5)
        assert stats.absmax == pytest.approx(want["absmax"], rel=1e-6)
    assert t.recorder.counters.internal_errors == 0


def test_a_batch_that_fails_falls_back_to_one_row_per_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    # (Both paths failing: tests/recorder/test_reliability.py, test_statistic_that_raises.)
    def broken(xs):
        raise RuntimeError("no rows")

    monkeypatch.setattr(readback, "cpu_rows", broken)
    torch.manual_seed(1)
    model = _Chain()
    seen: list[torch.Tensor] = []
    for layer in model.layers:
        layer.register_forward_hook(lambda _m, _a, out: seen.append(out.detach().clone()))
    with torch.no_grad(), spectrace.trace(model, ["layers.*"], stats="basic") as t:
        model(torch.randn(3, 16))
    calls = t.calls()
    assert len(calls) == 8 and t.recorder.counters.internal_errors == 0
    for call, out in zip(calls, seen):
        assert call.outputs[0].stats is not None
        assert call.outputs[0].stats.std == pytest.approx(_reference(out)["std"], rel=1e-5)

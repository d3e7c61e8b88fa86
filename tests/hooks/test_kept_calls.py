"""Calls kept by the hooks and read later (engine.PENDING_CALLS) record what a call saw.

Inside a traced forward the hooks keep a call as it came and note it with the others in one
pass. These tests hold the kept path to the path that notes each call at its hook, and to
the values a call really saw: a module that writes its input in place, an output written in
place after its call, inference tensors (no version counter), and the bound on what is held.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

import spectrace
from spectrace.hooks import engine
from spectrace.hooks.tensor_stats import cpu_row, to_stats
from tests.helpers.models import tiny_llama


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process without a serving engine (another test of this worker may have imported one)."""
    monkeypatch.setattr(engine, "_engine_loaded", lambda: False)


def _fields(calls: list[Any]) -> list[dict[str, Any]]:
    """The records without what differs by construction (seq, wall-clock time)."""
    out = []
    for c in calls:
        d = c.model_dump()
        d.pop("seq"), d.pop("t_unix")
        out.append(d)
    return out


def _run(
    model: nn.Module, inputs: list[torch.Tensor], stats: str, at_once: bool = False, inference: bool = False, modules: Any = None
) -> spectrace.Trace:
    ctx = torch.inference_mode() if inference else torch.no_grad()
    with ctx, spectrace.trace(model, modules, stats=stats) as t:
        if at_once:  # every module read at its hook, as before calls were kept
            t.tracer._read_at_once.update(t.hooked)
        for x in inputs:
            model(x)
    return t


@pytest.mark.parametrize("stats", ["basic", "off"])
def test_kept_calls_record_what_calls_read_at_their_hooks_record(stats: str) -> None:
    model = tiny_llama(layers=3)
    inputs = [torch.randint(0, 128, (2, 7)) for _ in range(3)]
    kept = _run(model, inputs, stats)
    if stats == "off":
        # shapes only has no read-at-once switch: the statistics mode's shapes are the reference
        reference = _fields(_run(model, inputs, "basic", at_once=True).calls())
        for r in reference:
            for m in r["inputs"] + r["outputs"]:
                m["stats"] = None
    else:
        reference = _fields(_run(model, inputs, stats, at_once=True).calls())
    # (a kept pass takes the CPU statistics of same-sized tensors together: float32 rounding)
    _close(_fields(kept.calls()), reference)
    assert kept.recorder.counters.internal_errors == 0 and kept.recorder.counters.stats_skipped_modified == 0
    if stats == "basic":
        assert all(c.outputs[0].stats is not None for c in kept.calls() if c.module != "model.embed_tokens")


def test_the_hooks_keep_calls_and_read_them_at_the_steps_end() -> None:
    model = tiny_llama(layers=3)
    held: list[int] = []
    with torch.no_grad(), spectrace.trace(model, stats="basic") as t:
        model.lm_head.register_forward_hook(lambda *a: held.append(len(t.tracer._local.steps.pending)))
        model(torch.randint(0, 128, (1, 5)))
        assert t.tracer._local.steps.pending == []  # read when the step ended
    # the three layers, the norm and lm_head itself (spectrace's hook ran first) wait for the
    # read; the embedding (int ids: no statistics to prove) was read at once
    assert held == [5]


def test_under_a_serving_engine_statistics_calls_are_read_at_their_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine's kernels write in place without bumping versions: nothing can be proven later.
    monkeypatch.setattr(engine, "_engine_loaded", lambda: True)
    model = tiny_llama(layers=3)
    held: list[int] = []
    with torch.no_grad(), spectrace.trace(model, stats="basic") as t:
        model.lm_head.register_forward_hook(lambda *a: held.append(len(t.tracer._local.steps.pending)))
        model(torch.randint(0, 128, (1, 5)))
    assert held == [0]
    assert all(c.outputs[0].stats is not None for c in t.calls() if c.module != "model.embed_tokens")


class _Scale(nn.Module):
    """Doubles its input in place, as an in-place activation would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x * 1.0


class _WritesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.scale = _Scale()
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.scale(self.a(x)))


class _WritesAnOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y.add_(100.0)  # the output of a, written after a returned
        return self.b(y)


def _std(values: torch.Tensor) -> float:
    stats = to_stats(cpu_row(values), values.numel())
    assert stats is not None
    return stats.std


def test_a_module_writing_its_input_in_place_is_never_read_with_the_written_values() -> None:
    torch.manual_seed(0)
    model = _WritesItsInput()
    xs = [torch.randn(4, 8) for _ in range(3)]
    with torch.no_grad():
        seen = [model.a(x) for x in xs]  # what scale's input holds before scale writes it
        t = _run(model, xs, "basic", modules=["a", "scale", "b"])
    calls = t.calls("scale")
    assert len(calls) == 3
    # Step 0 was kept: the write shows in the version, so no statistics rather than wrong ones.
    # The same tensor is a's output: written after a returned, so skipped there too.
    assert calls[0].inputs[0].stats is None and t.calls("a")[0].outputs[0].stats is None
    assert t.recorder.counters.stats_skipped_modified == 2
    assert {"a", "scale"} <= t.tracer._read_at_once
    # From then on scale is read at its hook: its input's statistics are those before the write.
    for call, before in zip(calls[1:], seen[1:]):
        assert call.inputs[0].stats is not None
        assert call.inputs[0].stats.std == pytest.approx(_std(before), rel=1e-5)
        assert call.inputs[0].stats.std != pytest.approx(_std(2 * before), rel=1e-2)
    for call, before in zip(t.calls("a")[1:], seen[1:]):
        assert call.outputs[0].stats is not None
        assert call.outputs[0].stats.std == pytest.approx(_std(before), rel=1e-5)
    coverage = [r for r in t.records if getattr(r, "type", None) == "coverage" and "written in place" in r.detail]
    assert len(coverage) == 1


def test_an_output_written_in_place_after_its_call_is_never_read_with_the_written_values() -> None:
    torch.manual_seed(0)
    model = _WritesAnOutput()
    xs = [torch.randn(4, 8) for _ in range(3)]
    with torch.no_grad():
        seen = [model.a(x) for x in xs]
        t = _run(model, xs, "basic", modules=["a", "b"])
    calls = t.calls("a")
    assert calls[0].outputs[0].stats is None and t.recorder.counters.stats_skipped_modified == 1
    for call, out in zip(calls[1:], seen[1:]):
        assert call.outputs[0].stats is not None
        assert call.outputs[0].stats.mean == pytest.approx(float(out.mean()), abs=1e-5)
    # b reads the written values as its input, and says so
    for call, out in zip(t.calls("b"), seen):
        assert call.inputs[0].stats is not None
        assert call.inputs[0].stats.mean == pytest.approx(float(out.mean()) + 100.0, rel=1e-5)


def test_inference_tensors_get_statistics_without_errors() -> None:
    # torch.inference_mode tensors have no version counter: they are read at their hooks.
    model = tiny_llama(layers=2)
    inputs = [torch.randint(0, 128, (1, 6)) for _ in range(2)]
    inference = _run(model, inputs, "basic", inference=True)
    reference = _run(model, inputs, "basic")
    assert inference.recorder.counters.internal_errors == 0
    _close(_fields(inference.calls()), _fields(reference.calls()))
    assert sum(m.stats is not None for c in inference.calls() for m in c.outputs) == 2 * 4  # all but the embedding


@pytest.mark.parametrize("stats", ["basic", "off"])
def test_what_the_hooks_hold_is_bounded(stats: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_llama(layers=6)
    held: list[tuple[int, int]] = []

    def watch(*_a: Any) -> None:
        state = t.tracer._local.steps
        held.append((len(state.pending), state.pending_bytes))

    ids = torch.randint(0, 128, (1, 5))
    monkeypatch.setattr(engine, "PENDING_CALLS", 2)
    with torch.no_grad(), spectrace.trace(model, stats=stats) as t:
        for layer in model.model.layers:
            layer.register_forward_hook(watch)  # after spectrace's own hook
        model(ids)
    assert held and max(n for n, _ in held) < 2  # read each time two are held
    n_calls = len(t.calls())
    held.clear()
    monkeypatch.setattr(engine, "PENDING_CALLS", 64)
    monkeypatch.setattr(engine, "PENDING_BYTES", 1)  # any output is more than this
    with torch.no_grad(), spectrace.trace(model, stats=stats) as t:
        for layer in model.model.layers:
            layer.register_forward_hook(watch)
        model(ids)
    assert held and all(n == 0 and b == 0 for n, b in held)
    assert len(t.calls()) == n_calls


def _close(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """Equal records, statistics to float tolerance (batched launches group tensors differently)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for side in ("inputs", "outputs"):
            for m, n in zip(x[side], y[side]):
                sm, sn = m.pop("stats"), n.pop("stats")
                assert (sm is None) == (sn is None), (x["module"], side)
                if sm is not None:
                    for key, value in sm.items():
                        assert value == pytest.approx(sn[key], rel=1e-5, abs=1e-6), (x["module"], side, key)
        assert x == y


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kept_calls_on_cuda_match_calls_read_at_their_hooks_and_skip_written_tensors() -> None:
    model = tiny_llama(layers=3).cuda()
    inputs = [torch.randint(0, 128, (2, 7), device="cuda") for _ in range(3)]
    kept = _run(model, inputs, "basic")
    _close(_fields(kept.calls()), _fields(_run(model, inputs, "basic", at_once=True).calls()))
    assert kept.recorder.counters.internal_errors == 0
    assert all(c.outputs[0].stats is not None for c in kept.calls() if c.module != "model.embed_tokens")
    torch.manual_seed(0)
    writer = _WritesItsInput().cuda()
    xs = [torch.randn(4, 8, device="cuda") for _ in range(3)]
    with torch.no_grad():
        seen = [writer.a(x) for x in xs]
        t = _run(writer, xs, "basic", modules=["a", "scale", "b"])
    calls = t.calls("scale")
    assert calls[0].inputs[0].stats is None and t.recorder.counters.stats_skipped_modified == 2
    for call, before in zip(calls[1:], seen[1:]):
        assert call.inputs[0].stats is not None
        assert call.inputs[0].stats.std == pytest.approx(_std(before.cpu()), rel=1e-4)


class _TakesAList(nn.Module):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=-1)


class _AppendsAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.join = _TakesAList()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x, x]
        joined = self.join(parts)
        parts.append(x)  # the caller changes the list after the call
        return self.lin(joined[..., :8])


@pytest.mark.parametrize("stats", ["basic", "off"])
def test_a_list_argument_changed_after_the_call_is_recorded_as_the_call_saw_it(stats: str) -> None:
    t = _run(_AppendsAfter(), [torch.randn(2, 8)], stats, modules=["join", "lin"])
    (call,) = t.calls("join")
    assert [m.arg for m in call.inputs] == ["input[0][0]", "input[0][1]"]
    assert call.outputs[0].shape == [2, 16]


class _Block(nn.Module):
    def forward(self, x: torch.Tensor, *extra: Any, **kwargs: Any) -> torch.Tensor:
        return x + 1


class _Stack(nn.Module):
    """Blocks that get the same keyword objects every call (as rotary cos/sin and position
    ids go to every decoder layer): read once a pass, and still as each call saw them."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = torch.randn(5, 4), torch.randn(5, 4)
        shared = {"pair": (cos, sin), "ids": torch.arange(5), "flag": True, "mask": None}
        many = tuple(torch.randn(2) for _ in range(20))  # more than a side records: capped alike
        for n, block in enumerate(self.blocks):
            x = block(x, cos, **shared) if n != 1 else block(x, many=many, **shared)
        empty = self.blocks[0](torch.empty(0, 4), **shared)  # a first input with no statistic: the kwargs may take it
        return x + empty.sum()


@pytest.mark.parametrize("stats", ["basic", "off"])
def test_calls_sharing_keyword_objects_record_what_each_call_saw(stats: str) -> None:
    model = _Stack()
    torch.manual_seed(0)
    kept = _run(model, [torch.randn(5, 4)], stats, modules=["blocks.0", "blocks.1", "blocks.2"])
    torch.manual_seed(0)
    reference = _fields(_run(model, [torch.randn(5, 4)], "basic", at_once=True, modules=["blocks.0", "blocks.1", "blocks.2"]).calls())
    if stats == "off":
        for r in reference:
            for m in r["inputs"] + r["outputs"]:
                m["stats"] = None
    got = _fields(kept.calls())
    assert [len(c["inputs"]) for c in got] == [5, 16, 5, 4]
    if stats == "basic":  # the empty first input leaves the side's statistic to kwarg.pair[0]
        assert [m["arg"] for m in got[-1]["inputs"] if m["stats"] is not None] == ["kwarg.pair[0]"]
    _close(got, reference)
    assert kept.recorder.counters.internal_errors == 0

"""The call records' JSON written piece by piece is the text of the fields written whole.

A CPU-only step writes each call's JSON from cached pieces (module names, tensors without
statistics); these tests hold it to the text ``_dumps(_call_fields(...))`` gives, which
tests/hooks/test_roles.py checks against the :class:`Call` schema.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import spectrace
from spectrace.hooks import call_text
from spectrace.records import Call
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.skipif(call_text.dumps is not call_text.dumps_core, reason="pydantic-core without inf_nan_mode")


def _whole(raw: Any, values: Any) -> str:
    return call_text.dumps(call_text.call_fields(raw, values))


@pytest.mark.parametrize("stats", ["off", "basic", "full"])
def test_a_traced_model_writes_the_same_text_both_ways(stats: str) -> None:
    model = tiny_llama(layers=2)
    seen: list[tuple[Any, Any]] = []
    with torch.no_grad(), spectrace.trace(model, stats=stats) as t:
        build = t.tracer._build_step

        def keep(item: Any, on_worker: bool = True) -> None:
            build(item, on_worker)
            seen.append((list(item.calls), dict(t.tracer._values)))

        t.tracer._build_step = keep  # type: ignore[method-assign]
        for _ in range(2):
            model(torch.randint(0, 128, (1, 5)))
        texts = [c.model_dump_json() for c in t.calls()]
    raws = [(raw, values) for calls, values in seen for raw in calls]
    assert len(raws) == 2 * 5
    for raw, values in raws:
        assert call_text.call_text(raw, values) == _whole(raw, values)
    # What the trace kept is that text, and it reads back as the same record.
    assert [Call.model_validate_json(call_text.call_text(r, v)).model_dump_json() for r, v in raws] == texts
    if stats != "off":
        assert any(m.stats is not None for c in t.calls() for m in c.outputs)


def test_odd_notes_write_the_same_text_both_ways() -> None:
    gen = 10**6  # a generation no step uses
    values: dict[int, list[list[float] | None]] = {gen: [[1.0, 2.0, math.inf, 0.0, 1.0], None, [math.nan, math.nan, math.nan, 3.0, 0.0]]}
    tensors = [
        ("input[0]", (2, 3), "float32", "cpu", gen, 0, 6),  # an inf absmax: null
        ("kwarg.x", (4,), "bfloat16", "cuda:0", gen, 1, 4),  # a device that failed: no row
        ("output", (), "float16", "meta", gen, 2, 1),  # NaN everywhere
        ("output[1]", (1, 2), "int64", "cpu", gen, -1, 0),
        ('kwarg.a"b\\ü', (0,), "complex64", "cpu", gen, -1, 0),  # quoting, an empty tensor
    ]
    for ctx in (None, ("decode", 7, 2), ("extend", None, None)):
        for capture in (False, True):
            for role in (None, "target.layer[0]", "draft.ü"):
                raw = (3, 41, "model.layers.0", 'Llama"Layer', "", tensors, tensors[::-1], 1796143932.050365, capture, role, ctx)
                assert call_text.call_text(raw, values) == _whole(raw, values)  # type: ignore[arg-type]

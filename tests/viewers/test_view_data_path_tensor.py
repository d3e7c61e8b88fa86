"""The data path shows the tensor that matters, in words that agree with their counts.

The demo's EAGLE-3 traces are written by the real hooks. Their draft decoder layer is
called as ``(positions, embeds, hidden_states)``: its first argument is the positions, so
a line built from it showed ``[24..62] -> [24..62,64]`` and the hidden width never
appeared. Rendered at 80 and 120 columns.
"""

from __future__ import annotations

import io
import re

import pytest

from spectrace.records import Call
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import build_view, stage_input
from spectrace.viewers.render import make_console, plural, render_view, shape_pattern

SCENARIOS = ("healthy", "fc_bypass", "embedding_vs_layer")


@pytest.fixture(scope="module")
def traces(tmp_path_factory, demo_cache):
    out = tmp_path_factory.mktemp("demo")
    for name in SCENARIOS:
        demo_cache.run(name, out)
    return out


def _screen(path, width: int) -> str:
    buf = io.StringIO()
    make_console(buf, width=width, plain=True).print(render_view(build_view(load_traces(str(path))), modules=True))
    return buf.getvalue()


def _dims(text: str) -> list[str]:
    return text.strip("[]").split(",")


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", SCENARIOS)
def test_decoder_layer_shows_its_hidden_states(traces, name, width):
    view = build_view(load_traces(str(traces / name)))
    layer = view.datapath.layer
    assert layer.calls and layer.in_shapes
    assert {len(s) for s in layer.in_shapes} == {2} and {s[-1] for s in layer.in_shapes} == {64}
    text = _screen(traces / name, width)
    (line,) = [x for x in text.splitlines() if "decoder layer" in x]
    m = re.search(r"(\[[^\]]*\]) -> (\[[^\]]*\])", line)
    assert m, line
    seen_in, seen_out = _dims(m.group(1)), _dims(m.group(2))
    assert len(seen_in) == 2 and seen_in[-1] == seen_out[-1] == "64", line


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", SCENARIOS)
def test_wording_agrees_with_counts(traces, name, width):
    text = _screen(traces / name, width)
    # A shape list never ends in a bare count of the shapes left out.
    assert not re.search(r"\] \+\d+(?![\d ]*other shape)", text), text
    for wrong in (" x1 ", "no step", "1 samples", "1 parameters", "1 layers", " x 0 = 0"):
        assert wrong not in text, wrong
    assert not re.search(r"\bx1\b", text)


def test_capture_without_boundaries_and_findings_without_a_step(traces):
    text = _screen(traces / "fc_bypass", 80)
    assert "hidden 64, no boundary captured" in text
    assert "aux_capture_disabled  once, outside any step" in text
    assert "fc_bypass  draft.model.fc, once, step 0" in text  # beneath its root cause
    healthy = _screen(traces / "healthy", 120)
    assert "chunks of 64 (target.aux_concat, 1 sample)" in healthy
    assert "6 layers, hidden 64 x 3 = 192" in healthy


def test_stage_input_picks_the_hidden_states_argument(traces):
    calls = [c for f in load_traces(str(traces / "healthy")).files for c in f.calls]
    layer = next(c for c in calls if c.role == "draft.layer")
    assert len(layer.inputs[0].shape) == 1  # positions come first
    picked = stage_input(layer, "draft.layer", layer.outputs)
    assert picked is not None and picked.arg == layer.inputs[-1].arg and picked.shape[-1] == 64
    target = next(c for c in calls if c.role == "target.layer[0]")
    assert stage_input(target, "target.layer[0]", target.outputs) is target.inputs[0]
    fc = next(c for c in calls if c.role == "draft.fc")
    assert stage_input(fc, "draft.fc", fc.outputs) is fc.inputs[0]
    named = Call.model_validate(
        {
            **layer.model_dump(),
            "inputs": [
                {**layer.inputs[1].model_dump(), "arg": "kwarg.embeds"},
                {**layer.inputs[0].model_dump(), "arg": "kwarg.hidden_states"},
            ],
        }
    )
    # The argument the call names hidden_states wins over a guess by width.
    assert stage_input(named, "draft.layer", named.outputs) is named.inputs[1]


def test_shape_and_count_words():
    assert shape_pattern([[24], [25], [24, 64], [30, 64]]) == "[24..25] [24..30,64]"
    assert shape_pattern([[1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]) == "[1] [1,2] +2 other shapes"
    assert shape_pattern([[1], [1, 2], [1, 2, 3]]) == "[1] [1,2] +1 other shape"
    assert [plural(n, "sample") for n in (0, 1, 2)] == ["0 samples", "1 sample", "2 samples"]
    assert plural(1, "parameter") == "1 parameter" and plural(3, "parameter") == "3 parameters"

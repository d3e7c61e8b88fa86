"""torch.jit.trace and torch.export of a traced model: said once, like torch.compile
(issue 48, item 7).

Both run the forward on tensors that hold no numbers (jit's tracer tensors, export's
fake ones): a hook that took a statistic there would be traced into the graph, warn
from spectrace's code, or fail to write its record. Instead the graph made is the
untraced one, one coverage note says so, and eager calls around it are traced as ever.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import spectrace
from spectrace.records import Coverage
from spectrace.settings import Settings

IDS = torch.tensor([[1, 2, 3, 4]])


class _Logits(torch.nn.Module):
    """The traced model behind a plain-tensor forward (jit and export want tensors out)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, use_cache=False).logits


PACKAGE = Path(spectrace.__file__).resolve().parent


def _in_package(filename: str) -> bool:
    """Whether a warning came from spectrace's own files (its installed package folder)."""
    return Path(filename).resolve().is_relative_to(PACKAGE)


def _model() -> torch.nn.Module:
    from spectrace.eagle3.target import tiny_llama

    torch.manual_seed(0)
    return tiny_llama(vocab_size=128, hidden_size=64, num_layers=2, intermediate_size=128).eval()


def _graph(kind: str, wrapper: torch.nn.Module) -> Any:
    if kind == "jit":
        return torch.jit.trace(wrapper, (IDS,), check_trace=False)
    return torch.export.export(wrapper, (IDS,), strict=kind == "export-strict")


def _run(kind: str, tmp_path: Path) -> tuple[Any, list[Any], list[warnings.WarningMessage], torch.Tensor]:
    model = _model()
    wrapper = _Logits(model)
    with torch.no_grad():
        expected = wrapper(IDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # profile "all": modules traced through their class's forward and through torch's hooks
        with torch.no_grad(), spectrace.trace(model, profile="all", directory=str(tmp_path), settings=Settings()) as t:
            graph = _graph(kind, wrapper)
            eager = wrapper(IDS)  # after the graph was made: traced as ever
    assert torch.equal(eager, expected)
    out = graph(IDS) if kind == "jit" else graph.module()(IDS)
    torch.testing.assert_close(out, expected)  # the graph is the untraced model's
    return t, list(t), caught, expected


@pytest.mark.parametrize("kind", ["jit", "export", pytest.param("export-strict", marks=pytest.mark.slow)])
def test_graph_makers_are_said_once_and_leave_no_trace_inside(kind: str, tmp_path: Path) -> None:
    t, records, caught, _expected = _run(kind, tmp_path)
    what = {"jit": "torch.jit.trace", "export": "torch.export", "export-strict": "torch.export"}[kind]
    notes = [r for r in records if isinstance(r, Coverage) and what in r.detail]
    assert len(notes) == 1 and notes[0].kind == "not_covered" and "run it eagerly" in notes[0].detail
    # No warning raised from spectrace's code (jit's TracerWarning from a statistic), and
    # no internal error (a traced tensor in a record: "Unable to serialize unknown type").
    # Matched on the package's own folder, not a substring: a checkout named "spectrace"
    # holds ./.venv, so torch's own files would match "spectrace" too.
    ours = [w for w in caught if _in_package(w.filename)]
    assert not ours, [f"{w.filename}:{w.lineno}: {w.message}" for w in ours]
    assert t.recorder.counters.internal_errors == 0
    # Only the eager call after the graph was made is traced: one step's worth of calls.
    calls = t.calls()
    assert calls and len({c.step for c in calls}) == 1
    assert all(m.stats is None or isinstance(m.stats.mean, (float, type(None))) for c in calls for m in c.outputs)


def test_own_warnings_are_told_by_the_package_folder_not_a_substring() -> None:
    # A checkout named "spectrace" holds ./.venv: torch's files then have "spectrace" in their path.
    import spectrace.api

    assert _in_package(spectrace.api.__file__)
    assert not _in_package(torch.__file__)
    assert not _in_package(str(PACKAGE.parent / ".venv" / "lib" / "site-packages" / "torch" / "jit" / "_trace.py"))

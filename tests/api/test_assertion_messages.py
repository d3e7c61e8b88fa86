"""A failing assertion's message fits a screen: the mismatch first, at most 12 lines, none
over 120 characters; the observed call list is on the exception (``err.data_path``); a
module name that matches nothing traced gets the closest traced names.

Runs the shipped tiny EAGLE-3 pair through the reference speculative loop, healthy and
with the draft's ``fc`` bypassed (the target sends 1 x hidden), traced as users trace it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import spectrace
from spectrace.api import Trace
from spectrace.assertions import CallContractError, ShapeContractError, SpectraceAssertionError
from spectrace.eagle3 import build_scenario, demo_prompts, speculate

MAX_LINES = 12
MAX_WIDTH = 120


def traced(name: str) -> Trace:
    pair = build_scenario(name)
    with spectrace.trace({"target": pair.target, "draft": pair.draft}) as t, torch.no_grad():
        speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=8)
    return t


@pytest.fixture(scope="module")
def healthy() -> Trace:
    return traced("healthy")


@pytest.fixture(scope="module")
def bypass() -> Trace:
    return traced("fc_bypass")


def failure(check: Callable[[], Any]) -> SpectraceAssertionError:
    with pytest.raises(SpectraceAssertionError) as info:
        check()
    return info.value


def assert_fits(err: SpectraceAssertionError) -> list[str]:
    lines = str(err).splitlines()
    assert len(lines) <= MAX_LINES, str(err)
    assert all(len(line) <= MAX_WIDTH for line in lines), str(err)
    return lines


def test_a_shape_mismatch_comes_first_and_the_call_list_is_opt_in(healthy: Trace) -> None:
    err = failure(lambda: healthy.assert_shape("draft.model.fc", input=(..., 7168)))
    assert isinstance(err, ShapeContractError)
    lines = assert_fits(err)
    assert lines[0].startswith("shape contract of 'draft.model.fc' broken in")
    assert lines[1].startswith("  draft.model.fc (step 1 #") and lines[1].endswith("is (24, 192), expected (..., 7168)")
    assert "Findings: none." in lines
    assert lines[-1] == "Every call that ran: err.data_path, or t.data_path()."
    assert "Observed data path" not in str(err)
    # Opt-in: the whole call list, the asserted module marked, and every broken place.
    assert err.data_path == healthy.data_path(["draft.model.fc"])
    assert "> step 1 " in err.data_path and "draft.model.fc" in err.data_path
    assert len(err.problems) == len(healthy.calls("draft.model.fc"))


def test_many_broken_places_are_counted_not_listed(healthy: Trace) -> None:
    err = failure(lambda: healthy.assert_dtype("draft.model.layers.0", output=torch.bfloat16))
    lines = assert_fits(err)
    broken = [line for line in lines if line.startswith("  draft.model.layers.0 (step")]
    assert len(broken) == 3 and len(err.problems) > 3
    assert f"  ... {len(err.problems) - 3} more (err.problems has all {len(err.problems)})" in lines


def test_a_typo_gets_the_closest_traced_name(healthy: Trace) -> None:
    for typo in ("draft.model.fcc", "**.fcc", "model.fc"):
        err = failure(lambda typo=typo: healthy.assert_called(typo))
        assert isinstance(err, CallContractError)
        lines = assert_fits(err)
        assert lines[0] == f"{typo!r} matches no traced module, so spectrace cannot say whether it ran."
        assert lines[1] == "Did you mean draft.model.fc?", (typo, lines)
        assert "Trace it" not in str(err)


def test_a_name_like_nothing_traced_lists_what_is_traced(healthy: Trace) -> None:
    lines = assert_fits(failure(lambda: healthy.assert_called("vision_tower.proj")))
    assert lines[1].startswith("Traced: target.") and lines[2].startswith("Trace it: spectrace.trace(")


def test_a_module_never_called_shows_its_root_cause_and_fix(bypass: Trace) -> None:
    err = failure(lambda: bypass.assert_called("draft.model.fc"))
    lines = assert_fits(err)
    assert lines[0] == "'draft.model.fc' was never called (it is traced, as draft.model.fc)."
    assert any(line.startswith("ERROR ") for line in lines), lines  # the root cause, judged as the view does
    assert any(line.startswith("  fix: ") for line in lines), lines
    assert lines[-2].startswith("Called: target.")  # what ran instead, in one line
    assert err.findings == bypass.findings


def test_a_stats_failure_fits_too(healthy: Trace) -> None:
    err = failure(lambda: healthy.assert_stats("draft.model.layers.0", absmax=1e-3))
    lines = assert_fits(err)
    assert "has absmax" in lines[1] and "expected <= 0.001" in lines[1]


def test_passing_assertions_still_pass(healthy: Trace) -> None:
    healthy.assert_shape("draft.model.fc", input=(..., 3 * 64), output=(..., 64))
    healthy.assert_called("draft.model.fc")

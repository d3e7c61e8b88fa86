"""Data-path contracts for an EAGLE-3 draft, the way a project keeps its wiring fixed.

The draft must read the target's *fused* aux states (3 x hidden wide) through ``fc``.
When the target captures nothing, SGLang's draft skips ``fc`` without a word (the
widths then match), so the contract is on ``fc`` itself, not on the decoder input.

Run with ``pytest examples/`` (add ``--spectrace`` to also fail on any error finding).
Tiny random-weight models: nothing is downloaded; contracts do not need trained weights.
"""

from __future__ import annotations

import pytest
import torch

from spectrace.assertions import CallContractError
from spectrace.eagle3.draft import DraftConfig, DraftOutput, Eagle3Draft
from spectrace.eagle3.target import Eagle3Target, tiny_llama

# Loads the fixture when spectrace is not installed with its pytest11 entry point
# (a source checkout); with the entry point this line is a no-op.
pytest_plugins = ["spectrace.pytest_plugin"]

HIDDEN = 64
TRAINED_IDS = [-1, 1, 3]  # SGLang Llama ids: -1 = embedding output; captures boundaries [0, 2, 4]
# Relative to each root: the target's aux concat, and the draft's fc, decoder layer and head.
MODULES = ["aux_concat", "model.fc", "model.layers.0", "model.norm", "lm_head"]


@pytest.fixture
def target() -> Eagle3Target:
    return Eagle3Target(tiny_llama(hidden_size=HIDDEN, num_layers=6), TRAINED_IDS, convention="sglang_llama")


@pytest.fixture
def draft() -> Eagle3Draft:
    return Eagle3Draft(DraftConfig(hidden_size=HIDDEN)).eval()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.tensor([3, 17, 42, 8, 99, 5, 61, 20])


def draft_step(target: Eagle3Target, draft: Eagle3Draft, ids: torch.Tensor) -> DraftOutput:
    """One draft forward as serving feeds it: token t+1 with the target's stored states of position t."""
    with torch.no_grad():
        states = target(ids).hidden_states
        return draft(ids[1:], states[:-1])


@pytest.mark.spectrace  # any error finding in this trace fails the test, even without --spectrace
def test_fc_receives_the_fused_aux_states(spectrace, target, draft, ids):
    with spectrace.trace({"target": target, "draft": draft}, modules=MODULES) as t:
        draft_step(target, draft, ids)

    t.assert_shape("target.aux_concat", output=(None, 3 * HIDDEN))
    t.assert_shape("draft.model.fc", input=(..., 3 * HIDDEN), output=(..., HIDDEN))
    # The decoder layer's hidden-state argument (positions, embeds, hidden) is fc's output.
    t.assert_shape("draft.model.layers.0", input=(..., HIDDEN), input_arg="input[2]")
    t.assert_dtype("draft.lm_head", output=torch.float32)
    t.assert_stats("draft.**", finite=True)
    t.assert_no_findings()  # the checks `spectrace view` runs, over what was recorded


def test_target_without_aux_capture_bypasses_fc(spectrace, target, draft, ids):
    target.aux_enabled = False  # served with the EAGLE algorithm: the final normed state is stored
    with spectrace.trace({"target": target, "draft": draft}, modules=MODULES) as t:
        draft_step(target, draft, ids)

    # The contract catches it: fc never ran, and the message lists what did run.
    with pytest.raises(CallContractError, match="'draft.model.fc' was never called"):
        t.assert_called("draft.model.fc")
    t.assert_not_called("draft.model.fc")
    # ... and so do the checks, with the fix attached (and the capture that causes it).
    found = t.assert_finding("fc_bypass")
    assert found.module == "draft.model.layers.0"
    assert "use_aux_hidden_state" in found.fix
    # The root cause, read from the target handed to trace(): its aux capture is off.
    assert t.assert_finding("aux_capture_disabled").module == "target"

"""Weights replaced after load and synthetic acceptance, on vLLM 0.32's own classes (CPU).

vLLM 0.32's proposer shares the target's head only when the draft has none or an
identical one (``_maybe_share_lm_head``, the fix of vllm#27732): run on the real
``Eagle3LlamaForCausalLM`` with a trained, distinct head, it keeps it, and spectrace says
nothing. Releases before that fix assigned the target's head whatever the checkpoint
held; that assignment, on the same real objects, is named.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU venv")
torch = pytest.importorskip("torch")

from spectrace.integrations.vllm import acceptance as st_acceptance
from spectrace.recorder import Recorder
from spectrace.records import Finding
from tests.helpers import vllm_harness as vh

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def installed():
    yield from vh.installed("vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3", "vllm.v1.spec_decode.metrics")


def _replaced(rec: Recorder) -> list[Finding]:
    return [r for r in rec.records() if isinstance(r, Finding) and r.code == "weights_replaced_after_load"]


def _compare(draft) -> None:
    draft.__dict__["_spectrace_replacement_watch"].compare(draft, "first forward")


def test_vllm_proposer_keeps_a_distinct_trained_head(rec, tmp_path) -> None:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, target = vh.build(vc)
    draft.load_weights(vh.checkpoint(draft).items())
    trained = draft.lm_head.weight.detach().clone()
    SpecDecodeBaseProposer._maybe_share_lm_head(
        SimpleNamespace(model=draft, vllm_config=vc, use_local_argmax_reduction=False), target
    )  # the real sharing step
    print("vLLM 0.32 kept the draft's head:", draft.lm_head.weight is not target.lm_head.weight)
    assert torch.equal(draft.lm_head.weight, trained)
    _compare(draft)
    assert _replaced(rec) == []


def test_vllm_head_assigned_from_the_target_is_named(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, target = vh.build(vc)
    draft.load_weights(vh.checkpoint(draft).items())
    # What vLLM did before vllm#28549: the target's head, whatever the checkpoint held.
    draft.lm_head = target.lm_head
    _compare(draft)
    (one,) = _replaced(rec)
    print(one.message)
    assert one.evidence["parameters"] == ["lm_head.weight"] and "_maybe_share_lm_head" in one.message


def test_vllm_synthetic_rejection_sampling_is_said(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config())
    spec = vc.speculative_config
    st_acceptance.note_speculative_config(spec)
    assert [r for r in rec.records() if isinstance(r, Finding)] == []  # "standard": measured acceptance
    synthetic = copy.copy(spec)
    object.__setattr__(synthetic, "rejection_sample_method", "synthetic")
    object.__setattr__(synthetic, "synthetic_acceptance_rates", [0.8, 0.6, 0.4])
    st_acceptance.note_speculative_config(synthetic)
    (one,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert one.code == "acceptance_synthetic" and "SYNTHETIC" in one.message


@pytest.mark.parametrize("falls", [True, False])
def test_vllm_acceptance_drift(rec, falls: bool) -> None:
    # vLLM's own per-step stats objects, as its scheduler fills them: acceptance falling
    # half-way through at the same batch is named with its window; a steady run is not.
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from spectrace.checks.drift import DRIFT_STEPS

    steps = 12 * DRIFT_STEPS
    for step in range(steps):
        stats = SpecDecodingStats.new(3)
        for accepted in [3, 3, 2, 3] if step < steps // 2 or not falls else [1, 0, 1, 1]:
            stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=accepted)
    drift = [r for r in rec.records() if isinstance(r, Finding) and r.code == "acceptance_drift"]
    if not falls:
        assert drift == []
        return
    (one,) = drift
    assert one.evidence["fell_in_steps"][0] == steps // 2


@pytest.mark.parametrize("replaced", [True, False])
def test_a_collapse_after_a_replaced_head_shows_beneath_it(rec, tmp_path, replaced: bool) -> None:
    # The head replaced on vLLM's own draft, then vLLM's per-step stats of a draft whose
    # tokens the target rejects: the collapse is that replacement's consequence, not a
    # question about the training. Alone (the twin), it stands alone and says so.
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from spectrace.assertions import format_root_causes
    from spectrace.checks.root_causes import root_causes

    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, target = vh.build(vc)
    draft.load_weights(vh.checkpoint(draft).items())
    if replaced:
        draft.lm_head = target.lm_head
    _compare(draft)
    for _ in range(9):
        stats = SpecDecodingStats.new(3)
        for _ in range(4):
            stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=0)
    found = [r for r in rec.records() if isinstance(r, Finding)]
    judged = {j.code: j for j in root_causes(found)}
    text = format_root_causes(found)
    print(text)
    if replaced:
        assert judged["acceptance_collapse"].root == "weights_replaced_after_load"
        head, *beneath = text.splitlines()
        assert head.startswith("ERROR weights_replaced_after_load") and any("acceptance_collapse" in line for line in beneath)
        assert "look at the error findings" not in text  # the collapse's own fix gives way to the root's
    else:
        assert [f.code for f in found] == ["acceptance_collapse"] and judged["acceptance_collapse"].root is None
        assert text.startswith("WARNING acceptance_collapse") and "look at the error findings" in text

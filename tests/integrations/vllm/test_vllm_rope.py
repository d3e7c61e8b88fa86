"""rope_mismatch at runtime on vLLM 0.32's own ``Eagle3LlamaForCausalLM`` and ``LlamaForCausalLM`` (CPU).

A draft config with ``rope_theta`` 500000 that states it was trained at 10000: vLLM builds
the draft's rotary with another base than the trained one and says nothing. Shown first on the engine's rotary
modules, then named by spectrace when both the draft's load and the target's capture set-up
(V1's runner order: the draft loads first) have run. The clean twin rotates alike.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU venv")
torch = pytest.importorskip("torch")

from spectrace.records import Finding
from tests.helpers import vllm_harness as vh

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def installed():
    yield from vh.installed(
        "vllm.model_executor.models.interfaces", "vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3"
    )


def _rotary(model):
    return next(m for n, m in model.named_modules() if n.endswith("rotary_emb"))


def _serve(tmp_path, **draft_rope):
    """The runner's order: build both, load the draft, then set up the target's capture."""
    vc = vh.engine_config(tmp_path, vh.draft_config(**draft_rope), vh.target_config(rope_theta=10000.0))
    draft, target = vh.build(vc)
    draft.load_weights(vh.checkpoint(draft).items())
    target.set_aux_hidden_state_layers((1, 2, 3))  # the trained boundaries of SpecForge ids [0, 1, 2]
    return draft, target


def _rope(rec) -> list[Finding]:
    return [r for r in rec.records() if isinstance(r, Finding) and r.code == "rope_mismatch"]


def test_draft_base_beside_the_target(rec, tmp_path) -> None:
    """The draft's config says 500000 and states it was trained at 10000 (trained_rope_theta): vLLM
    builds 500000, another rotary than the trained one. An error."""
    draft, target = _serve(tmp_path, rope_theta=500000.0, trained_rope_theta=10000.0)
    print(f"vLLM built: target base={_rotary(target).base}, draft base={_rotary(draft).base}")
    assert (_rotary(target).base, _rotary(draft).base) == (10000.0, 500000.0)
    (one,) = _rope(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.source == "vllm.rope"
    assert "vLLM built the draft's rotary embedding" in one.message and "base 500000" in one.message
    assert "says the draft was trained with base 10000" in one.message and "to 10000" in one.fix


def test_the_targets_base_is_no_evidence(rec, tmp_path) -> None:
    """The same config without the statement: SpecForge (signed by eagle_config) trains with the base
    its config gives, 500000, as vLLM builds; the target's 10000 is not the draft's. No error; only
    SpecForge 0.1.0, which rotated with 10000 whatever the config said, leaves a warning naming the probe."""
    draft, target = _serve(tmp_path, rope_theta=500000.0)
    assert (_rotary(target).base, _rotary(draft).base) == (10000.0, 500000.0)
    (one,) = _rope(rec)
    assert one.severity == "warning" and "SpecForge 0.1.0 trained it with base 10000" in one.message
    assert "spectrace probe TRACE_DIR --draft DRAFT_DIR" in one.message


def test_clean_twin_says_nothing(rec, tmp_path) -> None:
    draft, target = _serve(tmp_path, rope_theta=10000.0)
    assert _rotary(target).base == _rotary(draft).base == 10000.0
    assert _rope(rec) == []
    assert [r.code for r in rec.records() if isinstance(r, Finding) and r.severity == "error"] == []

"""unsupported_config_flag at vLLM's draft load, on vLLM 0.32's own draft classes (CPU).

A DeepSeek-layer EAGLE-3 draft trained with ``norm_before_fc``: vLLM builds
``Eagle3DeepseekV2ForCausalLM``, which never reads the flag, and fuses the aux states
without the norm. The bug is first shown on the engine's objects (the class built, and its
``combine_hidden_states`` equal to a bare ``fc``), then spectrace names it when the
draft's ``load_weights`` runs. The clean twins: the same flag on ``Eagle3LlamaForCausalLM``
(which reads it and norms first), and the DeepSeek class without the flag.
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
    yield from vh.installed("vllm.model_executor.models.deepseek_eagle3", "vllm.model_executor.models.llama_eagle3")


def _deepseek_draft(**extra):
    """A tiny MLA (DeepSeek-layer) EAGLE-3 draft config.json."""
    cfg = dict(
        architectures=["Eagle3DeepseekV2ForCausalLM"], model_type="deepseek_v2", vocab_size=vh.VOCAB, hidden_size=vh.HIDDEN,
        intermediate_size=2 * vh.HIDDEN, moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        max_position_embeddings=256, rope_theta=10000.0, torch_dtype="float32", tie_word_embeddings=False,
        draft_vocab_size=vh.VOCAB, target_hidden_size=vh.HIDDEN, eagle_aux_hidden_state_layer_ids=[0, 1, 2],
    )  # fmt: skip
    cfg.update(extra)
    return cfg


def _build(vc):
    """The class vLLM's loader picks for the draft, built as its model loader does."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import get_model_architecture

    vh.setup(vc)
    with set_current_vllm_config(vc):
        cls, _ = get_model_architecture(vc.speculative_config.draft_model_config)
        return cls(vllm_config=vc)


def _aux(seed: int = 0) -> torch.Tensor:
    return torch.randn(5, 3 * vh.HIDDEN, generator=torch.Generator().manual_seed(seed))


def _fill(model) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _flags(rec) -> list[Finding]:
    return [r for r in rec.records() if isinstance(r, Finding) and r.code == "unsupported_config_flag"]


def test_deepseek_class_skips_norm_before_fc(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, _deepseek_draft(norm_before_fc=True))
    draft = _build(vc)
    _fill(draft)
    weight = draft.model.fc.weight.detach().clone()
    # fc's own post-load step only (it picks the CPU GEMM fc runs with): the MLA attention's
    # would pick vLLM's AMX kernels on CPUs that have AMX, which refuse this tiny float32 layer.
    fc = draft.model.fc
    fc.quant_method.process_weights_after_loading(fc)
    h = _aux()
    fused = draft.combine_hidden_states(h)
    bare = torch.nn.functional.linear(h, weight)  # fc alone, no norm of the aux states before it
    print(f"vLLM built {type(draft).__name__}; norm_before_fc read: {hasattr(draft.model, 'norm_before_fc')}; "
          f"combine_hidden_states == bare fc: {torch.allclose(fused, bare, atol=1e-4, rtol=1e-4)}")  # fmt: skip
    assert type(draft).__name__ == "Eagle3DeepseekV2ForCausalLM"
    # The flag does nothing (a norm before fc would move every value far past the CPU GEMM's rounding).
    assert not hasattr(draft.model, "norm_before_fc") and torch.allclose(fused, bare, atol=1e-4, rtol=1e-4)
    draft.load_weights([])  # the load seam (the server's checkpoint is immaterial to this check)
    (one,) = _flags(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.module == "draft"
    assert one.evidence == {"flag": "norm_before_fc", "draft_class": "Eagle3DeepseekV2ForCausalLM"}


def test_deepseek_class_without_the_flag_says_nothing(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, _deepseek_draft())
    _build(vc).load_weights([])
    assert _flags(rec) == []


def test_llama_class_reads_the_flag_and_says_nothing(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config(norm_before_fc=True))
    draft, _ = vh.build(vc)
    assert draft.model.norm_before_fc is True  # this class norms the aux states before fc
    draft.load_weights(vh.checkpoint(draft).items())
    assert _flags(rec) == []
    assert [r.code for r in rec.records() if isinstance(r, Finding) and r.severity == "error"] == []

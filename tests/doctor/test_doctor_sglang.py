"""``spectrace doctor`` on SGLang 0.5.23's own classes: each bug a draft/target pair can carry,
shown by the engine's objects in the doctor's facts and named by the same codes the live
and CPU-class tests give; each clean twin raises no error.

The "user's" configs here are small already (hidden 128); the doctor shrinks them further,
as it shrinks a 671B pair. One process: SGLang's parallel state is built once, by the
first run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.cli import main as cli_main
from spectrace.doctor import DoctorReport, diagnose

pytestmark = pytest.mark.sglang

HIDDEN, VOCAB, DRAFT_VOCAB = 128, 512, 128


def _llama_target(layers: int = 6, arch: str = "LlamaForCausalLM", model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        architectures=[arch], model_type=model_type, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    cfg.update(extra)
    return cfg


def _deepseek_target(layers: int = 6) -> dict[str, Any]:
    return dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=VOCAB, hidden_size=HIDDEN,
        intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=64, kv_lora_rank=32,
        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, max_position_embeddings=256, rope_theta=10000,
        rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                      "mscale": 1.0, "mscale_all_dim": 1.0},
        topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, ep_size=1, num_nextn_predict_layers=1,
        tie_word_embeddings=False, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
    )  # fmt: skip


def _gpt_oss_target(layers: int = 6) -> dict[str, Any]:
    return dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_local_experts=8,
        experts_per_token=2, sliding_window=64, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        max_position_embeddings=512, rope_theta=150000, rms_norm_eps=1e-5, tie_word_embeddings=False, swiglu_limit=7.0,
        attention_bias=True, quantization_config={"quant_method": "mxfp4"},
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 4096},
    )  # fmt: skip


def _draft_config(ids: list[int], **extra: Any) -> dict[str, Any]:
    """A SpecForge-format EAGLE-3 draft config.json."""
    cfg: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=VOCAB, hidden_size=HIDDEN,
        intermediate_size=256, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, draft_vocab_size=DRAFT_VOCAB,
        eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    )  # fmt: skip
    cfg.update(extra)
    return cfg


def _hot_set() -> torch.Tensor:
    return torch.arange(DRAFT_VOCAB) * 3  # the draft's target ids: every third token


def _checkpoint(prefix: str = "midlayer.", d2t: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The draft's tensors as SpecForge saves them (zeros: the doctor reads names, shapes and the maps)."""
    h, kv = HIDDEN, 4 * (HIDDEN // 8)
    layer = {
        "self_attn.q_proj.weight": (h, 2 * h), "self_attn.k_proj.weight": (kv, 2 * h), "self_attn.v_proj.weight": (kv, 2 * h),
        "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (256, h), "mlp.up_proj.weight": (256, h),
        "mlp.down_proj.weight": (h, 256), "input_layernorm.weight": (h,), "hidden_norm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }  # fmt: skip
    out = {prefix + name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in layer.items()}
    out.update({"fc.weight": torch.zeros(h, 3 * h, dtype=torch.bfloat16), "norm.weight": torch.zeros(h, dtype=torch.bfloat16)})
    out["lm_head.weight"] = torch.zeros(DRAFT_VOCAB, h, dtype=torch.bfloat16)
    hot = _hot_set()
    out["d2t"] = (hot - torch.arange(DRAFT_VOCAB)) if d2t is None else d2t  # offsets: draft id i is target id i + d2t[i]
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    out["t2d"] = t2d
    return out


def _pair(tmp: Path, target: dict[str, Any], draft: dict[str, Any], ckpt: dict[str, torch.Tensor] | None = None) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    d, t = tmp / "draft", tmp / "target"
    d.mkdir()
    t.mkdir()
    (d / "config.json").write_text(json.dumps(draft))
    (t / "config.json").write_text(json.dumps(target))
    save_file(ckpt if ckpt is not None else _checkpoint(), str(d / "model.safetensors"))
    return d, t


def _doctor(tmp: Path, target: dict[str, Any], draft: dict[str, Any], ckpt: dict[str, torch.Tensor] | None = None) -> DoctorReport:
    d, t = _pair(tmp, target, draft, ckpt)
    report = diagnose(d, t / "config.json")
    assert report.failure is None, (report.failure, report.engine_log)
    return report


def _codes(report: DoctorReport, severity: str | None = "error") -> list[str]:
    return sorted({f["code"] for f in report.findings if severity is None or f["severity"] == severity})


# ------------------------------------------------------------------ the seed's three bugs
def test_clean_llama_pair(tmp_path: Path) -> None:
    report = _doctor(tmp_path, _llama_target(), _draft_config([1, 2, 3]))
    facts = report.facts
    assert facts is not None and facts.draft.cls == "LlamaForCausalLMEagle3" and facts.target.cls == "LlamaForCausalLM"
    (cap,) = report.captures
    assert cap.boundaries == [2, 3, 4] and cap.rule == "sglang_llama" and cap.num_layers == 6
    assert facts.fused_width == facts.fc_in_features == 3 * 64  # three chunks of the shrunk hidden size
    assert facts.hot_token_ids == _hot_set().tolist()[:8] and facts.hot_token_count == DRAFT_VOCAB
    (weights,) = report.weights
    assert weights.ignored == [] and weights.missing == []
    assert _codes(report) == []


def test_ids_past_the_last_layer_bypass_fc(tmp_path: Path) -> None:
    # 4 layers, ids [2, 3, 4]: SGLang's +1 rule asks for boundaries 3, 4, 5; 5 is dropped silently.
    report = _doctor(tmp_path, _llama_target(layers=4), _draft_config([2, 3, 4]))
    assert report.captures[0].boundaries == [3]
    assert report.facts is not None and report.facts.fused_width == 64 and report.facts.fc_in_features == 192
    assert {"fc_bypass", "short_capture"} <= set(_codes(report))


def test_target_capturing_nothing(tmp_path: Path) -> None:
    draft = _draft_config([1, 2, 3])
    draft["eagle_config"]["use_aux_hidden_state"] = False  # SGLang then never sets a capture list
    report = _doctor(tmp_path, _llama_target(), draft)
    assert report.captures == [] or not report.captures[0].enabled
    assert report.facts is not None and report.facts.fused_width == 64
    assert "fc_bypass" in _codes(report)


def test_names_sglang_drops(tmp_path: Path) -> None:
    # SGLang 0.5.23 maps both midlayer.* and layers.0.*; layer.0.* (a converter's typo) it drops without a word.
    report = _doctor(tmp_path, _llama_target(), _draft_config([1, 2, 3]), _checkpoint(prefix="layer.0."))
    (weights,) = report.weights
    assert "layer.0.self_attn.q_proj.weight" in weights.ignored
    assert {"weights_dropped", "weights_missing"} <= set(_codes(report))


def test_layers_0_names_load(tmp_path: Path) -> None:
    report = _doctor(tmp_path, _llama_target(), _draft_config([1, 2, 3]), _checkpoint(prefix="layers.0."))
    assert report.weights[0].ignored == [] and _codes(report) == []


def test_capture_id_off_by_one(tmp_path: Path) -> None:
    # speculators ids (boundaries) copied into eagle_config: the Llama rule adds 1, every chunk a layer late.
    draft = _draft_config([1, 3, 5], speculators_model_type="eagle3")
    report = _doctor(tmp_path, _llama_target(layers=8), draft)
    assert report.captures[0].boundaries == [2, 4, 6]
    assert "aux_layers_mismatch" in _codes(report)


def test_short_capture_crash_is_reported(tmp_path: Path) -> None:
    # [1, 3, 5] on 6 layers: boundary 6 is never captured, two chunks reach a three-chunk fc and
    # SGLang's draft fails at its first forward, as a server would at its first request.
    report = diagnose(*_pair(tmp_path, _llama_target(layers=6), _draft_config([1, 3, 5])))
    assert report.failure is not None and "mat1 and mat2" in report.failure
    assert report.captures[0].boundaries == [2, 4] and "short_capture" in _codes(report)


# ------------------------------------------------------------------ a capture rule per family
@pytest.mark.parametrize(
    ("target", "ids", "rule", "boundaries", "extra"),
    [
        (_llama_target(arch="Qwen3ForCausalLM", model_type="qwen3", head_dim=32), [1, 2, 3], "sglang_llama", [2, 3, 4], {}),
        (_gpt_oss_target(), [1, 2, 3], "sglang_gpt_oss", [2, 3, 4], {}),
        (_deepseek_target(), [1, 2, 3], "sglang_deepseek", [2, 3, 4], {}),
        # literal when the first id is not 1: speculators' ids (boundaries) read right
        (_deepseek_target(), [2, 3, 4], "sglang_deepseek", [2, 3, 4], {"speculators_model_type": "eagle3"}),
    ],
    ids=["qwen3", "gpt-oss", "deepseek-first-id-1", "deepseek-literal"],
)
def test_capture_rule_per_family(
    tmp_path: Path, target: dict[str, Any], ids: list[int], rule: str, boundaries: list[int], extra: dict[str, Any]
) -> None:
    report = _doctor(tmp_path, target, _draft_config(ids, **extra))
    (cap,) = report.captures
    assert (cap.rule, cap.boundaries) == (rule, boundaries)
    assert report.facts is not None and report.facts.fused_width == 192
    assert "aux_layers_mismatch" not in _codes(report)


# ------------------------------------------------------------------ rotary, vocabulary map, flags
def test_rotary_key_lost(tmp_path: Path) -> None:
    # A 500000 target; the draft's config lost its base: SGLang builds the draft's attention at 10000.
    target = _llama_target(rope_theta=500000.0)
    report = _doctor(tmp_path, target, _draft_config([1, 2, 3]))
    assert report.facts is not None
    assert [r.base for r in report.facts.draft.rotaries] == [10000.0] and report.facts.target.rotaries[0].base == 500000.0
    assert "rope_mismatch" in _codes(report, None)


def test_rotary_kept(tmp_path: Path) -> None:
    report = _doctor(tmp_path, _llama_target(rope_theta=500000.0), _draft_config([1, 2, 3], rope_theta=500000.0))
    assert report.facts is not None and report.facts.draft.rotaries[0].base == 500000.0
    assert "rope_mismatch" not in _codes(report, None)


def test_d2t_arange(tmp_path: Path) -> None:
    report = _doctor(tmp_path, _llama_target(), _draft_config([1, 2, 3]), _checkpoint(d2t=torch.arange(DRAFT_VOCAB)))
    assert report.facts is not None and report.facts.hot_token_ids == [0, 2, 4, 6, 8, 10, 12, 14]
    assert "vocab_map_invalid" in _codes(report, None)


def test_flag_the_class_ignores(tmp_path: Path) -> None:
    report = _doctor(tmp_path, _llama_target(), _draft_config([1, 2, 3], norm_before_residual=True))
    assert report.facts is not None
    assert "norm_before_residual" in report.facts.flags_set and "norm_before_residual" not in report.facts.flags_read
    assert "unsupported_config_flag" in _codes(report, None)


# ------------------------------------------------------------------ the command
def test_command_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, t = _pair(tmp_path, _llama_target(layers=4), _draft_config([2, 3, 4]))
    assert cli_main(["doctor", "--draft", str(d), "--target", str(t), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert "fc_bypass" in {f["code"] for f in data["findings"]} and "CUDA graphs" in data["limits"]
    assert cli_main(["doctor", "--draft", str(d), "--target", str(t)]) == 1
    text = capsys.readouterr().out
    first_screen = "\n".join(text.splitlines()[:8])
    assert "cannot show:" in first_screen and "fc_bypass" in text

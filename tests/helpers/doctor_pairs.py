"""The "user's" draft and target configs and checkpoints the doctor's engine tests hand it.

Small already (hidden 128); the doctor shrinks them further, as it shrinks a 671B pair.
Importing this module imports torch, not an engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from spectrace.doctor import DoctorReport, diagnose

HIDDEN, VOCAB, DRAFT_VOCAB = 128, 512, 128


def llama_target(layers: int = 6, arch: str = "LlamaForCausalLM", model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        architectures=[arch], model_type=model_type, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    cfg.update(extra)
    return cfg


def deepseek_target(layers: int = 6) -> dict[str, Any]:
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


def gpt_oss_target(layers: int = 6) -> dict[str, Any]:
    return dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_local_experts=8,
        experts_per_token=2, sliding_window=64, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        max_position_embeddings=512, rope_theta=150000, rms_norm_eps=1e-5, tie_word_embeddings=False, swiglu_limit=7.0,
        attention_bias=True, quantization_config={"quant_method": "mxfp4"},
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 4096},
    )  # fmt: skip


def draft_config(ids: list[int], **extra: Any) -> dict[str, Any]:
    """A SpecForge-format EAGLE-3 draft config.json."""
    cfg: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=VOCAB, hidden_size=HIDDEN,
        intermediate_size=256, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, draft_vocab_size=DRAFT_VOCAB,
        eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    )  # fmt: skip
    cfg.update(extra)
    return cfg


def hot_set() -> torch.Tensor:
    return torch.arange(DRAFT_VOCAB) * 3  # the draft's target ids: every third token


def checkpoint(prefix: str = "midlayer.", d2t: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
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
    hot = hot_set()
    out["d2t"] = (hot - torch.arange(DRAFT_VOCAB)) if d2t is None else d2t  # offsets: draft id i is target id i + d2t[i]
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    out["t2d"] = t2d
    return out


def pair(tmp: Path, target: dict[str, Any], draft: dict[str, Any], ckpt: dict[str, torch.Tensor] | None = None) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    d, t = tmp / "draft", tmp / "target"
    d.mkdir()
    t.mkdir()
    (d / "config.json").write_text(json.dumps(draft))
    (t / "config.json").write_text(json.dumps(target))
    save_file(ckpt if ckpt is not None else checkpoint(), str(d / "model.safetensors"))
    return d, t


def doctor(
    tmp: Path, target: dict[str, Any], draft: dict[str, Any], ckpt: dict[str, torch.Tensor] | None = None, engine: str = "sglang"
) -> DoctorReport:
    d, t = pair(tmp, target, draft, ckpt)
    report = diagnose(d, t / "config.json", engine)
    assert report.failure is None, (report.failure, report.engine_log)
    return report


def codes(report: DoctorReport, severity: str | None = "error") -> list[str]:
    return sorted({f["code"] for f in report.findings if severity is None or f["severity"] == severity})

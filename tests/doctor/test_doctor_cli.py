"""``spectrace doctor`` without an engine run: its inputs, the missing-engine line, the shrink.

The engine runs are tests/doctor/test_doctor_sglang.py (sglang marker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import spectrace.doctor as doctor
from spectrace.cli import COMMANDS
from spectrace.cli import main as cli_main
from spectrace.doctor.shrink import HIDDEN, shrink_config, width_map

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "n_shared_experts": 1,
    "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
    "quantization_config": {"quant_method": "fp8"},
}  # fmt: skip


def test_shrink_keeps_every_structural_key() -> None:
    tiny = shrink_config(DEEPSEEK_V3)
    assert tiny["hidden_size"] == HIDDEN and tiny["num_attention_heads"] == tiny["num_key_value_heads"] == 4
    assert tiny["n_routed_experts"] == 8 and tiny["n_group"] == 2 and tiny["topk_group"] == 1 and tiny["num_experts_per_tok"] == 2
    for key in (
        "num_hidden_layers",
        "first_k_dense_replace",
        "rope_theta",
        "rope_scaling",
        "vocab_size",
        "architectures",
        "max_position_embeddings",
    ):
        assert tiny[key] == DEEPSEEK_V3[key], key
    assert "quantization_config" not in tiny and DEEPSEEK_V3["hidden_size"] == 7168  # the input is left alone


def test_draft_shrinks_beside_its_target() -> None:
    draft = {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "num_attention_heads": 56, "num_key_value_heads": 8,
        "intermediate_size": 40960, "vocab_size": 129280, "draft_vocab_size": 32000, "norm_before_residual": True,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]},
    }  # fmt: skip
    tiny = shrink_config(draft, target_hidden=7168)
    assert (tiny["hidden_size"], tiny["num_key_value_heads"], tiny["draft_vocab_size"]) == (HIDDEN, 2, 32000)
    assert tiny["eagle_config"] == draft["eagle_config"] and tiny["norm_before_residual"] is True
    widths = width_map(draft, tiny)
    assert widths[7168] == HIDDEN and widths[3 * 7168] == 3 * HIDDEN and widths[8 * 128] == 2 * 16


def test_command_is_listed() -> None:
    assert "doctor" in COMMANDS


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["doctor", "--draft", str(tmp_path / "nope"), "--target", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spectrace doctor: error:") and "no such directory" in err[0]
    assert cli_main(["doctor", "--draft", str(tmp_path)]) == 2  # --target is required
    assert "--target" in capsys.readouterr().err


def test_missing_engine_says_how_to_get_its_cpu_build(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": np.zeros((2, 6), dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    monkeypatch.setattr(doctor, "engine_installed", lambda engine: False)
    for engine, script in (("sglang", "scripts/install-sglang-cpu.sh"), ("vllm", "scripts/install-vllm-cpu.sh")):
        assert cli_main(["doctor", "--draft", str(tmp_path), "--target", str(target), "--engine", engine]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{engine} is not installed here" in line and script in line

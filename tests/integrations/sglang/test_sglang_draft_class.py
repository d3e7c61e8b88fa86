"""draft_class_mismatch at runtime, on SGLang 0.5.23's own ModelConfig, loader and classes.

sglang#20809: an EAGLE-3 draft whose config.json says ``DeepseekV3ForCausalLM`` is renamed
by SGLang's ``ModelConfig`` (draft model) to ``DeepseekV3ForCausalLMNextN``, and the loader
builds that multi-token-prediction head. The bug is first shown on the engine's objects
(the renamed architectures, the class ``get_model_architecture`` picks, the model built),
then spectrace names it where the draft worker's runner returns from ``load_model``. The
clean twins (an EAGLE-3 class for an EAGLE-3 checkpoint; a real NextN head) say nothing.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.integrations.sglang import modules as st_modules
from tests.helpers import sglang_harness as sh

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def installed():
    yield from sh.installed()


@pytest.fixture
def rec(monkeypatch, rec):
    """The folder's ``rec``, with TorchDynamo off for the loader's models."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    return rec


def _deepseek_draft_dir(tmp_path: Path, aux_ids: list[int] | None) -> Path:
    raw = sh.tiny_deepseek_v3_config().to_dict()
    raw.update(architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=1)
    if aux_ids is not None:  # what makes it an EAGLE-3 draft: fc over these aux states
        raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def _llama_eagle3_dir(tmp_path: Path) -> Path:
    raw = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=128, hidden_size=64,
        intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, draft_vocab_size=32, target_hidden_size=64,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def _build_as_sglang_does(folder: Path):
    """The draft worker's steps: ModelConfig (draft), the loader's class, the model."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    config = ModelConfig(str(folder), is_draft_model=True)
    cls, arch = get_model_architecture(config)
    model = cls(config.hf_config)
    return config, arch, model


def _runner_returns(config, model) -> None:
    """``ModelRunner.load_model`` returning on the draft worker (its AFTER hook, with the
    runner's three attributes it reads; a ModelRunner needs a GPU server to build)."""
    runner = types.SimpleNamespace(model=model, model_config=config, is_draft_worker=True, server_args=None)
    st_modules.after_load_model(None, runner)


def _found(rec):
    return [f for f in rec.findings() if f.code == "draft_class_mismatch"]


def test_eagle3_checkpoint_built_as_a_nextn_head(rec, tmp_path: Path) -> None:
    config, arch, model = _build_as_sglang_does(_deepseek_draft_dir(tmp_path, [1, 2, 3]))
    print(f"config.json says DeepseekV3ForCausalLM; ModelConfig: {config.hf_config.architectures}; built {type(model).__name__}")
    assert config.hf_config.architectures[0] == "DeepseekV3ForCausalLMNextN" == type(model).__name__
    assert not hasattr(model, "fc") and not hasattr(model.model, "fc")  # no fc over aux states anywhere
    _runner_returns(config, model)
    (one,) = _found(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.module == "draft"
    assert "SGLang built DeepseekV3ForCausalLMNextN (SGLang renamed the draft's DeepseekV3ForCausalLM to it)" in one.message
    assert one.evidence["built_class"] == "DeepseekV3ForCausalLMNextN" and one.evidence["class_kind"] == "nextn"
    assert "LlamaForCausalLMEagle3" in one.fix


def test_real_nextn_head_says_nothing(rec, tmp_path: Path) -> None:
    # A genuine MTP head (no aux-layer ids, no fc): NextN is the right class.
    config, _, model = _build_as_sglang_does(_deepseek_draft_dir(tmp_path, None))
    assert type(model).__name__ == "DeepseekV3ForCausalLMNextN"
    _runner_returns(config, model)
    assert _found(rec) == []


def test_eagle3_class_for_an_eagle3_checkpoint_says_nothing(rec, tmp_path: Path) -> None:
    config, _, model = _build_as_sglang_does(_llama_eagle3_dir(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLMEagle3"
    _runner_returns(config, model)
    assert _found(rec) == []
    assert [f.code for f in rec.findings() if f.severity == "error"] == []


# ------------------------------------------------------------------ the full target built as the draft
# The other direction (sglang#20809 as it happened: a DeepSeek-V3.2 MTP checkpoint,
# DeepseekV32ForCausalLM, was not renamed to its NextN head, so the draft worker built the
# full model). 0.5.23 renames DeepseekV32; a checkpoint whose architectures name a target
# class it does not rename (here the Llama target's own) shows the same on its objects.
def _llama_dir(tmp_path: Path, layers: int) -> Path:
    raw = sh.tiny_llama_config(layers=layers).to_dict()
    raw.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def _target_runner_returns(tmp_path: Path):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    config = ModelConfig(str(_llama_dir(tmp_path / "target", sh.N_LAYERS)))
    cls, _ = get_model_architecture(config)
    target = cls(config.hf_config)
    runner = types.SimpleNamespace(model=target, model_config=config, is_draft_worker=False, server_args=None)
    st_modules.after_load_model(None, runner)
    return target


def test_the_full_target_built_as_the_draft(rec, tmp_path: Path) -> None:
    target = _target_runner_returns(tmp_path)
    config, arch, draft = _build_as_sglang_does(_llama_dir(tmp_path / "mtp", sh.N_LAYERS))
    print(f"draft config.json says LlamaForCausalLM; ModelConfig: {config.hf_config.architectures}; built {type(draft).__name__}")
    assert type(draft) is type(target) and len(draft.model.layers) == len(target.model.layers) == sh.N_LAYERS
    _runner_returns(config, draft)
    (one,) = _found(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.evidence["class_kind"] == "target" and one.evidence["target_class"] == "LlamaForCausalLM"
    assert "the target's own class" in one.message and f"{sh.N_LAYERS} decoder layers" in one.message
    assert one.evidence["draft_params"] == one.evidence["target_params"]


def test_a_whole_small_draft_model_says_nothing(rec, tmp_path: Path, monkeypatch) -> None:
    # A standalone draft: a one-layer model of the target's own class, by design.
    from spectrace.integrations.sglang import server

    monkeypatch.setattr(server, "spec_args", lambda: {"speculative_algorithm": "STANDALONE"})
    _target_runner_returns(tmp_path)
    config, _, draft = _build_as_sglang_does(_llama_dir(tmp_path / "small", 1))
    _runner_returns(config, draft)
    assert _found(rec) == []


def test_an_eagle3_draft_beside_its_target_says_nothing(rec, tmp_path: Path) -> None:
    _target_runner_returns(tmp_path)
    config, _, draft = _build_as_sglang_does(_llama_eagle3_dir(tmp_path))
    _runner_returns(config, draft)
    assert _found(rec) == []

"""draft_class_mismatch: an EAGLE-3 checkpoint whose ``architectures`` make SGLang build a
NextN/MTP or EAGLE-1 class (sglang#20809), first in SGLang 0.5.23's own ModelConfig and
registry, then in the audit; the clean twin says nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spectrace.audit.checkpoint import read_checkpoint, read_target_config
from spectrace.checks.checkpoint import audit
from spectrace.rules.draft_classes import built_class
from spectrace.rules.engines import get_engine
from tests.helpers import paths

FIX = paths.FIXTURES
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"


def _variant(tmp_path: Path, architectures: list[str]) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(SPECFORGE, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = architectures
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _codes(path: Path) -> list[str]:
    ckpt = read_checkpoint(path)
    found = audit(ckpt.config, ckpt.tensors, get_engine("sglang"), read_target_config(TARGET)).findings
    return [f.code for f in found]


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "Qwen3NextForCausalLMMTP", "LlamaForCausalLMEagle"])
def test_an_eagle3_checkpoint_built_as_another_class(tmp_path: Path, arch: str) -> None:
    assert "draft_class_mismatch" in _codes(_variant(tmp_path, [arch]))


def test_clean_twin(tmp_path: Path) -> None:
    assert "draft_class_mismatch" not in _codes(_variant(tmp_path, ["LlamaForCausalLMEagle3"]))


def test_rules_equal_sglang_own_registry_and_renames() -> None:
    """Every class the table names is in SGLang 0.5.23's registry; its rename of a draft's
    DeepseekV3ForCausalLM is the one the table says (read from ModelConfig's own source)."""
    import inspect

    from sglang.srt.configs import model_config
    from sglang.srt.models.registry import ModelRegistry

    from spectrace.rules.draft_classes import DRAFT_RENAMES, EAGLE3_CLASSES, EAGLE_CLASSES, NEXTN_CLASSES

    known = set(ModelRegistry.get_supported_archs())
    missing = sorted((EAGLE3_CLASSES | EAGLE_CLASSES | NEXTN_CLASSES) - known)
    assert not missing, missing
    source = inspect.getsource(model_config)
    for original, renamed in DRAFT_RENAMES.items():
        assert f'"{original}"' in source and f'"{renamed}"' in source, original
    assert built_class(["DeepseekV32ForCausalLM"]) == ("DeepseekV3ForCausalLMNextN", "nextn")


def _as_target_class(tmp_path: Path, layers: int) -> Path:
    dst = _variant(tmp_path, ["LlamaForCausalLM"])  # the target's own class, not renamed by SGLang
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_draft_that_builds_the_full_target_class(tmp_path: Path) -> None:
    target_layers = read_target_config(TARGET).num_hidden_layers
    ckpt = read_checkpoint(_as_target_class(tmp_path, target_layers))
    found = [
        f
        for f in audit(ckpt.config, ckpt.tensors, get_engine("sglang"), read_target_config(TARGET)).findings
        if f.code == "draft_class_mismatch"
    ]
    (one,) = found
    assert one.evidence["class_kind"] == "target" and "the target's own class" in one.message
    # One layer of the target's class is no full target (a standalone draft is built so).
    assert "draft_class_mismatch" not in _codes(_as_target_class(tmp_path / "one", 1))

"""Tensors that misfit because of one config key are one ``shape_mismatch`` naming it.

The SpecForge fixture (hidden 64) with ``hidden_size`` set to 128 in its config.json: SGLang
0.5.23's loader model expects 128-wide tensors everywhere, and every tensor of the decoder
layer, the norm and the head misfits. The audit says so once, with the key and both values;
the fixture as written has no shape finding (the clean twin).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from spectrace.checks.shape_causes import group_by_config_key
from spectrace.cli.audit import run_audit
from tests.helpers import paths

TARGET = str(paths.FIXTURES / "target_llama_config.json")


def _draft(tmp_path: Path, **config: object) -> Path:
    draft = tmp_path / "draft"
    shutil.copytree(paths.FIXTURES / "specforge_tiny", draft)
    raw = json.loads((draft / "config.json").read_text())
    raw.update(config)
    (draft / "config.json").write_text(json.dumps(raw))
    return draft


def _shape_findings(draft: Path) -> list:
    _ckpt, _target, result = run_audit(draft, "sglang", None, TARGET)
    return [f for f in result.findings if f.code == "shape_mismatch"]


def test_a_wrong_hidden_size_is_one_finding_naming_the_key_and_both_values(tmp_path: Path) -> None:
    shapes = _shape_findings(_draft(tmp_path, hidden_size=128))
    per_tensor = [f for f in shapes if "tensor" in f.evidence]
    assert per_tensor == []  # not twelve blocks that each say a shape
    (grouped,) = [f for f in shapes if f.evidence.get("config_key")]
    assert (grouped.evidence["config_key"], grouped.evidence["config_value"], grouped.evidence["weights_value"]) == ("hidden_size", 128, 64)
    assert len(grouped.evidence["misfits"]) == 12 and grouped.evidence["misfits"]["norm.weight"] == {"shape": [64], "expected": [128]}
    assert grouped.message.startswith("config.json's hidden_size is 128 but the weights are 64 wide: 12 tensors do not fit")
    assert grouped.fix and grouped.fix.startswith("set hidden_size to 64 in the draft's config.json")


def test_a_wrong_intermediate_size_names_that_key(tmp_path: Path) -> None:
    cfg = json.loads((paths.FIXTURES / "specforge_tiny" / "config.json").read_text())
    shapes = _shape_findings(_draft(tmp_path, intermediate_size=cfg["intermediate_size"] * 2))
    (grouped,) = shapes
    assert grouped.evidence["config_key"] == "intermediate_size" and grouped.evidence["weights_value"] == cfg["intermediate_size"]
    assert sorted(grouped.evidence["misfits"]) == [f"midlayer.mlp.{p}_proj.weight" for p in ("down", "gate", "up")]


def test_the_clean_fixture_has_no_shape_finding(tmp_path: Path) -> None:
    assert _shape_findings(_draft(tmp_path)) == []


def test_a_lone_misfit_keeps_its_own_finding() -> None:
    # One tensor off, nothing else: no key is named on one misfit's word.
    groups, rest = group_by_config_key([("fc.weight", "model.fc.weight", [64, 100], (64, 192))], {"hidden_size": 64})
    assert groups == [] and len(rest) == 1

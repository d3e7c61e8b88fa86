"""The audit's weights verdict agrees with the REAL SGLang 0.5.23 load of the same checkpoint.

For each case one config and one set of tensors go two ways: ``spectrace audit --engine
sglang==0.5.23`` on a checkpoint directory written from them, and the real
``LlamaForCausalLMEagle3`` built from the config (tests/sglang_harness.py) loading the
tensors through spectrace's observed ``load_weights`` (the ``rec`` / ``installed``
fixtures of test_sglang_integration). The names dropped and the parameters left unwritten
must be the same sets, and so must the parameters the audit expects the class to create.

Skipped when sglang is not installed (scripts/install-sglang-cpu.sh VENV).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import paths

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file

from spectrace.audit.checkpoint import read_checkpoint
from spectrace.checks.checkpoint import audit
from spectrace.records import Weights
from spectrace.rules.engines import dims_of, get_engine
from tests.helpers import sglang_harness as sh
from tests.integrations.sglang import test_sglang_integration as si

pytestmark = pytest.mark.sglang

installed, rec = si.installed, si.rec  # the SGLang integration tests' fixtures, used here by name
FIX = paths.FIXTURES
Tensors = dict[str, Any]


def _config(**flags: Any) -> dict[str, Any]:
    """The SGLang-format config of the tiny draft (hand conversion of the speculators fixture)."""
    cfg = json.loads((FIX / "specforge_tiny" / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(target_hidden_size=64, **flags)
    return cfg


def _speculators_tensors() -> Tensors:
    return load_file(str(FIX / "speculators_tiny" / "model.safetensors"))


def _without(*names: str) -> Callable[[Tensors], Tensors]:
    return lambda w: {k: v for k, v in w.items() if k not in names}


def _with_norms(names: list[str]) -> Callable[[Tensors], Tensors]:
    return lambda w: {**w, **{n: torch.full((64,), 1.5) for n in names}}


FC_NORM = [f"fc_norm.{i}.weight" for i in range(3)]
AUX_NORM = [f"aux_norm_{p}.weight" for p in ("low", "mid", "high")]
CASES: dict[str, tuple[dict[str, Any], Callable[[Tensors], Tensors]]] = {
    "norm_before_fc, full checkpoint": ({"norm_before_fc": True}, lambda w: w),
    "norm_before_fc, no input_norm tensor": ({"norm_before_fc": True}, _without("input_norm.weight")),
    "no flag, input_norm tensor kept": ({}, lambda w: w),
    "fc_norm, fc_norm.i tensors": ({"fc_norm": True}, lambda w: _with_norms(FC_NORM)(_without("input_norm.weight")(w))),
    "fc_norm, legacy aux_norm_* tensors": ({"fc_norm": True, "norm_before_fc": True}, _with_norms(AUX_NORM)),
    "fc_norm, no tensors": ({"fc_norm": True, "norm_before_fc": True}, lambda w: w),
    "no flag, fc_norm.i tensors": ({"norm_before_fc": True}, _with_norms(FC_NORM)),
    "misnamed decoder layer": (
        {"norm_before_fc": True},
        lambda w: {k.replace("layers.0.", "layer.0."): v for k, v in w.items()},
    ),
    "no d2t, no input_norm": ({"norm_before_fc": True}, _without("d2t", "input_norm.weight")),
}


def _audit_verdict(tmp_path: Path, cfg: dict[str, Any], tensors: Tensors):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(draft / "model.safetensors"))
    ckpt = read_checkpoint(draft)
    engine = get_engine("sglang", "0.5.23")
    result = audit(ckpt.config, ckpt.tensors, engine, None)
    weights = [f for f in result.findings if f.code.startswith("weights_")]
    missing = {p for f in weights if f.code == "weights_missing" for p in f.evidence["parameters"]}
    params = engine.params(dims_of(ckpt.config))
    return set(result.summary["weights"]["dropped"]), missing, {f.code for f in weights}, params


@pytest.mark.parametrize("case", list(CASES))
def test_audit_agrees_with_the_real_sglang_0523_load(rec, tmp_path: Path, case: str) -> None:
    flags, edit = CASES[case]
    cfg, tensors = _config(**flags), edit(_speculators_tensors())
    dropped, missing, codes, params = _audit_verdict(tmp_path, cfg, tensors)

    draft = sh.build_sglang_eagle3_draft(cfg)
    real_params = {n: tuple(p.shape) for n, p in draft.named_parameters()}
    draft.load_weights(list(tensors.items()))
    (record,) = [r for r in rec.records() if isinstance(r, Weights)]
    real_codes = {f.code for f in rec.findings() if f.code.startswith("weights_")}

    # The parameters the audit expects the class to create are the real class's, shape for shape.
    assert {n: p.shape for n, p in params.items()} == real_params
    assert set(record.ignored) == dropped, case
    assert set(record.missing) == missing, case
    assert real_codes == codes, case


def test_the_cases_cover_both_verdicts(rec, tmp_path: Path) -> None:
    """The flag norms are judged both ways: loaded clean, and dropped or left at init."""
    clean = _audit_verdict(_mk(tmp_path, "a"), _config(norm_before_fc=True), _speculators_tensors())
    missing = _audit_verdict(_mk(tmp_path, "b"), _config(norm_before_fc=True), _without("input_norm.weight")(_speculators_tensors()))
    dropped = _audit_verdict(_mk(tmp_path, "c"), _config(), _speculators_tensors())
    assert clean[:3] == (set(), set(), set())
    assert missing[1] == {"model.input_norm.weight"} and missing[2] == {"weights_missing"}
    assert dropped[0] == {"input_norm.weight"} and dropped[2] == {"weights_dropped"}


def _mk(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_null_target_hidden_size_is_reported_and_really_breaks_the_draft(tmp_path, installed):
    """A conversion that leaves ``"target_hidden_size": null``: the audit says the draft will
    not build, and SGLang's own class indeed fails to build it."""
    folder = tmp_path / "draft"
    folder.mkdir()
    config = json.loads((FIX / "specforge_tiny" / "config.json").read_text())
    config["target_hidden_size"] = None
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((FIX / "specforge_tiny" / "model.safetensors").read_bytes())
    ckpt = read_checkpoint(folder)
    result = audit(ckpt.config, ckpt.tensors, get_engine("sglang", "0.5.23"), None)
    (found,) = [f for f in result.findings if f.evidence.get("target_hidden_size", "absent") is None]
    assert found.code == "shape_mismatch" and found.severity == "error" and "null" in found.message
    config.pop("rope_parameters", None)
    with pytest.raises(TypeError):
        sh.build_sglang_eagle3_draft(config)
    config["target_hidden_size"] = config["hidden_size"]  # the fix the finding names: the draft builds
    sh.build_sglang_eagle3_draft(config)


def test_a_hidden_size_the_weights_do_not_have_is_one_finding_and_really_fails_to_load(tmp_path):
    """``hidden_size`` 128 over the fixture's 64-wide weights: SGLang's own class, built from
    that config, refuses the first weight it loads; the audit names the key and both values
    once, for every tensor at once."""
    folder = tmp_path / "draft"
    folder.mkdir()
    config = json.loads((FIX / "specforge_tiny" / "config.json").read_text())
    config["hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((FIX / "specforge_tiny" / "model.safetensors").read_bytes())
    ckpt = read_checkpoint(folder)
    result = audit(ckpt.config, ckpt.tensors, get_engine("sglang", "0.5.23"), None)
    (grouped,) = [f for f in result.findings if f.evidence.get("config_key") == "hidden_size"]
    assert (grouped.evidence["config_value"], grouped.evidence["weights_value"]) == (128, 64)
    assert not [f for f in result.findings if f.code == "shape_mismatch" and "tensor" in f.evidence]
    weights = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(folder / "model.safetensors").items()}
    config.pop("rope_parameters", None)
    with pytest.raises(AssertionError, match="Attempted to load weight"):
        sh.build_sglang_eagle3_draft(config, weights)

"""SGLang's classes built without a server, and capture rules that change between releases.

Real SGLang 0.5.23 classes on CPU (tests/sglang_harness.py), spectrace's hooks installed
on them by the ``installed`` fixture of test_sglang_integration.py:

- no server args: the draft's config is read from the draft object when SGLang builds
  it, and the capture check runs as soon as target and draft are both known, in either
  order, once (B1, B2, B3);
- the version table (``eagle3.conventions.SGLANG_CAPTURE``): the embedding-first ids of
  the shipped draft crash SGLang 0.5.17's Llama target at the first forward, and
  ``capture_unsupported`` says so at ``set_eagle3_layers_to_capture``; 0.5.23 captures the
  embedding (A1). The offline audit gives the same finding (A2, CLI in test_audit.py).

The installed release is 0.5.23, so the 0.5.17 rule is driven through the check function
and through the runtime join fed the capture record a 0.5.17 process would write (the
same record with its ``engine_version``); the 0.5.23 runtime path runs end to end.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import paths

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spectrace.audit.checkpoint import read_checkpoint, read_target_config
from spectrace.checks.capture import check_engine_support
from spectrace.checks.checkpoint import audit
from spectrace.integrations.sglang import correlate, server
from spectrace.integrations.sglang import state as st_state
from spectrace.records import Capture
from spectrace.rules.conventions import engine_boundaries, engine_rule
from spectrace.rules.engines import get_engine
from tests.helpers import sglang_harness as sh
from tests.integrations.sglang import test_sglang_integration as si
from tests.integrations.sglang.test_sglang_integration import _codes, _of, _speculators_weights  # noqa: F401

pytestmark = pytest.mark.sglang

installed = si.installed  # the SGLang integration tests' hooks, used here by name (rec: this folder's conftest)
ROOT = paths.ROOT
FIXTURES = paths.FIXTURES
DATA = ROOT / "spectrace" / "eagle3" / "data"  # the shipped draft: ids [-1, 1, 3], the embedding first
JOIN_CODES = ("aux_layers_mismatch", "unsupported_config_flag", "short_capture", "capture_unsupported", "algorithm_mismatch")


def _join(recorder) -> list[tuple[str, str, str | None, str, str]]:
    """The capture-join findings, comparable across runs."""
    return sorted((f.code, f.severity, f.module, f.message, f.fix) for f in recorder.findings() if f.code in JOIN_CODES)


# ------------------------------------------------------------------ no server args (B)
def _speculators_converted() -> dict:
    """The real speculators config, converted by hand for SGLang (no reader of its own):
    transformer_layer_config flattened, architectures set, every other top-level key kept,
    so the ids stay at the top level, where SGLang never looks."""
    raw = json.loads((FIXTURES / "speculators_tiny" / "config.json").read_text())
    flat = {**raw.pop("transformer_layer_config"), **raw}
    flat["architectures"] = ["LlamaForCausalLMEagle3"]
    flat["target_hidden_size"] = 64
    flat.pop("rope_parameters", None)
    return flat


def _target_cfg():
    return transformers.LlamaConfig(**json.loads((FIXTURES / "target_llama_config.json").read_text()))


def _speculators_target():
    # SGLang finds no eagle_config ids in this config and passes None: its defaults [2, n//2, n-3].
    return sh.build_sglang_llama_target(_target_cfg(), None, layer_ids=None)


def test_b1_no_server_args_target_then_draft_finds_the_ignored_top_level_ids(rec):
    assert server.spec_args().get("speculative_draft_model_path") is None  # no server here
    _speculators_target()
    (capture,) = _of(rec, Capture)
    assert capture.boundaries == [2, 4, 5]
    assert "aux_layers_mismatch" not in _codes(rec)  # nothing known about the draft yet

    sh.build_sglang_eagle3_draft(_speculators_converted())  # SGLang builds the draft: its config is known
    (mismatch,) = [f for f in rec.findings() if f.code == "aux_layers_mismatch"]
    assert mismatch.severity == "error"
    assert mismatch.evidence["captured_boundaries"] == [2, 4, 5]
    assert mismatch.evidence["readings"]["speculators"] == {
        "ids": [1, 3, 6],
        "boundaries": [1, 3, 6],
        "source": "top-level eagle_aux_hidden_state_layer_ids",
    }
    assert "unsupported_config_flag" in _codes(rec, "error")  # norm_before_residual: SGLang ignores it


def test_b1_findings_equal_those_with_server_args(rec, tmp_path, monkeypatch):
    """The same pair, once with no server (the draft object's config), once with server
    args naming the draft directory (its raw config.json): the same findings."""
    _speculators_target()
    sh.build_sglang_eagle3_draft(_speculators_converted())
    without_server = _join(rec)
    assert without_server

    st_state.reset(rec)
    rec.important.clear()
    (tmp_path / "config.json").write_text(json.dumps(_speculators_converted()))
    monkeypatch.setattr(server, "spec_args", lambda: {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(tmp_path)})
    _speculators_target()
    sh.build_sglang_eagle3_draft(_speculators_converted())
    assert st_state.STATE.draft_config_source == f"{tmp_path}/config.json"  # the raw file still wins
    assert _join(rec) == without_server


def test_b2_draft_then_target_same_finding_once(rec):
    """Draft built first (twice, then loaded: its config arrives three times), target last:
    the finding comes with the target, once, and equals the target-first one."""
    draft = sh.build_sglang_eagle3_draft(_speculators_converted())
    assert "aux_layers_mismatch" not in _codes(rec)  # no capture yet
    sh.build_sglang_eagle3_draft(_speculators_converted())  # a second draft object, the same config
    _speculators_target()
    draft.load_weights(list(_speculators_weights().items()))  # and again at the load
    codes = _codes(rec)
    assert codes.count("aux_layers_mismatch") == 1 and codes.count("unsupported_config_flag") == 1
    draft_first = _join(rec)

    st_state.reset(rec)
    rec.important.clear()
    _speculators_target()
    sh.build_sglang_eagle3_draft(_speculators_converted())
    assert _join(rec) == draft_first


@pytest.mark.parametrize("order", ["target_first", "draft_first"])
def test_b3_specforge_config_on_deepseek_v3_without_server_args(rec, order):
    """SpecForge ids [2, 3, 4] mean boundaries [3, 4, 5]; DeepSeek's rule (+1 only when the
    first id is 1) captures [2, 3, 4] literally: one layer early, found with no server."""
    ids = [2, 3, 4]
    build_target = lambda: sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), None, layer_ids=ids)  # noqa: E731
    build_draft = lambda: sh.build_sglang_eagle3_draft(sh.draft_config(layer_ids=ids))  # noqa: E731
    for build in (build_target, build_draft) if order == "target_first" else (build_draft, build_target):
        build()
    (capture,) = _of(rec, Capture)
    rule = engine_rule("DeepseekV3ForCausalLM", server.sglang_version())
    assert capture.rule == rule == "sglang_deepseek"
    assert capture.boundaries == engine_boundaries(ids, rule, 6).boundaries == [2, 3, 4]
    (mismatch,) = [f for f in rec.findings() if f.code == "aux_layers_mismatch"]
    assert mismatch.severity == "error"
    assert mismatch.evidence["readings"]["specforge"]["boundaries"] == [3, 4, 5]
    assert "under the speculators reading they agree" in mismatch.message
    assert "capture_unsupported" not in _codes(rec)


# ------------------------------------------------------------- release rules (A)
def _shipped_pair():
    """The shipped 6-layer Llama target config and the draft config with ids [-1, 1, 3]."""
    target_cfg = transformers.LlamaConfig(**json.loads((DATA / "target_config.json").read_text()))
    draft_cfg = json.loads((DATA / "draft_config.json").read_text())
    return target_cfg, draft_cfg


def _shipped_capture(rec) -> tuple[Capture, object]:
    target_cfg, draft_cfg = _shipped_pair()
    ids = draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]  # what SGLang passes the target
    target = sh.build_sglang_llama_target(target_cfg, None, layer_ids=ids)
    (capture,) = _of(rec, Capture)
    return capture, target


def test_a1_embedding_first_ids_on_0523_are_captured_and_clean(rec):
    """What the installed 0.5.23 does with id -1: layers_to_capture 0, the embedding output
    itself as the first chunk. No capture_unsupported, no error finding."""
    assert server.sglang_version() == "0.5.23"
    capture, target = _shipped_capture(rec)
    sh.build_sglang_eagle3_draft(_shipped_pair()[1])
    assert capture.boundaries == [0, 2, 4] and capture.model_extra["engine_version"] == "0.5.23"
    assert capture.model_extra["target_family"] == "llama"
    assert _codes(rec, "error") == [] and "capture_unsupported" not in _codes(rec)
    ids = torch.randint(0, 128, (10,), generator=torch.Generator().manual_seed(3))
    out = sh.run_target(target, ids)
    with torch.no_grad():
        assert torch.equal(out.hidden_states[:, :64], target.model.embed_tokens(ids))


def _assert_names_0517(found) -> None:
    assert found.code == "capture_unsupported" and found.severity == "error"
    assert "SGLang 0.5.17" in found.message and "LlamaForCausalLM" in found.message
    assert "residual is still None" in found.message and "0.5.17 l.437" in found.message
    assert "SGLang 0.5.22 or newer" in found.fix and "retrain" in found.fix
    assert found.evidence["engine_version"] == "0.5.17" and found.evidence["supported_since"] == "0.5.22"


def test_a1_embedding_first_ids_under_the_0517_rule(rec):
    capture, _ = _shipped_capture(rec)
    assert check_engine_support(capture, "0.5.23") == []
    (found,) = check_engine_support(capture, "0.5.17")
    _assert_names_0517(found)


def test_a1_runtime_join_says_it_at_the_capture_call_once(rec):
    """A 0.5.17 process writes the same capture record with engine_version 0.5.17: the join
    emits the finding at once (before any forward, where 0.5.17 would crash), once."""
    capture, _ = _shipped_capture(rec)
    st_state.reset(rec)
    rec.important.clear()
    as_0517 = Capture(**{**capture.model_dump(), "engine_version": "0.5.17"})
    correlate.note_capture(as_0517)
    (found,) = [f for f in rec.findings() if f.code == "capture_unsupported"]
    _assert_names_0517(found)
    assert found.module == "target"
    sh.build_sglang_eagle3_draft(_shipped_pair()[1])  # the draft's config joins: nothing said twice
    correlate.note_capture(Capture(**as_0517.model_dump()))  # and the same capture again
    assert _codes(rec).count("capture_unsupported") == 1
    assert _codes(rec, "error") == ["capture_unsupported"]  # the stamped training agrees with the capture


def test_a1_audit_gives_the_runtime_finding(rec, tmp_path):
    """``spectrace audit --engine sglang==0.5.17`` and the runtime check: one finding."""
    capture, _ = _shipped_capture(rec)
    (runtime,) = check_engine_support(capture, "0.5.17")
    draft_dir = tmp_path / "draft"
    draft_dir.mkdir()
    shutil.copy(DATA / "draft_config.json", draft_dir / "config.json")
    shutil.copy(DATA / "draft.safetensors", draft_dir / "model.safetensors")
    ckpt = read_checkpoint(draft_dir)
    target = read_target_config(DATA / "target_config.json")
    (offline,) = [f for f in audit(ckpt.config, ckpt.tensors, get_engine("sglang", "0.5.17"), target).findings
                  if f.code == "capture_unsupported"]  # fmt: skip
    assert (offline.severity, offline.module, offline.message, offline.fix) == (
        runtime.severity, runtime.module, runtime.message, runtime.fix,
    )  # fmt: skip
    assert not [f for f in audit(ckpt.config, ckpt.tensors, get_engine("sglang", "0.5.23"), target).findings]


def test_deepseek_minus_one_is_said_before_0523_raises(rec):
    """The shipped ids on DeepSeek-V3 (0.5.23, installed): -1 is never reached, and the
    first forward raises. spectrace says so at the capture call, before it."""
    target = sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), None, layer_ids=[-1, 1, 3])
    (found,) = [f for f in rec.findings() if f.code == "capture_unsupported"]
    assert found.severity == "error" and "SGLang 0.5.23's DeepseekV3ForCausalLM" in found.message
    assert "reaches 2 of the 3 layers" in found.message and "captured N of M aux hidden states" in found.message
    assert "short_capture" in _codes(rec)
    with pytest.raises(RuntimeError, match="captured 2 of 3 aux hidden states"):
        sh.run_target(target, torch.arange(8))

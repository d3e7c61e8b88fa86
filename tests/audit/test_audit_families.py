"""Every SGLang target family's id rule, the trainer's record, and safetensors offsets as the loader sees them.

- The rule table (``rules.conventions``) against SGLang 0.5.23's own ``set_eagle3_layers_to_capture``
  of each family, run on objects that hold only what the method touches; a Qwen3 target built
  whole on CPU through the capture seam (sglang marker).
- A target whose rule spectrace has not read: the finding says "rule unknown" with the observed boundaries.
- The trainer's record: ``--trained-with``, ``train_command.txt``, a speculators config; the
  "SpecForge or speculators?" warning becomes nothing or a certain error.
- A safetensors file whose fc.weight overlaps d2t: safetensors refuses it, and so does the audit.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from spectrace.audit.checkpoint import read_checkpoint
from spectrace.audit.trainer_record import read_trainer_record
from spectrace.checks.capture import check_capture
from spectrace.records import Capture
from spectrace.rules.conventions import engine_boundaries, engine_rule, sglang_default_ids, sglang_family, sglang_rule_known
from tests.helpers import paths

ROOT = paths.ROOT
FIXTURES = paths.FIXTURES
TARGET = FIXTURES / "target_llama_config.json"


def _audit(folder: Path, *extra: str) -> tuple[int, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "audit", str(folder), "--target-config", str(TARGET), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {"stderr": out.stderr})


def _aux(report: dict) -> list[tuple[str, str]]:
    return [(f["code"], f["severity"]) for f in report.get("findings", []) if f["code"] == "aux_layers_mismatch"]


# ------------------------------------------------------------------ the rule table vs SGLang's own methods
def _sglang_rule_run(module: str, cls: str, ids: list[int] | None, n: int) -> list[int]:
    """``layers_to_capture`` after SGLang's own method, on a stand-in holding only what it reads."""
    mod = pytest.importorskip(f"sglang.srt.models.{module}")
    method = getattr(mod, cls).set_eagle3_layers_to_capture
    inner = types.SimpleNamespace(layers_to_capture=[])
    inner.set_eagle3_layers_to_capture = lambda ltc: setattr(inner, "layers_to_capture", list(ltc))  # the MoE models' own setter
    inner.layers = [types.SimpleNamespace() for _ in range(n)]
    owner = types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_last_rank=True),
        config=types.SimpleNamespace(num_hidden_layers=n, text_config=types.SimpleNamespace(num_hidden_layers=n)),
        model=inner,
    )
    method(owner, ids)
    return list(inner.layers_to_capture)


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("module", "cls"),
    [
        ("qwen3", "Qwen3ForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"),
        ("glm4_moe", "Glm4MoeForCausalLM"),
        ("gemma3_causal", "Gemma3ForCausalLM"),
        ("minimax_m2", "MiniMaxM2ForCausalLM"),
        ("deepseek_v2", "DeepseekV2ForCausalLM"),
        ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
        ("gpt_oss", "GptOssForCausalLM"),
    ],
)
@pytest.mark.parametrize("ids", [[1, 3, 5], [2, 4, 5], [2, 4, 8], [-1, 2, 4]])
def test_table_rule_equals_sglang_method(module, cls, ids):
    sh = pytest.importorskip("tests.helpers.sglang_harness")
    sh.setup()
    n = 8
    rule = engine_rule(cls, "0.5.23")
    assert sglang_rule_known(cls)
    ltc = _sglang_rule_run(module, cls, ids, n)
    top = n + 1 if rule == "sglang_gpt_oss" else n
    observed = [b for b in range(top) if b in set(ltc)]
    assert engine_boundaries(ids, rule, n).boundaries == observed, (cls, rule, ltc)


def test_family_rules_and_defaults():
    assert engine_rule("Qwen3ForCausalLM") == engine_rule("Qwen3MoeForCausalLM") == "sglang_llama"
    assert engine_rule("Glm4MoeLiteForCausalLM") == engine_rule("DeepseekV3ForCausalLM") == "sglang_deepseek"
    assert engine_rule("GptOssForCausalLM") == "sglang_gpt_oss"
    # GPT-OSS: ids whose largest is the layer count are boundaries, the last one at the final norm
    assert engine_boundaries([2, 12, 24], "sglang_gpt_oss", 24).boundaries == [2, 12, 24]
    assert engine_boundaries([1, 11, 21], "sglang_gpt_oss", 24).boundaries == [2, 12, 22]
    assert sglang_default_ids("MiniMaxM3SparseForConditionalGeneration", 8) == [3, 5, 6]
    assert sglang_default_ids("Qwen3ForCausalLM", 8) == [2, 4, 5]
    assert sglang_family(["MyTarget", "Qwen3ForCausalLM"]) == "plus_one"
    assert not sglang_rule_known("MysteryForCausalLM")


def test_unknown_family_says_rule_unknown_with_observed_boundaries():
    config = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}}
    unknown = Capture(
        module="target", requested_ids=[-1, 1, 3], boundaries=[1, 2, 4], num_layers=6, hidden_size=64,
        rule="sglang_llama", enabled=True, target_class="MysteryForCausalLM", rule_known=False,
    )  # fmt: skip
    (found,) = [f for f in check_capture(unknown, config) if f.code == "aux_layers_mismatch"]
    assert "rule unknown for MysteryForCausalLM; observed boundaries [1, 2, 4]" in found.message
    assert found.evidence["engine_rule"] == "unknown" and "confirm the observed boundaries" in (found.fix or "")
    clean = unknown.model_copy(update={"boundaries": [0, 2, 4]})
    assert [f for f in check_capture(clean, config) if f.severity == "error"] == []


@pytest.mark.sglang
def test_qwen3_target_through_the_seam():
    """SGLang's own Qwen3ForCausalLM, built on CPU: the seam records its family and rule."""
    pytest.importorskip("sglang")
    sh = pytest.importorskip("tests.helpers.sglang_harness")
    try:
        from tests.integrations.sglang.test_sglang_integration import _of  # noqa: F401
    except ImportError:  # pragma: no cover
        pytest.skip("needs tests/ on the path")
    sh.setup()
    import transformers
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    from spectrace.integrations.sglang.capture import capture_of

    cfg = transformers.Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    )  # fmt: skip
    model = Qwen3ForCausalLM(cfg)
    model.set_eagle3_layers_to_capture([-1, 1, 3])
    record = capture_of(model, [-1, 1, 3])
    assert record is not None and record.boundaries == [0, 2, 4]
    extra = record.model_extra or {}
    assert extra["target_family"] == "plus_one" and record.rule == "sglang_llama" and extra["rule_known"] is True
    config = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}}
    assert [f for f in check_capture(record, config) if f.severity == "error"] == []
    model.set_eagle3_layers_to_capture([0, 2, 4])  # speculators ids written into eagle_config
    wrong = capture_of(model, [0, 2, 4])
    assert wrong is not None and wrong.boundaries == [1, 3, 5]
    assert [f.code for f in check_capture(wrong, config) if f.severity == "error"] == ["aux_layers_mismatch"]


# ------------------------------------------------------------------ the trainer's record
def test_trained_with_settles_the_ambiguity(tmp_path):
    # SpecForge's layout already settles it (no "SpecForge or speculators?" warning); the user's word still rules.
    rc, report = _audit(FIXTURES / "specforge_tiny")
    assert _aux(report) == [] and rc == 0
    rc, report = _audit(FIXTURES / "specforge_tiny", "--trained-with", "specforge")
    assert _aux(report) == [] and rc == 0
    rc, report = _audit(FIXTURES / "specforge_tiny", "--trained-with", "speculators")
    assert _aux(report) == [("aux_layers_mismatch", "error")] and rc == 1


def test_train_command_names_the_trainer_and_sha256_is_checked(tmp_path):
    folder = tmp_path / "draft"
    shutil.copytree(FIXTURES / "specforge_tiny", folder)
    (folder / "train_command.txt").write_text("torchrun --nproc_per_node 8 -m speculators.train --config eagle3.yaml\n")
    import hashlib

    good = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    (folder / "checkpoint_sha256.txt").write_text(f"{good}  model.safetensors\n{'0' * 64}  config.json\n{'1' * 64}  ../escape\n")
    raw = json.loads((folder / "config.json").read_text())
    record = read_trainer_record(folder, raw)
    assert record.trainer == "speculators" and record.source == "train_command.txt"
    assert [(c.file, c.ok) for c in record.sha256] == [("model.safetensors", True), ("config.json", False), ("../escape", False)]
    assert record.sha256[2].actual is None  # a name outside the folder is never read
    config = read_checkpoint(folder).config
    assert config.trained_with == "speculators" and config.checksum_mismatches == ["config.json", "../escape"]
    rc, report = _audit(folder)
    assert _aux(report) == [("aux_layers_mismatch", "error")]


# ------------------------------------------------------------------ safetensors offsets
def _rewrite_offsets(src: Path, dst: Path, overlap: bool) -> None:
    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    if overlap:
        size = header["fc.weight"]["data_offsets"][1] - header["fc.weight"]["data_offsets"][0]
        start = header["d2t"]["data_offsets"][0]
        header["fc.weight"]["data_offsets"] = [start, start + size]  # fc.weight now lies over d2t's bytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(struct.pack("<Q", len(text)) + text + body)


@pytest.mark.parametrize("overlap", [False, True])
def test_overlapping_offsets_fail_like_the_loader(tmp_path, overlap):
    safetensors = pytest.importorskip("safetensors")
    folder = tmp_path / "draft"
    shutil.copytree(FIXTURES / "specforge_tiny", folder)
    header = json.loads(
        (folder / "model.safetensors").read_bytes()[8 : 8 + struct.unpack("<Q", (folder / "model.safetensors").read_bytes()[:8])[0]]
    )
    if "d2t" not in header or "fc.weight" not in header:
        pytest.skip("fixture lacks fc.weight or d2t")
    _rewrite_offsets(FIXTURES / "specforge_tiny" / "model.safetensors", folder / "model.safetensors", overlap)
    refused = False
    try:
        with safetensors.safe_open(str(folder / "model.safetensors"), "np"):
            pass
    except Exception:
        refused = True
    assert refused == overlap
    rc, report = _audit(folder, "--trained-with", "specforge")
    if overlap:
        assert rc == 2 and "fc.weight" in report["stderr"] and "InvalidOffset" in report["stderr"]
    else:
        assert rc == 0

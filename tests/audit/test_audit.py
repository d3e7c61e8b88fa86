"""``spectrace audit``: real trainer checkpoints, broken variants, hostile inputs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectrace.audit.checkpoint import AuditInputError, read_checkpoint, read_safetensors_header, read_target_config
from spectrace.checks.checkpoint import audit
from spectrace.rules.engines import get_engine
from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES
SPECULATORS = FIX / "speculators_tiny"
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def run_audit(path: Path, engine: str = "sglang", version: str | None = None, target: Path | None = TARGET):
    ckpt = read_checkpoint(path)
    tgt = read_target_config(target) if target else None
    return audit(ckpt.config, ckpt.tensors, get_engine(engine, version), tgt).findings


def by_code(findings, code: str):
    return [f for f in findings if f.code == code]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("spectrace audit: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def variant(tmp_path: Path, src: Path = SPECFORGE, *, tensors=None, config=None) -> Path:
    """A copy of a fixture with its tensors and/or config rewritten."""
    dst = tmp_path / "draft"
    shutil.copytree(src, dst)
    if tensors is not None:
        state = tensors(load_file(str(dst / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# ------------------------------------------------------------ the real speculators checkpoint


def test_speculators_fixture_really_comes_from_speculators() -> None:
    cfg = json.loads((SPECULATORS / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["speculators_version"]
    names = read_checkpoint(SPECULATORS).tensors
    assert "layers.0.self_attn.q_proj.weight" in names and "midlayer.self_attn.q_proj.weight" not in names


def test_speculators_on_sglang_0523_with_target() -> None:
    findings = run_audit(SPECULATORS)
    [mismatch] = by_code(findings, "aux_layers_mismatch")
    assert mismatch.severity == "error"
    assert mismatch.evidence["engine_boundaries"] == [2, 4, 5]  # SGLang's defaults, top-level ids ignored
    assert mismatch.evidence["readings"]["speculators"]["boundaries"] == [1, 3, 6]
    assert "[0, 2, 5]" in mismatch.fix  # ids that make SGLang's +1 rule capture [1, 3, 6]
    flags = {next(iter(f.evidence)): f for f in by_code(findings, "unsupported_config_flag")}
    # 0.5.23 implements norm_before_fc (model.input_norm) and norm_output; norm_before_residual is never read.
    assert set(flags) == {"norm_before_residual", "top_level_ids"}
    assert flags["norm_before_residual"].severity == "error"
    assert "ignored" in flags["top_level_ids"].message
    # 0.5.23 maps layers.0.*, fuses q/k/v and gate/up, loads input_norm.weight into model.input_norm,
    # takes d2t and lm_head: nothing is dropped, nothing is missing.
    assert not by_code(findings, "weights_dropped")
    assert not by_code(findings, "weights_missing")
    # Its config keeps speculators' "target_hidden_size": null, which SGLang's draft class
    # takes as fc's input size (tests/audit/test_audit_vs_sglang.py builds it and sees it fail).
    [null_size] = by_code(findings, "shape_mismatch")
    assert null_size.evidence["target_hidden_size"] is None
    assert not by_code(findings, "short_capture")


def test_speculators_without_target_cannot_see_the_defaults_but_says_so() -> None:
    findings = run_audit(SPECULATORS, target=None)
    assert not by_code(findings, "aux_layers_mismatch")
    ignored = [f for f in by_code(findings, "unsupported_config_flag") if "top_level_ids" in f.evidence]
    assert ignored and "--target-config" in ignored[0].message


def test_speculators_on_older_sglang_drops_the_decoder_layer() -> None:
    findings = run_audit(SPECULATORS, version="older")
    dropped = [f for f in by_code(findings, "weights_dropped") if f.evidence.get("rename")]
    assert len(dropped) == 1
    assert dropped[0].evidence["rename"] == {"from": "layers.0.", "to": "midlayer."}
    assert len(dropped[0].evidence["tensors"]) == 10
    missing = [p for f in by_code(findings, "weights_missing") for p in f.evidence["parameters"]]
    assert "model.midlayer.self_attn.qkv_proj.weight" in missing


def test_speculators_on_vllm_reads_its_own_format() -> None:
    findings = run_audit(SPECULATORS, engine="vllm")
    assert not by_code(findings, "aux_layers_mismatch")
    assert not by_code(findings, "weights_dropped")
    assert all(f.severity == "info" for f in findings), findings


# ------------------------------------------------------------ SpecForge


@pytest.mark.parametrize("version", ["0.5.23", "older"])
def test_specforge_fixture_is_clean(version: str) -> None:
    findings = run_audit(SPECFORGE, version=version)
    assert not [f for f in findings if f.severity == "error"], findings
    # SpecForge's layout (midlayer.* tensors, eagle_config) signs its trainer, so its ids have one
    # reading, SpecForge's: no "SpecForge or speculators?" warning on a clean SpecForge draft.
    assert findings == [], findings
    ckpt = read_checkpoint(SPECFORGE)
    summary = audit(ckpt.config, ckpt.tensors, get_engine("sglang", None if version == "0.5.23" else version), None).summary
    assert [r["trainer"] for r in summary["trained_readings"]] == ["specforge"]
    assert run_cli(SPECFORGE, "--target-config", TARGET, "--engine-version", version).returncode == 0


def test_stated_training_settles_the_ambiguity_as_at_runtime(tmp_path: Path) -> None:
    """A config that states its training (the provenance keys the runtime check reads too)
    has one reading: no ambiguity warning when it matches what SGLang captures, and an
    error naming the stated boundaries when it does not."""

    def stamp_specforge(cfg: dict) -> None:
        cfg["trainer_convention"] = "specforge"
        cfg["trained_aux_layer_ids"] = [0, 2, 5]

    assert run_audit(variant(tmp_path, config=stamp_specforge)) == []

    def stamp_boundaries(cfg: dict) -> None:
        cfg["trained_aux_boundaries"] = [0, 2, 5]  # embeddings, 2, 5: not what SGLang's +1 captures

    shutil.rmtree(tmp_path / "draft")
    [mismatch] = by_code(run_audit(variant(tmp_path, config=stamp_boundaries)), "aux_layers_mismatch")
    assert mismatch.severity == "error" and list(mismatch.evidence["readings"]) == ["stated"]
    assert "trained on boundaries [0, 2, 5], as config.json states (trained_aux_boundaries)" in mismatch.message
    assert mismatch.evidence["engine_boundaries"] == [1, 3, 6]


def test_malformed_stated_training_is_a_one_line_error(tmp_path: Path) -> None:
    def bad(cfg: dict) -> None:
        cfg["trained_aux_boundaries"] = "3,31"

    assert_one_line_error(run_cli(variant(tmp_path, config=bad)), "trained_aux_boundaries must be a list of integers")


def test_hand_converted_speculators_config_is_off_by_one(tmp_path: Path) -> None:
    """Bug 3: speculators ids moved into eagle_config as they were; SGLang adds 1."""

    def convert(cfg: dict) -> None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
        cfg["norm_before_residual"] = False  # a speculators trace left behind by the conversion

    findings = run_audit(variant(tmp_path, config=convert))
    [mismatch] = by_code(findings, "aux_layers_mismatch")
    assert mismatch.severity == "error"
    assert mismatch.evidence["engine_boundaries"] == [2, 4, 7]
    assert "[1, 3, 6]" in mismatch.message and "[2, 4, 7]" in mismatch.message
    assert "SpecForge" in mismatch.message  # names the other reading too
    assert "[0, 2, 5]" in mismatch.fix


# ------------------------------------------------------------ broken variants


def test_missing_lm_head(tmp_path: Path) -> None:
    draft = variant(tmp_path, tensors=lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"})
    findings = run_audit(draft)
    [missing] = by_code(findings, "weights_missing")
    assert "lm_head.weight" in missing.message and missing.evidence["parameters"] == ["lm_head.weight"]
    proc = run_cli(draft, "--target-config", TARGET)
    assert proc.returncode == 1 and "lm_head.weight" in proc.stdout


def test_missing_embed_tokens_is_normal(tmp_path: Path) -> None:
    # SpecForge ships no embed_tokens: SGLang's set_embed gives the target's.
    assert "embed_tokens.weight" not in read_checkpoint(SPECFORGE).tensors
    assert not by_code(run_audit(SPECFORGE), "weights_missing")


def test_missing_d2t_with_reduced_vocab(tmp_path: Path) -> None:
    draft = variant(tmp_path, tensors=lambda s: {k: v for k, v in s.items() if k != "d2t"})
    [missing] = by_code(run_audit(draft), "weights_missing")
    assert missing.module == "d2t" and "hot_token_id" in missing.message


def test_renamed_prefix_is_dropped_and_missing(tmp_path: Path) -> None:
    draft = variant(tmp_path, tensors=lambda s: {k.replace("midlayer.", "decoder.", 1): v for k, v in s.items()})
    findings = run_audit(draft)
    [dropped] = by_code(findings, "weights_dropped")
    assert dropped.evidence["rename"] == {"from": "decoder.", "to": "layers.0."}
    assert "decoder.self_attn.q_proj.weight" in dropped.evidence["tensors"]
    assert "decoder." in dropped.fix and "layers.0." in dropped.fix
    missing = [p for f in by_code(findings, "weights_missing") for p in f.evidence["parameters"]]
    assert "model.layers.0.self_attn.qkv_proj.weight" in missing
    assert "model.layers.0.mlp.gate_up_proj.weight" in missing


def test_layers0_under_older_engine_version_cli(tmp_path: Path) -> None:
    draft = variant(tmp_path, tensors=lambda s: {k.replace("midlayer.", "layers.0.", 1): v for k, v in s.items()})
    assert not by_code(run_audit(draft, version="0.5.23"), "weights_dropped")
    proc = run_cli(draft, "--engine-version", "older", "--json")
    assert proc.returncode == 1
    codes = {f["code"] for f in json.loads(proc.stdout)["findings"]}
    assert {"weights_dropped", "weights_missing"} <= codes


def test_aux_capture_disabled(tmp_path: Path) -> None:
    draft = variant(tmp_path, config=lambda c: c["eagle_config"].update(use_aux_hidden_state=False))
    [off] = by_code(run_audit(draft), "aux_capture_disabled")
    assert off.severity == "error"


def test_ids_past_the_target_are_a_short_capture(tmp_path: Path) -> None:
    draft = variant(tmp_path, config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 2, 8]))
    shorts = by_code(run_audit(draft), "short_capture")
    [short] = [f for f in shorts if "engine_boundaries" in f.evidence]
    assert short.evidence["engine_boundaries"] == [1, 3] and short.evidence["wanted"] == 3
    # Read as SpecForge ids, 8 means boundary 9: a layer this 8-layer target does not have.
    assert any(f.evidence.get("trained_boundaries") == [1, 3, 9] for f in shorts)


def test_target_hidden_size_mismatch(tmp_path: Path) -> None:
    target = json.loads(TARGET.read_text())
    target["hidden_size"] = 128
    (tmp_path / "target.json").write_text(json.dumps(target))
    findings = run_audit(SPECFORGE, target=tmp_path / "target.json")
    shapes = by_code(findings, "shape_mismatch")
    assert any("128" in f.message and "hidden_size" in f.message for f in shapes)
    assert any(f.module == "model.fc" and f.evidence["delivered"] == 3 * 128 for f in shapes)


def test_fc_width_against_four_aux_layers(tmp_path: Path) -> None:
    draft = variant(tmp_path, config=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 2, 4, 5]))
    [fc] = [f for f in by_code(run_audit(draft), "shape_mismatch") if f.module == "model.fc"]
    assert fc.evidence == {**fc.evidence, "fc_in_features": 192, "delivered": 256}


def test_norm_before_residual_on_a_sglang_config(tmp_path: Path) -> None:
    draft = variant(tmp_path, config=lambda c: c.update(norm_before_residual=True))
    flags = by_code(run_audit(draft), "unsupported_config_flag")
    assert any("norm_before_residual" in f.message and f.severity == "error" for f in flags)


# ------------------------------------------------------------ training flags, per SGLang release
# rules.conventions.SGLANG_DRAFT_FLAGS, read from the wheels: norm_before_fc from 0.5.17
# (model.input_norm), fc_norm (model.fc_norm.i, also use_aux_norm) and norm_output from
# 0.5.14; norm_before_residual and embed_requires_grad in no release.


def _flag_findings(findings) -> dict[str, object]:
    return {next(iter(f.evidence)): f for f in by_code(findings, "unsupported_config_flag") if "top_level_ids" not in f.evidence}


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_speculators_norm_before_fc_is_implemented(version: str) -> None:
    findings = run_audit(SPECULATORS, version=version)
    flags = _flag_findings(findings)
    assert "norm_before_fc" not in flags and "norm_output" not in flags
    assert not [f for f in findings if "input_norm.weight" in f.evidence.get("tensors", [])]
    assert not by_code(findings, "weights_dropped") and not by_code(findings, "weights_missing")
    ckpt = read_checkpoint(SPECULATORS)
    assert audit(ckpt.config, ckpt.tensors, get_engine("sglang", version), None).summary["weights"]["dropped"] == []


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_speculators_without_its_input_norm_weight_is_missing(tmp_path: Path, version: str) -> None:
    draft = variant(tmp_path, SPECULATORS, tensors=lambda s: {k: v for k, v in s.items() if k != "input_norm.weight"})
    findings = run_audit(draft, version=version)
    [missing] = by_code(findings, "weights_missing")
    assert missing.severity == "error" and missing.module == "model.input_norm"
    assert missing.evidence["parameters"] == ["model.input_norm.weight"]
    assert "norm_before_fc=true" in missing.message and "input_norm.weight" in missing.fix
    assert "norm_before_fc" not in _flag_findings(findings)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16"])
def test_speculators_norm_before_fc_before_0517_is_ignored_and_its_tensor_dropped(version: str) -> None:
    findings = run_audit(SPECULATORS, version=version)
    flag = _flag_findings(findings)["norm_before_fc"]
    assert flag.severity == "error" and flag.evidence["read_in"] == ["0.5.14", "0.5.15", "0.5.16"]
    assert "0.5.17 or newer" in flag.fix
    [dropped] = by_code(findings, "weights_dropped")
    assert dropped.evidence["tensors"] == ["input_norm.weight"] and "0.5.17 or newer" in dropped.fix
    assert not by_code(findings, "weights_missing")


@pytest.mark.parametrize("version", ["0.5.14", "0.5.17", "0.5.23", "0.5.24"])
def test_really_ignored_flag_is_still_an_error(tmp_path: Path, version: str) -> None:
    draft = variant(tmp_path, config=lambda c: c.update(norm_before_residual=True))
    flag = _flag_findings(run_audit(draft, version=version))["norm_before_residual"]
    assert flag.severity == "error" and "ignored" in flag.message and "l.99-100" in flag.message
    assert flag.evidence["engine_version"] == version
    assert ("0.5.24 itself was not read" in flag.message) == (version == "0.5.24")


def test_embed_requires_grad_warns_unless_the_draft_keeps_its_embedding(tmp_path: Path) -> None:
    # set_embed replaces the draft's embedding with the target's, unless target_hidden_size differs.
    same = variant(tmp_path / "a", config=lambda c: c.update(embed_requires_grad=True))
    assert _flag_findings(run_audit(same))["embed_requires_grad"].severity == "warning"
    other = variant(tmp_path / "b", config=lambda c: c.update(embed_requires_grad=True, target_hidden_size=128))
    assert "embed_requires_grad" not in _flag_findings(run_audit(other, target=None))

    # No draft_vocab_size: the head comes from the target and set_embed_and_head replaces both.
    def head_from_target(c: dict) -> None:
        c.update(embed_requires_grad=True, target_hidden_size=128)
        c.pop("draft_vocab_size")

    shared = variant(tmp_path / "c", config=head_from_target)
    assert _flag_findings(run_audit(shared, target=None))["embed_requires_grad"].severity == "warning"


def test_fc_norm_is_implemented_with_its_legacy_names(tmp_path: Path) -> None:
    """fc_norm=true: SGLang creates model.fc_norm.{0,1,2} and maps aux_norm_low/mid/high onto them."""
    names = ("aux_norm_low.weight", "aux_norm_mid.weight", "aux_norm_high.weight")
    draft = variant(tmp_path / "a", config=lambda c: c.update(fc_norm=True),
                    tensors=lambda s: {**s, **{n: torch.ones(64) for n in names}})  # fmt: skip
    findings = run_audit(draft)
    assert "fc_norm" not in _flag_findings(findings)
    assert not by_code(findings, "weights_dropped") and not by_code(findings, "weights_missing")
    bare = run_audit(variant(tmp_path / "b", config=lambda c: c.update(fc_norm=True)))
    [missing] = by_code(bare, "weights_missing")
    assert missing.evidence["parameters"] == [f"model.fc_norm.{i}.weight" for i in range(3)]
    unflagged = run_audit(variant(tmp_path / "c", tensors=lambda s: {**s, **{n: torch.ones(64) for n in names}}))
    [dropped] = by_code(unflagged, "weights_dropped")
    assert dropped.evidence["tensors"] == sorted(names) and "fc_norm=true" in dropped.fix


def test_older_sglang_flags_are_not_known_not_guessed() -> None:
    flags = _flag_findings(run_audit(SPECULATORS, version="older"))
    assert set(flags) == {"norm_before_residual", "norm_before_fc", "norm_output"}
    assert all(f.severity == "warning" and "was not read" in f.message for f in flags.values())


@pytest.mark.parametrize("version", ["0.5.14", "0.5.17", "0.5.23", "0.5.24", "older"])
def test_audit_and_runtime_read_one_flag_table(tmp_path: Path, version: str) -> None:
    """The audit and the runtime check (checks.capture.check_config_flags) flag the same flags, alike."""
    from spectrace.checks.capture import check_config_flags

    draft = variant(tmp_path, SPECULATORS, config=lambda c: c.update(embed_requires_grad=True, fc_norm=True))
    audited = {k: f.severity for k, f in _flag_findings(run_audit(draft, version=version)).items()}
    raw = json.loads((draft / "config.json").read_text())
    runtime = {f.evidence["flag"]: f.severity for f in check_config_flags(raw, "sglang", version)}
    assert audited == runtime and "norm_before_residual" in audited


# ------------------------------------------------------------ unusable input: exit 2, one line


def test_corrupt_safetensors(tmp_path: Path) -> None:
    draft = variant(tmp_path)
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", 40) + b"{not json at all" + b" " * 60)
    assert_one_line_error(run_cli(draft), "model.safetensors", "not valid JSON")


def test_truncated_safetensors(tmp_path: Path) -> None:
    draft = variant(tmp_path)
    data = (draft / "model.safetensors").read_bytes()
    (draft / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli(draft), "truncated")


def test_header_claiming_ten_gigabytes_is_refused_unread(tmp_path: Path) -> None:
    draft = variant(tmp_path)
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", 10 * 1024**3) + b"{}")
    with pytest.raises(AuditInputError, match="header length exceeds the 100000000-byte limit"):
        read_safetensors_header(draft / "model.safetensors")
    proc = run_cli(draft)
    assert_one_line_error(proc, "header length exceeds the 100000000-byte limit")
    assert "10737418240" not in proc.stderr  # the file's first bytes are not quoted


def test_config_not_json(tmp_path: Path) -> None:
    draft = variant(tmp_path)
    (draft / "config.json").write_text("{'hidden_size': 64,")
    assert_one_line_error(run_cli(draft), "not JSON")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda c: c.update(hidden_size="64"), "hidden_size must be a int"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids="1,3,6"), "list of integers"),
        (lambda c: c.update(eagle_config=[1, 2]), "eagle_config must be an object"),
        (lambda c: c.pop("hidden_size"), "hidden_size is missing"),
    ],
)
def test_config_wrong_types(tmp_path: Path, mutate, needle: str) -> None:
    assert_one_line_error(run_cli(variant(tmp_path, config=mutate)), needle)


def test_missing_dir_and_missing_config(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(tmp_path / "nope"), "no such directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli(tmp_path / "empty"), "config.json", "not found")


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(SPECFORGE, "--engine", "trt"), "invalid choice")
    assert_one_line_error(run_cli(SPECFORGE, "--target-config", tmp_path / "none.json"), "target config")


# ------------------------------------------------------------ one SGLang release (--engine sglang==V)

SHIPPED = ROOT / "spectrace" / "eagle3" / "data"  # the shipped draft: eagle_config ids [-1, 1, 3]


def shipped_draft(tmp_path: Path) -> Path:
    """The shipped SpecForge-format draft as a checkpoint directory (config.json + weights)."""
    dst = tmp_path / "shipped"
    dst.mkdir()
    shutil.copy(SHIPPED / "draft_config.json", dst / "config.json")
    shutil.copy(SHIPPED / "draft.safetensors", dst / "model.safetensors")
    return dst


def test_embedding_first_draft_on_sglang_0517_is_capture_unsupported(tmp_path: Path) -> None:
    """SGLang 0.5.17's Llama target crashes on id -1 (None residual at layer 0): said offline."""
    draft, target = shipped_draft(tmp_path), SHIPPED / "target_config.json"
    proc = run_cli(draft, "--target-config", target, "--engine", "sglang==0.5.17", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    [found] = report["findings"]
    assert found["code"] == "capture_unsupported" and found["severity"] == "error"
    assert "SGLang 0.5.17's LlamaForCausalLM" in found["message"] and "residual is still None" in found["message"]
    assert "SGLang 0.5.22 or newer" in found["fix"] and "retrain" in found["fix"]
    assert report["checkpoint"]["engine"]["version"] == "0.5.17"
    assert json.loads(run_cli(draft, "--target-config", target, "--engine-version", "0.5.17", "--json").stdout) == report
    table = run_cli(draft, "--target-config", target, "--engine", "sglang==0.5.17")
    assert table.returncode == 1 and "capture_unsupported" in table.stdout and "0.5.17" in table.stdout
    # 0.5.22 and later capture the embedding: nothing to say.
    for clean in ("sglang==0.5.22", "sglang==0.5.23", "sglang"):
        ok = run_cli(draft, "--target-config", target, "--engine", clean, "--json")
        assert ok.returncode == 0 and json.loads(ok.stdout)["findings"] == [], (clean, ok.stdout)


def test_engine_release_arguments_are_one_line(tmp_path: Path) -> None:
    draft = shipped_draft(tmp_path)
    assert_one_line_error(run_cli(draft, "--engine", "sglang==0.5.17", "--engine-version", "0.5.23"), "disagree")
    assert_one_line_error(run_cli(draft, "--engine", "vllm", "--engine-version", "0.32.0"), "applies to --engine sglang only")
    assert_one_line_error(run_cli(draft, "--engine", "sglang==five"), "unknown SGLang version")


class _WritesAFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_malicious_bin_never_runs(tmp_path: Path, writer: str) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(SPECFORGE / "config.json", draft / "config.json")
    marker = tmp_path / "pwned"
    payload = {"fc.weight": torch.zeros(2, 2), "evil": _WritesAFile(str(marker))}
    if writer == "pickle":
        (draft / "pytorch_model.bin").write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, draft / "pytorch_model.bin")
    assert not marker.exists()
    assert_one_line_error(run_cli(draft), "pytorch_model.bin")
    assert not marker.exists()


def test_honest_bin_is_read(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(SPECFORGE / "config.json", draft / "config.json")
    torch.save(load_file(str(SPECFORGE / "model.safetensors")), draft / "pytorch_model.bin")
    ckpt = read_checkpoint(draft)
    assert ckpt.tensors["fc.weight"].shape == [64, 192]
    assert run_cli(draft, "--target-config", TARGET).returncode == 0


# ------------------------------------------------------------ output


def test_json_output_parses() -> None:
    proc = run_cli(SPECULATORS, "--target-config", TARGET, "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    # The fields of old, and the two added beside them (fields are only ever added).
    fields = {"code", "severity", "message", "evidence", "fix", "module", "cause", "applies_to"}
    assert out["findings"] and set(out["findings"][0]) == fields
    ck = out["checkpoint"]
    assert ck["format"] == "speculators" and ck["num_tensors"] == 17
    assert ck["engine_capture"]["boundaries"] == [2, 4, 5]
    assert ck["weights"]["dropped"] == []  # input_norm.weight goes into 0.5.23's model.input_norm


def test_table_output_names_codes_and_fixes() -> None:
    proc = run_cli(SPECULATORS, "--target-config", TARGET)
    assert proc.returncode == 1 and proc.stderr == ""
    for text in ("aux_layers_mismatch", "norm_before_residual", "fix"):
        assert text in proc.stdout


# ------------------------------------------------------------ the header parser never trusts its input

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(claimed=st.integers(0, 2**64 - 1), body=st.binary(max_size=256))
def test_any_header_bytes_give_tensors_or_an_input_error(tmp_path_factory, claimed: int, body: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", claimed) + body)
    try:
        read_safetensors_header(path)
    except AuditInputError as err:
        assert "\n" not in str(err)


def test_every_fixture_tensor_survives_the_hand_parser() -> None:
    from safetensors import safe_open

    ours = read_safetensors_header(SPECULATORS / "model.safetensors")
    with safe_open(str(SPECULATORS / "model.safetensors"), "pt") as f:
        theirs = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: v.shape for k, v in ours.items()} == theirs


def test_unexpected_exception_is_one_line_exit_2(monkeypatch, capsys) -> None:
    import spectrace.cli.audit as command

    def boom(*_a, **_k):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(command, "read_checkpoint", boom)
    assert command.main([str(SPECFORGE)]) == 2
    err = capsys.readouterr().err
    assert err == "spectrace audit: error: internal error: RuntimeError: kaboom\n"

"""RoPE truths and vocabulary maps: offline in ``spectrace audit``, and the map SGLang builds.

Checkpoints are the trainer-written fixtures (``tests/fixtures``: the real speculators
0.9 output and its SpecForge layout) with config.json and the d2t/t2d tensors rewritten as
the trainers write them (safetensors, int64 d2t, bool t2d). Every bug is first shown in
SGLang 0.5.23's own objects (the rotary embedding its decoder layer builds, the
``hot_token_id`` its ``load_weights`` builds), then detected; each has a clean twin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectrace.audit.checkpoint import read_checkpoint, read_target_config, read_vocab_maps
from spectrace.checks.checkpoint import audit
from spectrace.checks.rope import effective_rotary
from spectrace.checks.vocab_map import check_engine_hot_map, check_vocab_map, target_ids
from spectrace.rules.engines import get_engine
from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES
SPECFORGE = FIX / "specforge_tiny"
SPECULATORS = FIX / "speculators_tiny"
TARGET = FIX / "target_llama_config.json"
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"
DRAFT_VOCAB, VOCAB = 128, 256
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


# ------------------------------------------------------------------ checkpoints as trainers write them


def target_config(tmp_path: Path, **rope: Any) -> Path:
    """The fixture's 8-layer Llama target with its rotary keys replaced (a Llama-3-like 500000 base)."""
    cfg = json.loads(TARGET.read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(rope or {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    path = tmp_path / "target" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


def specforge_draft(
    tmp_path: Path, name: str = "draft", *, rope: dict[str, Any] | None = None, maps: dict[str, torch.Tensor] | None = None
) -> Path:
    """A SpecForge checkpoint (midlayer.*, flat config) with its rotary keys and maps replaced."""
    dst = tmp_path / name
    shutil.copytree(SPECFORGE, dst)
    if rope is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.pop("rope_parameters", None)
        cfg.update(rope)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if maps is not None:
        state = load_file(str(dst / "model.safetensors"))
        state.update(maps)
        save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def speculators_draft(tmp_path: Path, edit) -> Path:
    dst = tmp_path / "spec_draft"
    shutil.copytree(SPECULATORS, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def run_audit(draft: Path, target: Path | None, engine: str = "sglang", version: str | None = None):
    ckpt = read_checkpoint(draft)
    tgt = read_target_config(target) if target else None
    return audit(ckpt.config, ckpt.tensors, get_engine(engine, version), tgt, ckpt.maps)


def codes(result) -> list[str]:
    return [f.code for f in result.findings]


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def trained_vocab() -> torch.Tensor:
    """The draft vocabulary a trainer picks: the most frequent target ids, listed in rising order."""
    g = torch.Generator().manual_seed(0)
    return torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values


def trained_maps(d2t: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """d2t (offsets, int64) and t2d (bool mask) of the trained vocabulary; ``d2t`` replaces the offsets."""
    ids = trained_vocab()
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": (ids - torch.arange(DRAFT_VOCAB)) if d2t is None else d2t, "t2d": t2d}


# ------------------------------------------------------------------ the engine's own objects (SGLang 0.5.23)


@pytest.fixture(scope="module")
def sglang_ready():
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    from tests.helpers import sglang_harness as sh

    sh.setup()
    return sh


def engine_rotary(config_dir: Path, *, draft: bool):
    """The rotary embedding SGLang 0.5.23 builds from a config.json, read as SGLang reads it
    (transformers' AutoConfig): the EAGLE-3 draft's decoder layer, or a target decoder layer."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(config_dir))
    if draft:
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

        return LlamaForCausalLMEagle3(config).model.layers[0].self_attn.rotary_emb
    from sglang.srt.models.llama import LlamaForCausalLM

    return LlamaForCausalLM(config).model.layers[0].self_attn.rotary_emb


ROPE_BUGS: dict[str, dict[str, Any]] = {
    # transformers 5 dropped the top-level key and nobody wrote the base into the dict.
    "base lost (rope_parameters without rope_theta)": {"rope_parameters": {"rope_type": "default"}},
    # copied from a target with one rotary per attention type: a Llama layer reads the outer base.
    "base nested per attention type": {"rope_parameters": {"full_attention": {"rope_theta": 500000.0, "rope_type": "default"}}},
    # a stale legacy rope_scaling left beside the new dict: transformers 5 takes rope_scaling.
    "stale rope_scaling shadows rope_parameters": {
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "rope_scaling": {"rope_type": "default", "rope_theta": 10000.0},
    },
}
ROPE_CLEAN: dict[str, dict[str, Any]] = {
    "rope_parameters.rope_theta": {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}},
    "legacy top-level rope_theta": {"rope_theta": 500000.0},
}


def trained_at(draft: Path, base: float) -> Path:
    """The folder's own record: SpecForge's command line and a run file stating the trained base."""
    (draft / "train_command.txt").write_text("torchrun scripts/train_eagle3.py --draft-model-config config.json  # specforge\n")
    (draft / "run.yaml").write_text(f"trainer: specforge\nrope_theta: {base}\n")
    return draft


@pytest.mark.sglang
@pytest.mark.parametrize("case", list(ROPE_BUGS) + list(ROPE_CLEAN))
def test_rope_base_as_sglang_builds_it(sglang_ready, tmp_path: Path, case: str) -> None:
    """The base SGLang builds, against the one the draft was trained with.

    The checkpoints have SpecForge's layout (midlayer.*, eagle_config), and SpecForge trains with
    the base its config gives: a config without the target's base is what a healthy SpecForge draft
    looks like, and also what a draft trained at the target's base looks like once its config lost
    the key. The config alone cannot tell, so that is a warning naming the probe; with the folder's
    record saying it was trained at 500000 it is an error, and the fix clears it."""
    buggy = case in ROPE_BUGS
    draft = specforge_draft(tmp_path, rope=(ROPE_BUGS if buggy else ROPE_CLEAN)[case])
    target = target_config(tmp_path)
    # Reproduction: the rotary SGLang's own classes build for the draft and the target.
    target_rope = engine_rotary(target.parent, draft=False)
    assert target_rope.base == 500000.0
    if "nested" in case:
        # Not silent on SGLang 0.5.23: get_rope hashes the dict's items, and a dict is unhashable.
        with pytest.raises(TypeError, match="unhashable type: 'dict'"):
            engine_rotary(draft, draft=True)
        print(f"{case}: SGLang fails to build the draft; target base {target_rope.base}")
    else:
        draft_rope = engine_rotary(draft, draft=True)
        print(f"{case}: SGLang draft rotary base {draft_rope.base}, target base {target_rope.base}")
        assert (draft_rope.base != target_rope.base) is buggy
        # spectrace reads the same base from the files, without building anything.
        assert effective_rotary(read_checkpoint(draft).config.rope).base == draft_rope.base
    result = run_audit(draft, target)
    rope = [f for f in result.findings if f.code == "rope_mismatch"]
    if not buggy:
        assert result.summary["rotary"]["draft"]["rope_theta"] == 500000.0
        if "legacy" in case:
            # SpecForge 0.1.0 rotated with 10000 whatever rope_theta said; later releases read it.
            (found,) = rope
            assert found.severity == "warning" and "SpecForge 0.1.0" in found.message and "spectrace probe" in found.message
        else:
            assert rope == []
        return
    (found,) = rope
    assert ("does not build" in found.message) is ("nested" in case)
    assert found.evidence["draft_rope"]["rope_theta"] == 10000.0 and found.evidence["target_rope"]["rope_theta"] == 500000.0
    if "nested" in case:
        assert found.severity == "error"  # the engine fails whoever trained it
    else:
        # SpecForge recognised from its layout, no record of the trained base: what is unknown, and the probe.
        assert found.severity == "warning" and "SpecForge" in found.message, found.message
        assert "spectrace probe TRACE_DIR --draft DRAFT_DIR" in found.message and "spectrace probe" in found.fix
        assert "500000" in found.message and "rope_theta" not in found.fix.split("probe", 1)[0]
        # The record says 500000: now the engine provably rotates other than in training.
        (found,) = [f for f in run_audit(trained_at(draft, 500000.0), target).findings if f.code == "rope_mismatch"]
        assert found.severity == "error" and "run.yaml" in found.message and "10000" in found.message
    # The fix names the exact key and value; applied, the engine builds the trained base and the audit is clean.
    key = "rope_scaling" if "rope_scaling" in ROPE_BUGS[case] else "rope_parameters"
    assert f'"{key}" to {{"rope_theta": 500000.0, "rope_type": "default"}}' in found.fix, found.fix
    cfg = json.loads((draft / "config.json").read_text())
    cfg[key] = {"rope_theta": 500000.0, "rope_type": "default"}
    (draft / "config.json").write_text(json.dumps(cfg))
    assert engine_rotary(draft, draft=True).base == 500000.0
    assert "rope_mismatch" not in codes(run_audit(draft, target))


def eagle_draft(tmp_path: Path, name: str, rope: dict[str, Any]) -> Path:
    """The same weights in the EAGLE reference trainer's layout: midlayer.*, its plain
    LlamaForCausalLM config (eagle/traineagle3/config.json), no eagle_config."""
    dst = specforge_draft(tmp_path, name, rope=rope)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    del cfg["eagle_config"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


@pytest.mark.sglang
def test_rope_scaling_type_and_factor(sglang_ready, tmp_path: Path) -> None:
    """A Llama-3.1-style target (llama3 x8). A SpecForge draft whose config has no scaling was
    trained unscaled (SpecForge builds its rotary from the draft's config) and SGLang serves it
    unscaled: no finding, and no fix asks for the target's scaling. The EAGLE reference trainer
    rotates with a plain base-10000 rotary whatever the config says: a config carrying the target's
    llama3 scaling makes SGLang build another rotary than the one trained, an error."""
    target = target_config(tmp_path, rope_parameters={"rope_theta": 500000.0, **LLAMA3})
    draft = specforge_draft(tmp_path, rope={"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    draft_rope, target_rope = engine_rotary(draft, draft=True), engine_rotary(target.parent, draft=False)
    print(f"SGLang draft rotary {type(draft_rope).__name__}, target {type(target_rope).__name__} x{target_rope.scaling_factor}")
    assert type(draft_rope).__name__ == "RotaryEmbedding" and type(target_rope).__name__ == "Llama3RotaryEmbedding"
    assert "rope_mismatch" not in codes(run_audit(draft, target))
    twin = specforge_draft(tmp_path, "twin", rope={"rope_parameters": {"rope_theta": 500000.0, **LLAMA3}})
    assert type(engine_rotary(twin, draft=True)).__name__ == "Llama3RotaryEmbedding"
    assert "rope_mismatch" not in codes(run_audit(twin, target))
    eagle = eagle_draft(tmp_path, "eagle", {"rope_theta": 500000.0, "rope_scaling": LLAMA3})
    built = engine_rotary(eagle, draft=True)
    assert type(built).__name__ == "Llama3RotaryEmbedding" and built.base == 500000.0
    (found,) = [f for f in run_audit(eagle, target).findings if f.code == "rope_mismatch"]
    assert found.severity == "error" and "cnets.py" in found.message and "base 10000" in found.message, found.message
    assert '"rope_scaling" to {"rope_theta": 10000.0, "rope_type": "default"}' in found.fix, found.fix
    fixed = eagle_draft(tmp_path, "eagle_fixed", {"rope_scaling": {"rope_theta": 10000.0, "rope_type": "default"}})
    assert engine_rotary(fixed, draft=True).base == 10000.0
    assert "rope_mismatch" not in codes(run_audit(fixed, target))


@pytest.mark.sglang
def test_partial_rotary_factor_as_the_trainer_read_it(sglang_ready, tmp_path: Path) -> None:
    """SGLang's LlamaAttention reads partial_rotary_factor as a config attribute, never inside
    rope_parameters; SpecForge never reads it at all (its LlamaRotaryEmbedding gets the whole
    head_dim). A factor inside the dict: both rotate the whole head, no finding. A top-level
    factor: SGLang rotates half of each head, SpecForge trained on all of it, an error."""
    rope = {"rope_theta": 500000.0, "rope_type": "default"}
    target = target_config(tmp_path)
    draft = specforge_draft(tmp_path, rope={"rope_parameters": {**rope, "partial_rotary_factor": 0.5}})
    built = engine_rotary(draft, draft=True)
    print(f"SGLang draft rotary_dim {built.rotary_dim} of head_size {built.head_size}")
    assert built.rotary_dim == built.head_size == 16
    assert "rope_mismatch" not in codes(run_audit(draft, target))
    twin = specforge_draft(tmp_path, "twin", rope={"rope_parameters": rope, "partial_rotary_factor": 0.5})
    assert engine_rotary(twin, draft=True).rotary_dim == 8
    (found,) = [f for f in run_audit(twin, target).findings if f.code == "rope_mismatch"]
    assert found.severity == "error" and "0.5 of each head" in found.message and '"partial_rotary_factor" to 1' in found.fix
    # The same config from an unknown trainer: the target's rotary is a guess, so a warning naming the probe.
    unknown = specforge_draft(tmp_path, "unknown", rope={"rope_parameters": {**rope, "partial_rotary_factor": 0.5}})
    state = load_file(str(unknown / "model.safetensors"))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in renamed.items()}, str(unknown / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((unknown / "config.json").read_text())
    del cfg["eagle_config"]
    (unknown / "config.json").write_text(json.dumps(cfg))
    (found,) = [f for f in run_audit(unknown, target).findings if f.code == "rope_mismatch"]
    assert found.severity == "warning" and "trainer is not known" in found.message and "spectrace probe" in found.message


def speculators_lost(cfg: dict[str, Any]) -> None:
    """speculators#574: the saved transformer_layer_config lost its base; the top level kept it."""
    cfg["rope_theta"] = 500000.0
    cfg["transformer_layer_config"]["rope_parameters"] = {"rope_type": "default"}


def test_speculators_config_reads_the_nested_layer_config(tmp_path: Path) -> None:
    """speculators trains with its verifier's config (from_training_args) and saves it as
    transformer_layer_config, which the engine builds the layer from; a base left at the top level
    is not read there (speculators#574: the nested config lost it under transformers 5)."""
    target = target_config(tmp_path)
    result = run_audit(speculators_draft(tmp_path, speculators_lost), target)
    (found,) = [f for f in result.findings if f.code == "rope_mismatch"]
    assert found.severity == "error" and found.evidence["not_read"] == {"rope_theta": 500000.0}
    assert found.evidence["draft_rope"]["rope_theta_from"] == "default" and "speculators#574" in found.message
    assert '"transformer_layer_config.rope_parameters" to {"rope_theta": 500000.0, "rope_type": "default"}' in found.fix
    # Without a target, the trained base is not known (the verifier's), only the stray one: a warning naming the probe.
    (alone,) = [f for f in run_audit(speculators_draft(tmp_path / "b", speculators_lost), None).findings if f.code == "rope_mismatch"]
    assert alone.severity == "warning" and "rope_theta = 500000" in alone.message and "spectrace probe" in alone.message

    def kept(cfg: dict[str, Any]) -> None:
        cfg["transformer_layer_config"]["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}

    assert "rope_mismatch" not in codes(run_audit(speculators_draft(tmp_path / "c", kept), target))
    # The fixture itself, beside its own 10000 target: clean.
    assert "rope_mismatch" not in codes(run_audit(SPECULATORS, TARGET))


def test_rope_mismatch_under_vllm_too(tmp_path: Path) -> None:
    """vLLM builds the draft's rotary from the same config: the speculators draft whose nested
    config lost its base is an error there too; a SpecForge draft without a base, a warning."""
    target = target_config(tmp_path)
    spec = run_audit(speculators_draft(tmp_path, speculators_lost), target, "vllm", "0.32.0")
    assert [f.severity for f in spec.findings if f.code == "rope_mismatch"] == ["error"]
    draft = specforge_draft(tmp_path, rope={"rope_parameters": {"rope_type": "default"}})
    result = run_audit(draft, target, "vllm", "0.32.0")
    assert [f.severity for f in result.findings if f.code == "rope_mismatch"] == ["warning"]


# ------------------------------------------------------------------ vocabulary maps


def test_maps_are_read_by_value_from_safetensors(tmp_path: Path) -> None:
    maps = trained_maps()
    draft = specforge_draft(tmp_path, maps=maps)
    read = read_checkpoint(draft).maps
    assert read.d2t == maps["d2t"].tolist() and read.t2d == maps["t2d"].tolist() and read.notes == []
    # The trainer-written fixtures: d2t maps draft id i to 2i and t2d marks exactly those ids.
    fixture = read_checkpoint(SPECFORGE).maps
    assert target_ids(fixture.d2t or []) == [2 * i for i in range(DRAFT_VOCAB)]
    assert [i for i, m in enumerate(fixture.t2d or []) if m] == [2 * i for i in range(DRAFT_VOCAB)]
    assert "vocab_map_invalid" not in codes(run_audit(SPECFORGE, TARGET))


def test_maps_from_a_torch_pickle(tmp_path: Path) -> None:
    """A pytorch_model.bin goes through the weights-only loader; its maps are read the same."""
    draft = specforge_draft(tmp_path)
    state = load_file(str(draft / "model.safetensors"))
    state.update(trained_maps(torch.arange(DRAFT_VOCAB)))
    (draft / "model.safetensors").unlink()
    torch.save(state, draft / "pytorch_model.bin")
    ckpt = read_checkpoint(draft)
    assert ckpt.maps.d2t == list(range(DRAFT_VOCAB))
    assert "vocab_map_invalid" in codes(run_audit(draft, TARGET))


def test_arange_default_is_named_when_t2d_disagrees(tmp_path: Path) -> None:
    draft = specforge_draft(tmp_path, maps=trained_maps(torch.arange(DRAFT_VOCAB)))
    (found,) = [f for f in run_audit(draft, TARGET).findings if f.code == "vocab_map_invalid"]
    assert found.severity == "error" and found.evidence["arange_default"] is True
    assert "arange(128)" in found.message and "2i" in found.message and "t2d marks another set" in found.message
    assert "nonzero(t2d)" in found.fix
    clean = specforge_draft(tmp_path, "clean", maps=trained_maps())
    assert "vocab_map_invalid" not in codes(run_audit(clean, TARGET))


def test_arange_default_runs_past_the_vocabulary(tmp_path: Path) -> None:
    """No t2d: with a draft vocabulary over half the target's, 2i passes the last target id."""
    big = 160
    draft = specforge_draft(tmp_path, maps={"d2t": torch.arange(big)})
    state = load_file(str(draft / "model.safetensors"))
    del state["t2d"]
    save_file(state, str(draft / "model.safetensors"))
    cfg = json.loads((draft / "config.json").read_text())
    cfg["draft_vocab_size"] = big
    (draft / "config.json").write_text(json.dumps(cfg))
    found = [f for f in run_audit(draft, TARGET).findings if f.code == "vocab_map_invalid"]
    assert len(found) == 1 and found[0].evidence["arange_default"] is True
    assert "32 draft id(s) map outside the target vocabulary [0, 256): draft id 128 -> target id 256" in found[0].message


@pytest.mark.parametrize(
    ("what", "d2t", "t2d", "needle"),
    [
        ("length", [0] * 100, None, "d2t has 100 entries but draft_vocab_size is 128"),
        ("order", [1] + [0] * 127, None, "target ids do not rise strictly: draft id 0 -> 1, draft id 1 -> 1"),
        ("negative", [-1] + [0] * 127, None, "map outside the target vocabulary [0, 256): draft id 0 -> target id -1"),
        ("t2d length", [0] * 128, [True] * 128, "t2d has 128 entries but the target vocabulary has 256"),
    ],
)
def test_each_map_rule(what: str, d2t: list[int], t2d: list[bool] | None, needle: str) -> None:
    (found,) = check_vocab_map(d2t, t2d, draft_vocab_size=DRAFT_VOCAB, target_vocab=VOCAB)
    assert needle in found.message, (what, found.message)
    assert found.evidence["arange_default"] is False


def test_a_proper_map_gives_nothing() -> None:
    maps = trained_maps()
    assert check_vocab_map(maps["d2t"].tolist(), maps["t2d"].tolist(), draft_vocab_size=DRAFT_VOCAB, target_vocab=VOCAB) == []
    assert check_vocab_map([0] * VOCAB, [True] * VOCAB, draft_vocab_size=VOCAB, target_vocab=VOCAB) == []  # identity, full vocab


@pytest.mark.sglang
@pytest.mark.parametrize("bug", [True, False])
def test_hot_token_id_sglang_builds(sglang_ready, tmp_path: Path, bug: bool) -> None:
    """SGLang's load_weights builds hot_token_id = d2t + arange and skips t2d: the map it
    serves with, checked against the vocabulary and the checkpoint's t2d."""
    sh = sglang_ready
    maps = trained_maps(torch.arange(DRAFT_VOCAB) if bug else None)
    draft = specforge_draft(tmp_path, maps=maps)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["target_hidden_size"] = cfg["hidden_size"]
    model = sh.build_sglang_eagle3_draft(cfg, load_file(str(draft / "model.safetensors")))
    hot = model.get_hot_token_id().tolist()
    print(f"SGLang hot_token_id (d2t {'= arange' if bug else 'of the trained vocabulary'}): {hot[:8]} ... {hot[-3:]}")
    # Reproduction: the engine's map is d2t + arange, whatever t2d says.
    assert hot == target_ids(maps["d2t"].tolist())
    trained = trained_vocab().tolist()
    assert (hot != trained) is bug and (hot == [2 * i for i in range(DRAFT_VOCAB)]) is bug
    # The pure check the integration calls, with the checkpoint's own maps read by the audit's reader.
    ckpt = read_vocab_maps(draft, read_checkpoint(draft).tensors)
    found = check_engine_hot_map(hot, draft_vocab_size=DRAFT_VOCAB, target_vocab=VOCAB, checkpoint_d2t=ckpt.d2t, t2d=ckpt.t2d)
    if not bug:
        assert found == []
        return
    (one,) = found
    assert one.code == "vocab_map_invalid" and one.module == "draft.hot_token_id" and one.evidence["arange_default"] is True
    assert "differs from the checkpoint" not in one.message  # the engine did what the checkpoint says; the checkpoint is wrong


def test_engine_map_that_differs_from_the_checkpoint() -> None:
    """A map rebuilt after load (e.g. a TP shard gathered by global id) differs from d2t."""
    maps = trained_maps()
    hot = target_ids(maps["d2t"].tolist())
    hot[5], hot[6] = hot[6], hot[5]
    (found,) = check_engine_hot_map(hot, draft_vocab_size=DRAFT_VOCAB, target_vocab=VOCAB, checkpoint_d2t=maps["d2t"].tolist())
    assert "differs from the checkpoint's d2t at 2 draft id(s)" in found.message


# ------------------------------------------------------------------ the CLI


def test_cli_rope_and_vocab(tmp_path: Path) -> None:
    target = target_config(tmp_path)
    # Its record says it was trained at the target's base; its config lost it.
    bad_rope = trained_at(specforge_draft(tmp_path, "rope", rope={"rope_parameters": {"rope_type": "default"}}), 500000.0)
    bad_map = specforge_draft(tmp_path, "map", rope={"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}},
                              maps=trained_maps(torch.arange(DRAFT_VOCAB)))  # fmt: skip
    clean = specforge_draft(
        tmp_path, "clean", rope={"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}, maps=trained_maps()
    )
    for draft, code in ((bad_rope, "rope_mismatch"), (bad_map, "vocab_map_invalid"), (clean, None)):
        proc = run_cli(draft, "--target-config", target, "--json")
        report = json.loads(proc.stdout)
        found = {f["code"] for f in report["findings"]}
        # The fixture's ids are ambiguous between the trainers' conventions: a warning of its own.
        assert found - {"aux_layers_mismatch"} == ({code} if code else set()), (draft.name, found)
        assert proc.returncode == (1 if code else 0), proc.stderr
    proc = run_cli(bad_rope, "--target-config", target, "--json")
    (rope,) = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "rope_mismatch"]
    assert rope["severity"] == "error" and '"rope_parameters"' in rope["fix"]

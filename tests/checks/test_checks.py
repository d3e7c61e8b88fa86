"""The capture detector on the seed's bug 3: a hand-converted config, widths equal."""

from __future__ import annotations

from spectrace.checks.capture import check_capture, check_config_flags
from spectrace.records import Capture
from spectrace.rules.conventions import engine_boundaries


def _capture(ids: list[int], layers: int = 61) -> Capture:
    result = engine_boundaries(ids, "sglang_deepseek_old", layers)
    return Capture(
        module="target", requested_ids=ids, boundaries=result.boundaries, num_layers=layers, hidden_size=7168, rule="sglang_deepseek_old"
    )


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


# ---------------------------------------------------------------- training flags at runtime
# check_config_flags reads rules.conventions.SGLANG_DRAFT_FLAGS, the audit's table.
ALL_FLAGS = {"norm_before_fc": True, "fc_norm": True, "norm_output": True, "norm_before_residual": True}


def _flags(config, version=None, engine="sglang"):
    return {f.evidence["flag"]: f.severity for f in check_config_flags(config, engine, version)}


def test_runtime_flags_of_an_unknown_release_are_those_every_release_ignores():
    # norm_before_fc is honoured from 0.5.17 on: without the release, no claim either way.
    assert _flags(ALL_FLAGS) == {"norm_before_residual": "error"}


def test_runtime_flags_follow_the_release():
    assert _flags(ALL_FLAGS, "0.5.14") == {"norm_before_fc": "error", "norm_before_residual": "error"}
    assert _flags(ALL_FLAGS, "0.5.17") == {"norm_before_residual": "error"}
    assert _flags(ALL_FLAGS, "0.5.23") == {"norm_before_residual": "error"}
    older = _flags(ALL_FLAGS, "0.5.10")  # no draft class before 0.5.14 was read: not known, not guessed
    assert older == dict.fromkeys(ALL_FLAGS, "warning")
    (found,) = [f for f in check_config_flags(ALL_FLAGS, "sglang", "0.5.14") if f.evidence["flag"] == "norm_before_fc"]
    assert found.evidence["read_in"] == ["0.5.14", "0.5.15", "0.5.16"] and "0.5.17 or newer" in found.fix


def test_runtime_flags_are_read_where_sglang_reads_them():
    # eagle_config.norm_before_fc first (as 0.5.17+ reads it), then the top level.
    assert _flags({"eagle_config": {"norm_before_fc": True}}, "0.5.14") == {"norm_before_fc": "error"}
    assert _flags({"norm_before_fc": True, "eagle_config": {"norm_before_fc": False}}, "0.5.14") == {}
    assert _flags({"use_aux_norm": True}, "0.5.23") == {}  # fc_norm's legacy key: implemented
    assert _flags({"transformer_layer_config": {"norm_before_residual": True}}) == {"norm_before_residual": "error"}


def test_runtime_embed_requires_grad_only_when_the_target_embedding_replaces_it():
    own_head = {"embed_requires_grad": True, "hidden_size": 64, "draft_vocab_size": 32}
    assert _flags({**own_head, "target_hidden_size": 64}) == {"embed_requires_grad": "warning"}
    assert _flags({**own_head, "target_hidden_size": 128}) == {}  # set_embed keeps the draft's
    # no draft_vocab_size: the head comes from the target, set_embed_and_head replaces both
    head_from_target = {"embed_requires_grad": True, "hidden_size": 64, "target_hidden_size": 128}
    assert _flags(head_from_target) == {"embed_requires_grad": "warning"}


def test_runtime_flags_are_sglang_facts_only():
    assert _flags(ALL_FLAGS, engine="vllm") == {}


# ---------------------------------------------------------------- a fix the release can take
def _llama_capture(ids: list[int]) -> Capture:
    result = engine_boundaries(ids, "sglang_llama", 6)
    return Capture(
        module="target",
        requested_ids=ids,
        boundaries=result.boundaries,
        num_layers=6,
        hidden_size=64,
        rule="sglang_llama",
        target_class="LlamaForCausalLM",  # an extra field, as the SGLang integration writes it
    )


def test_ids_that_ask_for_the_embedding_on_a_release_that_crashes_on_it_say_so():
    # The demo's trained pair served on SGLang 0.5.17 with ids [0, 1, 3] (its shipped
    # [-1, 1, 3] ask for the embedding, which 0.5.17's Llama cannot capture): the ids that
    # fix the mismatch are [-1, 1, 3], and the fix must say they need a newer release.
    config = {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]},
        "trainer_convention": "specforge",
        "trained_aux_boundaries": [0, 2, 4],
    }
    (old,) = [f for f in check_capture(_llama_capture([0, 1, 3]), config, engine_version="0.5.17") if f.code == "aux_layers_mismatch"]
    assert old.evidence["fix_ids"] == [-1, 1, 3]
    assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [-1, 1, 3]" in old.fix
    assert "SGLang 0.5.17 cannot capture the embedding" in old.fix and "0.5.22 or newer" in old.fix and "retrain" in old.fix
    (new,) = [f for f in check_capture(_llama_capture([0, 1, 3]), config, engine_version="0.5.23") if f.code == "aux_layers_mismatch"]
    assert "cannot capture" not in new.fix  # there the ids alone fix it
    (unknown,) = [f for f in check_capture(_llama_capture([0, 1, 3]), config) if f.code == "aux_layers_mismatch"]
    assert unknown.fix == new.fix  # no release known: no caveat is invented

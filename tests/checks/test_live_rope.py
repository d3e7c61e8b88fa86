"""checks.rope.check_live_rope and checks.draft_class.check_built_draft_class on plain facts
(what the integrations read from the engines' modules; the engine runs are in
tests/integrations/sglang/test_sglang_rope.py and tests/integrations/vllm/test_vllm_rope.py)."""

from __future__ import annotations

from spectrace.checks.draft_class import built_kind, check_built_draft_class
from spectrace.checks.facts import RopeKeys
from spectrace.checks.rope import LiveRotary, check_live_rope


def _rot(base: float = 10000.0, **kw) -> LiveRotary:
    fields = dict(module="model.layers.0.self_attn.rotary_emb", cls="RotaryEmbedding", base=base, rope_type="default",
                  factor=None, rotary_dim=128, head_size=128, neox=True, positions=[1, 7], cos_sin=[[0.5, 0.1], [0.2, 0.3]])  # fmt: skip
    fields.update(kw)
    return LiveRotary(**fields)


def test_alike_says_nothing_and_one_matching_target_rotary_is_enough() -> None:
    assert check_live_rope([_rot()], [_rot()]) == []
    # A target with one rotary per attention type (Gemma-style): the draft matches one of them.
    assert check_live_rope([_rot(1e6)], [_rot(), _rot(1e6)]) == []
    assert check_live_rope([_rot()], []) == []  # no target known: nothing to compare


def test_scaling_style_and_width() -> None:
    (one,) = check_live_rope([_rot(rope_type="default")], [_rot(rope_type="llama3", factor=8.0, cls="Llama3RotaryEmbedding")])
    assert "scaling default where the target's is llama3 x8" in one.message
    assert '"rope_type": "llama3"' in one.fix and '"factor": 8.0' in one.fix
    (one,) = check_live_rope([_rot(rotary_dim=64)], [_rot()])
    assert "64 of 128 head dims rotated" in one.message and '"partial_rotary_factor" to 1' in one.fix


def test_cos_sin_rows_differ_where_every_attribute_agrees() -> None:
    (one,) = check_live_rope([_rot(cos_sin=[[0.5, 0.1], [0.2, 0.9]])], [_rot()])
    assert "cos/sin values 0.6 apart from the target's at position 7" in one.message


def test_the_config_says_where_the_base_came_from() -> None:
    keys = RopeKeys(rope_parameters={"rope_type": "default"})
    (one,) = check_live_rope([_rot()], [_rot(500000.0)], draft_keys=keys, label="SGLang")
    assert "(SGLang's default: the config gives no base where SGLang reads one)" in one.message
    assert one.evidence["draft_config_rope"]["rope_theta_from"] == "default"


def test_built_class() -> None:
    assert built_kind("DeepseekV3ForCausalLMNextN") == "nextn" and built_kind("LlamaForCausalLMEagle3") == "eagle3"
    (one,) = check_built_draft_class("DeepseekV3ForCausalLMNextN", ["DeepseekV3ForCausalLM"], ["fc.weight"], False)
    assert one.code == "draft_class_mismatch" and one.evidence["class_kind"] == "nextn"
    assert check_built_draft_class("DeepseekV3ForCausalLMNextN", ["DeepseekV3ForCausalLM"], ["eh_proj.weight"], False) == []
    assert check_built_draft_class("LlamaForCausalLMEagle3", ["LlamaForCausalLMEagle3"], ["fc.weight"], True) == []

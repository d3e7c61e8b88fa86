"""The draft's rotary embedding against the target's, on SGLang 0.5.23's own objects.

Each bug is first shown on the engine's objects (the ``base`` and ``is_neox_style`` of
the ``rotary_emb`` modules SGLang built for the draft and for the target), then
spectrace names it at the draft's load. The clean twin rotates like its target and
raises nothing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.integrations.core.rotary import live_rotaries
from tests.helpers import sglang_harness as sh

pytestmark = pytest.mark.sglang

HIDDEN, VOCAB = 64, 128


@pytest.fixture(scope="module")
def installed():
    yield from sh.installed("sglang.srt.models.llama", "sglang.srt.models.llama_eagle3")


def _target(**rope):
    return sh.build_sglang_llama_target(sh.tiny_llama_config(**rope), layer_ids=[0, 1, 2])


def _draft(load: bool = True, **rope):
    config = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, draft_vocab_size=None,
        target_hidden_size=HIDDEN, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}, **rope,
    )  # fmt: skip
    draft = sh.build_sglang_eagle3_draft(config)
    if load:  # the load the server runs: spectrace's seam (the tensors are the draft's own)
        draft.load_weights([(n.replace("model.layers.0.", "midlayer."), p.detach().clone()) for n, p in draft.named_parameters()])
    return draft


def _rotary(model):
    (emb,) = [m for n, m in model.named_modules() if n.endswith("self_attn.rotary_emb")][:1]
    return emb


def _rope(rec):
    return [f for f in rec.findings() if f.code == "rope_mismatch"]


def test_draft_base_beside_the_target(rec) -> None:
    # The draft's config says rope_theta 500000, the target rotates with 10000. The draft's trainer
    # (SpecForge, signed by eagle_config) trains with the base its config gives, so the target's other
    # base is no evidence: nothing to say. Its config stating it was trained at 10000 is evidence.
    target = _target()
    draft = _draft(rope_theta=500000.0)
    t, d = _rotary(target), _rotary(draft)
    print(f"SGLang built: target {type(t).__name__}(base={t.base}), draft {type(d).__name__}(base={d.base})")
    assert (t.base, d.base) == (10000.0, 500000.0)  # the engine's own objects differ from the target's
    assert not torch.allclose(t.cos_sin_cache[1], d.cos_sin_cache[1])
    assert _rope(rec) == []
    draft = _draft(rope_theta=500000.0, trained_rope_theta=10000.0)
    (one,) = _rope(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.module == "draft"
    assert "base 500000" in one.message and "config.json (trained_rope_theta) says the draft was trained with base 10000" in one.message
    assert "rope_theta) to 10000" in one.fix
    assert one.evidence["draft_rope"]["rope_theta"] == 500000.0
    assert one.evidence["target_rope"][0]["rope_theta"] == 10000.0


def test_draft_config_lost_its_base(rec) -> None:
    # #43's reports: a 500000 target, a draft config with no base -> SGLang's 10000. That is also what
    # a healthy SpecForge draft looks like (SpecForge trained it at 10000 from the same config): the
    # config cannot tell, so a warning naming the probe, and no fix that copies the target's base.
    # A server reads the draft's raw config.json (transformers fills the default into the parsed
    # object): the file as a converter left it, with no base anywhere.
    from spectrace.integrations.sglang import correlate

    target = _target(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"], "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "draft_vocab_size": None,
        "target_hidden_size": HIDDEN, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    }  # fmt: skip
    correlate.note_draft_config(raw, source="draft/config.json")
    draft = _draft()
    print(f"SGLang built: target base={_rotary(target).base}, draft base={_rotary(draft).base}")
    assert (_rotary(target).base, _rotary(draft).base) == (500000.0, 10000.0)
    (one,) = _rope(rec)
    print(one.message, "| fix:", one.fix)
    assert one.severity == "warning" and "base 10000 (SGLang's default" in one.message and "500000" in one.message
    assert "spectrace probe TRACE_DIR --draft DRAFT_DIR" in one.message and "500000" not in one.fix


def test_gptj_style_draft(rec) -> None:
    # NeoX vs GPT-J (TensorRT-LLM#19036): same base, another pairing of the rotated dims.
    _target()
    draft = _draft(rope_is_neox_style=False)
    print("draft is_neox_style:", _rotary(draft).is_neox_style)
    assert _rotary(draft).is_neox_style is False
    (one,) = _rope(rec)
    # Every trainer known rotates NeoX-style (rotate_half): evidence enough for an error.
    assert one.severity == "error" and "GPT-J style (rotate interleaved pairs)" in one.message and "NeoX" in one.message
    assert '"rope_is_neox_style" to true' in one.fix and "rope_parameters" not in one.fix


def test_draft_loaded_before_the_target_was_built(rec, monkeypatch) -> None:
    # A script may build the draft first: the check runs when the target is built. The
    # earlier tests' models are forgotten, as in a fresh process.
    import weakref

    from spectrace.integrations.sglang import adopted, modules

    fresh: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
    monkeypatch.setattr(adopted, "_adopted", fresh)
    monkeypatch.setattr(modules, "_adopted", fresh)
    _draft(rope_theta=500000.0, trained_rope_theta=10000.0)
    assert _rope(rec) == []
    _target()
    (one,) = _rope(rec)
    assert "base 500000" in one.message and one.severity == "error"


def test_clean_twin_says_nothing(rec) -> None:
    target = _target(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    draft = _draft(rope_theta=500000.0)
    assert _rotary(target).base == _rotary(draft).base == 500000.0
    assert [r.base for r in live_rotaries(draft)] == [500000.0]
    assert _rope(rec) == []
    assert [f.code for f in rec.findings() if f.severity == "error"] == []

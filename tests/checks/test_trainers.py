"""The trainers as knowledge (``spectrace.rules.trainers``): which trainer a layout signs, and the
rotary each one trains with, checked against SpecForge 0.2.0's own draft class where it is installed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from spectrace.rules.trainers import RopeConfig, recognise, trained_rotaries, trained_rotary
from tests.helpers import paths

PUBLISHED = paths.FIXTURES / "published"
MIDLAYER = {"midlayer.self_attn.q_proj.weight", "fc.weight", "norm.weight"}
LAYERS = {"layers.0.self_attn.q_proj.weight", "fc.weight", "norm.weight"}


def published(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / f"{name}.json").read_text())


def rope_of(cfg: dict[str, Any]) -> RopeConfig:
    return RopeConfig(rope_theta=cfg.get("rope_theta"), rope_parameters=cfg.get("rope_parameters"), rope_scaling=cfg.get("rope_scaling"))


# ------------------------------------------------------------------ which trainer a layout signs


@pytest.mark.parametrize(
    ("names", "config", "trainers", "settles"),
    [
        (MIDLAYER, published("specforge-gpt-oss-20B-eagle3"), ("specforge",), True),
        # SpecForge's Llama template is the EAGLE trainer's with LlamaForCausalLMEagle3: either.
        (MIDLAYER, published("specforge-llama3-8B-eagle3"), ("specforge", "eagle"), True),
        (MIDLAYER, published("eagle-traineagle3-llama3.1-8B"), ("eagle",), True),
        (MIDLAYER, {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"use_last_layernorm": True}}, ("modelopt",), True),
        (LAYERS, {"speculators_model_type": "eagle3", "transformer_layer_config": {}}, ("speculators",), True),
        # A hand conversion from speculators: its flags in an SGLang-format config. The weights are
        # speculators', the ids may or may not have been translated: the layout does not settle them.
        (
            MIDLAYER,
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
                "norm_before_residual": True,
            },
            ("speculators",),
            False,
        ),
        # A speculators-format config over midlayer.* tensors: converted; the format names no trainer.
        (MIDLAYER, {"speculators_model_type": "eagle3", "transformer_layer_config": {}}, (), False),
        (LAYERS, {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}}, (), False),
    ],
)
def test_the_layout_that_signs_a_trainer(names: set[str], config: dict[str, Any], trainers: tuple[str, ...], settles: bool) -> None:
    found = recognise(names, config)
    assert found.trainers == trainers and found.settles_ids == settles, found
    assert found.how == ("signature" if trainers else "unknown") and found.why


def test_a_record_comes_first_but_a_format_is_no_record() -> None:
    spec = {"speculators_model_type": "eagle3", "transformer_layer_config": {}}
    assert recognise(MIDLAYER, published("specforge-gpt-oss-20B-eagle3"), "speculators", "train_command.txt").trainers == ("speculators",)
    assert recognise(MIDLAYER, published("specforge-gpt-oss-20B-eagle3"), "speculators", "train_command.txt").how == "record"
    # read_trainer_record names speculators from speculators_model_type alone: the format, not the trainer.
    assert recognise(MIDLAYER, spec, "speculators", "config.json (speculators_model_type)").trainers == ()
    stamped = {"trainer_convention": "specforge", "trained_aux_boundaries": [0, 2, 4]}
    assert recognise(MIDLAYER, stamped).trainers == ("spectrace",)


# ------------------------------------------------------------------ the rotary each trains with


def test_specforge_releases_on_the_llama3_70b_template() -> None:
    """configs/llama3-70B-ealge3.json copies the target's 500000 + llama3 x8: v0.1.0 rotated plain
    10000 anyway ("for nv type"), v0.1.1 on read the base and the llama3 scaling."""
    rope = rope_of(published("specforge-llama3-70B-ealge3"))
    got = {release: trained_rotary("specforge", rope, release) for release in ("0.1.0", "0.1.1", "0.2.0")}
    assert (got["0.1.0"].base, got["0.1.0"].rope_type, got["0.1.0"].from_config) == (10000.0, "default", False)
    assert (got["0.1.1"].base, got["0.1.1"].rope_type, got["0.1.1"].factor) == (500000.0, "llama3", 8.0)
    assert (got["0.2.0"].base, got["0.2.0"].rope_type, got["0.2.0"].factor) == (500000.0, "llama3", 8.0)


def test_a_config_without_rotary_keys_trains_at_10000_everywhere() -> None:
    rope = rope_of(published("specforge-llama3-8B-eagle3"))
    assert {t.base for _, t in trained_rotaries(("specforge", "eagle"), rope)} == {10000.0}


def test_the_eagle_trainer_ignores_the_config() -> None:
    rope = rope_of({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    got = trained_rotary("eagle", rope)
    assert (got.base, got.rope_type, got.from_config) == (10000.0, "default", False) and "cnets.py" in got.why


def test_speculators_trains_with_its_verifiers_rotary() -> None:
    """from_training_args: the verifier's config; a saved transformer_layer_config without a base lost it."""
    assert trained_rotary("speculators", RopeConfig(rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})).base == 500000.0
    lost = RopeConfig(rope_parameters={"rope_type": "default"})
    assert trained_rotary("speculators", lost, verifier_base=500000.0).base == 500000.0
    assert trained_rotary("speculators", lost).base == 10000.0


def test_a_transformers5_config_is_read_by_the_releases_that_could_read_it() -> None:
    rope = RopeConfig(rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    assert [w for w, _ in trained_rotaries(("specforge",), rope)] == ["SpecForge 0.2.0"]


# ------------------------------------------------------------------ SpecForge's own class agrees


@pytest.fixture(scope="module")
def specforge_draft():
    pytest.importorskip("specforge", reason="SpecForge 0.2.0 is installed in the main environment")
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    def build(cfg: dict[str, Any]):
        tiny = {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "vocab_size": 256, "draft_vocab_size": 128, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
        return LlamaForCausalLMEagle3(LlamaConfig(**tiny)).midlayer.self_attn.rotary_emb

    return build


@pytest.mark.parametrize("template", ["specforge-llama3-8B-eagle3", "specforge-llama3-70B-ealge3", "specforge-gpt-oss-20B-eagle3"])
def test_specforge_builds_what_the_rule_says(specforge_draft, template: str) -> None:
    """The rotary SpecForge 0.2.0's draft class really builds from its published template (read as
    transformers 5 reads it) is the one the rule gives: base and llama3 scaling alike."""
    from transformers import LlamaConfig

    cfg = published(template)
    built = specforge_draft(cfg)
    parsed = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    rule = trained_rotary("specforge", RopeConfig(rope_parameters=parsed.rope_parameters), "0.2.0")
    print(template, type(built).__name__, built.base, getattr(built, "scaling_factor", None), "| rule:", rule)
    assert float(built.base) == rule.base
    assert (getattr(built, "scaling_factor", None) is not None) == (rule.rope_type == "llama3")
    if rule.rope_type == "llama3":
        assert built.scaling_factor == rule.factor


# ------------------------------------------------------------------ a last-state draft at runtime


def modelopt_last_state() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [], "use_aux_hidden_state": False,
                         "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False},
    }  # fmt: skip


def test_a_last_state_draft_is_served_as_trained_at_runtime() -> None:
    """ModelOpt trains drafts on the target's last hidden state (use_aux_hidden_state false, no
    aux ids): no aux capture, the final state stored for the draft and fc skipped are what it was
    trained with. The same config signed by SpecForge (which trains on aux states only) keeps the errors."""
    from spectrace.checks.capture import check_capture
    from spectrace.checks.trainer import last_state_by_config
    from spectrace.checks.widths import check_draft_input_width, check_stored_hidden
    from spectrace.records import Capture

    off = Capture(module="target", requested_ids=None, boundaries=[], num_layers=0, hidden_size=0, rule="none", enabled=False)
    last = modelopt_last_state()
    why = last_state_by_config(last)
    assert why is not None and "ModelOpt" in why
    assert [f.code for f in check_capture(off, last, "EAGLE3")] == []
    assert check_draft_input_width(2880, 3 * 2880, 2880, "EXTEND", last_state=why) == []
    assert check_stored_hidden(2880, "LAST", last_state=why) == []
    specforge = {**published("specforge-gpt-oss-20B-eagle3"), "eagle_config": {"use_aux_hidden_state": False}}
    assert last_state_by_config(specforge) is None
    assert [f.code for f in check_capture(off, specforge, "EAGLE3")] == ["aux_capture_disabled"]
    assert [f.code for f in check_draft_input_width(2880, 3 * 2880, 2880, "EXTEND")] == ["fc_bypass"]
    # With aux ids left in, it was not trained on the last state alone.
    with_ids = {**last, "eagle_config": {**last["eagle_config"], "eagle_aux_hidden_state_layer_ids": [1, 17, 33]}}
    assert last_state_by_config(with_ids) is None


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("rope_theta: 500000.0\n", 500000.0),
        ("torchrun train.py --rope-theta 1000000 --lr 1e-4\n", 1000000.0),
        ('{"rope_theta": 150000, "x": 1}', 150000.0),
        ("--rope_theta=10000\n", 10000.0),
        ("rope_theta: 10000\nrope_theta: 500000\n", None),  # two that disagree: no statement
        ("my_rope_thetas: 3\nlr: 1e-4\n", None),
    ],
)
def test_a_run_record_states_the_trained_base(tmp_path, text: str, base: float | None) -> None:
    from spectrace.audit.trainer_record import read_trainer_record

    (tmp_path / "run.yaml").write_text(text)
    record = read_trainer_record(tmp_path, {})
    assert record.rope_theta == base and record.rope_source == ("run.yaml" if base else "")

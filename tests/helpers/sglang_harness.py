"""Run the REAL SGLang (0.5.23) target and EAGLE-3 draft forward on a CPU-only machine.

A helper for the `@pytest.mark.sglang` tests, not a test file. No server, no CUDA, no
sgl_kernel / vLLM / flashinfer: SGLang's own model classes (`models/llama.py`,
`models/llama_eagle3.py`, `models/deepseek_v2.py`), its `LogitsProcessor` and its
`load_weights`, driven by a hand-built `ForwardBatch` and a tiny plain-torch attention
backend. Install SGLang with `scripts/install-sglang-cpu.sh VENV`.

Usage from a test::

    sglang = pytest.importorskip("sglang")
    from tests.helpers import sglang_harness as sh
    sh.setup()                                # once per process (idempotent)
    target = sh.build_sglang_llama_target(hf_config, hf_model, layer_ids=[0, 1, 2])
    out = sh.run_target(target, input_ids)    # LogitsProcessorOutput
    out.hidden_states                         # the aux concat the draft reads

    @pytest.fixture(scope="module")
    def installed():                          # spectrace's hooks, for the module
        yield from sh.installed("sglang.srt.models.llama_eagle3")

Importing this module does not import sglang; `setup()` (called by every builder) does.
The process set-up, the attention backend and the ForwardBatch are
``spectrace.doctor.sglang_cpu``'s (``spectrace doctor`` runs on them too; the facts they
rely on are listed there); this module adds the tiny pairs the tests build.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import torch

from spectrace.doctor import sglang_cpu as cpu
from tests.helpers import draft_checkpoint, engine_hooks

#: `layer_ids` default of the target builders: do not call
#: `set_eagle3_layers_to_capture` at all (no aux capture; the logits processor then
#: stores the final normed hidden state). Pass `None` for SGLang's own default ids.
NO_CAPTURE = "no-capture"

# The tiny pair's sizes: a 4-layer Llama target, a 1-layer EAGLE-3 draft over a 32-id vocabulary.
HIDDEN = 64
N_LAYERS = 4
VOCAB = 128
DRAFT_VOCAB = 32


# The process set-up, the attention backend and the ForwardBatch live in the package
# (``spectrace doctor`` runs on them too); named here so the tests keep one import.
setup = cpu.setup
setup_tp = cpu.setup_tp
stub_setproctitle = cpu.stub_setproctitle
stub_torchvision_meta_registrations = cpu.stub_torchvision_meta_registrations
TorchKVPool = cpu.TorchKVPool
TorchSDPABackend = cpu.TorchSDPABackend
SpecInfo = cpu.SpecInfo
forward_context = cpu.forward_context
make_extend_batch = cpu.make_extend_batch
forward = cpu.forward
randomize_weights_ = cpu.randomize_weights_
_STATE = cpu._STATE


def installed(*modules: str, proctitle: bool = False) -> Iterator[None]:
    """A module fixture's body (``yield from``): ``setup()``, then spectrace's SGLang hooks on
    the real classes, ``modules`` imported first so they are patched now. ``proctitle``: stub
    setproctitle first, for the modules that import SGLang's scheduler."""
    setup()
    if proctitle:
        stub_setproctitle()
    from spectrace.integrations import sglang as st_sglang
    from spectrace.integrations.sglang import state as st_state

    yield from engine_hooks.installed(st_sglang.install, st_state.reset, modules)


# --------------------------------------------------------------------------------------
# Llama target and EAGLE-3 draft
# --------------------------------------------------------------------------------------


def tiny_hf_llama(vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = N_LAYERS, seed: int = 0):
    """``(config, model)``: the tiny random-weight HF Llama both SGLang test files load."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_llama_config(vocab, hidden, layers)
    return cfg, LlamaForCausalLM(cfg).eval()


def tiny_llama_config(vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = N_LAYERS, **extra: Any):
    """The tiny target's transformers ``LlamaConfig`` (``extra``: more fields, a rope for one)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **extra,
    )


def _state_items(hf_state_dict_or_model) -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(hf_state_dict_or_model, torch.nn.Module):
        sd = hf_state_dict_or_model.state_dict()
    else:
        sd = hf_state_dict_or_model
    return list(sd.items())


def build_sglang_llama_target(
    hf_config,
    hf_state_dict_or_model=None,
    layer_ids: Optional[Sequence[int]] | str = NO_CAPTURE,
):
    """Real `sglang.srt.models.llama.LlamaForCausalLM` from a transformers
    `LlamaConfig`, weights (an HF model or state dict; default: a seeded random HF
    model) through SGLang's own `load_weights`, then
    `set_eagle3_layers_to_capture(layer_ids)` (SGLang's +1 rule: id k captures HF
    `hidden_states[k+1]`). `layer_ids=None` passes None (SGLang's default
    `[2, n//2, n-3]`, taken literally); `NO_CAPTURE` (the default) skips the call
    (no aux capture: the target stores its final normed hidden state)."""
    setup()
    from sglang.srt.models.llama import LlamaForCausalLM

    cfg = copy.deepcopy(hf_config)
    model = LlamaForCausalLM(cfg).eval()
    if hf_state_dict_or_model is None:  # SGLang params are torch.empty: load something
        from transformers import LlamaForCausalLM as HFLlama

        with torch.random.fork_rng():
            torch.manual_seed(0)
            hf_state_dict_or_model = HFLlama(copy.deepcopy(hf_config)).state_dict()
    model.load_weights(_state_items(hf_state_dict_or_model))
    if layer_ids != NO_CAPTURE:
        model.set_eagle3_layers_to_capture(None if layer_ids is None else list(layer_ids))
    return model


def draft_config(layer_ids: Sequence[int] = (0, 1, 2), **extra: Any) -> dict[str, Any]:
    """SGLang/SpecForge-format EAGLE-3 draft config.json for the tiny target (``extra`` overrides)."""
    cfg: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"],
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        draft_vocab_size=DRAFT_VOCAB,
        target_hidden_size=HIDDEN,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    )
    cfg.update(extra)
    return cfg


def checkpoint(draft: torch.nn.Module, *, seed: int, lm_head_rows: int) -> dict[str, torch.Tensor]:
    """Every draft parameter under SpecForge's checkpoint names (midlayer.*, separate q/k/v and
    gate/up), norms at 1, ``lm_head`` with ``lm_head_rows`` rows (the parameter is padded);
    without embed_tokens (SGLang gives the draft the target's) and without d2t / t2d."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, p in draft.named_parameters():
        if name.endswith("embed_tokens.weight"):
            continue
        ckpt = name.replace("model.layers.0.", "midlayer.").replace("model.", "")
        split = draft_checkpoint.unfused(ckpt, p.shape, g, 4 * (HIDDEN // 4), 2 * (HIDDEN // 4))
        if split is not None:
            out.update(split)
        elif ckpt.startswith("lm_head."):
            out[ckpt] = torch.randn(lm_head_rows, HIDDEN, generator=g) * 0.02
        else:
            out[ckpt] = torch.ones_like(p) if "norm" in ckpt else torch.randn(p.shape, generator=g) * 0.02
    return out


def _draft_config(config_dict: Mapping[str, Any] | Any):
    from transformers import LlamaConfig

    if not isinstance(config_dict, Mapping):
        return copy.deepcopy(config_dict)
    d = dict(config_dict)
    d.pop("architectures", None)
    d.pop("model_type", None)
    cfg = LlamaConfig(**d)
    # LlamaConfig keeps unknown keys as attributes; make sure the EAGLE-3 ones exist.
    for key in ("draft_vocab_size", "target_hidden_size", "eagle_config"):
        if key in d:
            setattr(cfg, key, d[key])
    if not hasattr(cfg, "draft_vocab_size"):
        cfg.draft_vocab_size = None
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    return cfg


def build_sglang_eagle3_draft(
    config_dict: Mapping[str, Any] | Any,
    weights: Optional[Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]] = None,
    *,
    seed: Optional[int] = 0,
):
    """Real `LlamaForCausalLMEagle3` from a draft config.json dict (SpecForge / SGLang
    format: `draft_vocab_size`, `target_hidden_size`, `eagle_config{...}` plus the Llama
    fields; `num_hidden_layers` is normally 1). Parameters are first filled by
    `randomize_weights_(seed)` (`seed=None`: leave SGLang's uninitialised memory);
    `weights`, if given, then go through the real `load_weights` (names it does not
    know are dropped silently there)."""
    setup()
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    model = LlamaForCausalLMEagle3(_draft_config(config_dict)).eval()
    if seed is not None:
        randomize_weights_(model, seed)
    if weights is not None:
        items = weights.items() if isinstance(weights, Mapping) else weights
        model.load_weights(list(items))
    return model


def run_target(target, input_ids, *, capture_hidden_mode=None):
    """One EXTEND forward of the real target. Returns SGLang's `LogitsProcessorOutput`:
    `.next_token_logits` (last token per sequence), `.hidden_states` (FULL: every
    token's aux concat, or the final normed hidden state when nothing was captured)."""
    fb, backend = make_extend_batch(input_ids, capture_hidden_mode=capture_hidden_mode)
    return forward(target, fb, backend)


def run_draft(draft, input_ids, hidden_states, *, capture_hidden_mode=None):
    """One EXTEND forward of the real EAGLE-3 draft on `hidden_states` (the target's
    stored hidden states, one row per token of `input_ids`; in SGLang the draft sees
    the ids shifted by one, which the caller decides). Returns the draft's
    `LogitsProcessorOutput` (draft-vocab logits; map with `draft.hot_token_id`)."""
    fb, backend = make_extend_batch(
        input_ids,
        hidden_states=hidden_states,
        capture_hidden_mode=capture_hidden_mode,
    )
    return forward(draft, fb, backend)


# --------------------------------------------------------------------------------------
# DeepSeek-V3 target (Kimi-K2.5's language model)
# --------------------------------------------------------------------------------------


def tiny_deepseek_v3_config(**overrides):
    """A fresh tiny transformers `DeepseekV3Config` that SGLang's `deepseek_v2` accepts.
    Build a new one for every model: SGLang rewrites `rope_scaling` in place."""
    from transformers import DeepseekV3Config

    kw: dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.0,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_scaling={
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 1.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        tie_word_embeddings=False,
        attention_bias=False,
    )
    kw.update(overrides)
    cfg = DeepseekV3Config(**kw)
    _sglang_deepseek_fields(cfg)
    return cfg


def _sglang_deepseek_fields(cfg) -> None:
    """Fields SGLang's `deepseek_v2` reads that transformers' DeepseekV3Config lacks."""
    cfg.moe_layer_freq = 1
    cfg.topk_method = "noaux_tc"
    cfg.scoring_func = "sigmoid"
    cfg.ep_size = 1
    cfg.num_nextn_predict_layers = 0
    if getattr(cfg, "norm_topk_prob", None) is None:
        cfg.norm_topk_prob = True
    rs = getattr(cfg, "rope_scaling", None)
    if isinstance(rs, dict) and "type" not in rs and "rope_type" in rs:
        rs["type"] = rs["rope_type"]  # SGLang's yarn path reads "type"
    cfg.architectures = ["DeepseekV3ForCausalLM"]


def hf_deepseek_to_sglang_weights(
    hf_state_dict_or_model,
) -> list[tuple[str, torch.Tensor]]:
    """transformers 5 stores MoE experts fused (`experts.gate_up_proj (E, 2I, H)`,
    `experts.down_proj (E, H, I)`); SGLang's loader wants per-expert
    `experts.{e}.gate_proj/up_proj/down_proj.weight`."""
    out: list[tuple[str, torch.Tensor]] = []
    for name, t in _state_items(hf_state_dict_or_model):
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out.append((f"{base}{e}.gate_proj.weight", t[e, :inter].contiguous()))
                out.append((f"{base}{e}.up_proj.weight", t[e, inter:].contiguous()))
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out.append((f"{base}{e}.down_proj.weight", t[e].contiguous()))
        else:
            out.append((name, t))
    return out


def build_sglang_deepseek_target(
    hf_config=None,
    hf_state_dict_or_model=None,
    layer_ids: Optional[Sequence[int]] | str = NO_CAPTURE,
):
    """Real `sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM` (tiny MLA + MoE).
    `hf_config` defaults to `tiny_deepseek_v3_config()`; it is deep-copied and given
    the fields SGLang needs. Weights from a transformers model / state dict (default: a
    seeded random transformers model of the same config) go through
    `hf_deepseek_to_sglang_weights` and SGLang's `load_weights`. `layer_ids` as in
    `build_sglang_llama_target` (0.5.23 rule: +1 only when the first id is 1)."""
    setup()
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    cfg = copy.deepcopy(hf_config) if hf_config is not None else tiny_deepseek_v3_config()
    _sglang_deepseek_fields(cfg)
    model = DeepseekV3ForCausalLM(cfg).eval()
    if hf_state_dict_or_model is None:
        from transformers import DeepseekV3ForCausalLM as HFDeepseekV3

        hf_cfg = copy.deepcopy(hf_config) if hf_config is not None else tiny_deepseek_v3_config()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            hf_state_dict_or_model = HFDeepseekV3(hf_cfg).state_dict()
    # (SGLang's load_weights ends with post_load_weights: MLA w_kc / w_vc split)
    model.load_weights(hf_deepseek_to_sglang_weights(hf_state_dict_or_model))
    if layer_ids != NO_CAPTURE:
        model.set_eagle3_layers_to_capture(None if layer_ids is None else list(layer_ids))
    return model

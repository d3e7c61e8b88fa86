"""Run the REAL SGLang (0.5.23) target and EAGLE-3 draft forward on a CPU-only machine.

A helper for the `@pytest.mark.sglang` tests, not a test file. No server, no CUDA, no
sgl_kernel / vLLM / flashinfer: SGLang's own model classes (`models/llama.py`,
`models/llama_eagle3.py`, `models/deepseek_v2.py`), its `LogitsProcessor` and its
`load_weights`, driven by a hand-built `ForwardBatch` and a tiny plain-torch attention
backend. Install SGLang with `scripts/install-sglang-cpu.sh VENV`.

Usage from a test::

    sglang = pytest.importorskip("sglang")
    from tests.helpers from tests.helpers import sglang_harness as sh
    sh.setup()                                # once per process (idempotent)
    target = sh.build_sglang_llama_target(hf_config, hf_model, layer_ids=[0, 1, 2])
    out = sh.run_target(target, input_ids)    # LogitsProcessorOutput
    out.hidden_states                         # the aux concat the draft reads

    @pytest.fixture(scope="module")
    def installed():                          # spectrace's hooks, for the module
        yield from sh.installed("sglang.srt.models.llama_eagle3")

Importing this module does not import sglang; `setup()` (called by every builder) does.
Facts it relies on (measured on SGLang 0.5.23, CPU only):

- torchvision's compiled ops do not load beside a CPU torch: a stub module for
  `torchvision._meta_registrations` lets SGLang's import chain through.
- `sglang.srt.layers.rotary_embedding.base._is_cpu` must be True, else the rotary
  layer imports `vllm._custom_ops`. With it, every RMSNorm / SiluAndMul / rotary layer
  runs `forward_native`.
- `RadixAttention.forward` calls the backend published in
  `model_executor.forward_context` (not `forward_batch.attn_backend`).
- Do not set `SGLANG_USE_CPU_ENGINE=1` (needs an unpublished CPU sgl_kernel).
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import sys
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from tests.helpers import draft_checkpoint, engine_hooks

# SGLang's DeepSeek MoE routing goes through torch.compile; eager is faster for tiny
# models (first forward 4.5 s -> ~1 s). Must be set before torch._dynamo reads it.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

_STATE: dict[str, Any] = {"ready": False}

#: `layer_ids` default of the target builders: do not call
#: `set_eagle3_layers_to_capture` at all (no aux capture; the logits processor then
#: stores the final normed hidden state). Pass `None` for SGLang's own default ids.
NO_CAPTURE = "no-capture"

# The tiny pair's sizes: a 4-layer Llama target, a 1-layer EAGLE-3 draft over a 32-id vocabulary.
HIDDEN = 64
N_LAYERS = 4
VOCAB = 128
DRAFT_VOCAB = 32


# --------------------------------------------------------------------------------------
# process set-up
# --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stub_torchvision_meta_registrations() -> None:
    """torchvision's compiled ops fail beside a CPU torch (`torchvision::nms does not
    exist`); an empty `_meta_registrations` module lets `import torchvision` through."""
    sys.modules.setdefault(
        "torchvision._meta_registrations",
        types.ModuleType("torchvision._meta_registrations"),
    )


def setup() -> None:
    """Idempotent, once per process: stubs, `_is_cpu` patch, world-size-1 gloo parallel
    state and a published `ServerArgs(device="cpu")`. ~7 s the first time."""
    if _STATE["ready"]:
        return
    stub_torchvision_meta_registrations()
    import torch.distributed as dist

    added = []
    if not dist.is_initialized():
        for key, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0")):
            if key not in os.environ:
                os.environ[key] = value
                added.append(key)
    try:
        for attempt in range(5):
            try:
                _init_parallel(0, 1, _free_port())
                break
            except Exception as exc:  # noqa: BLE001
                # The port was free when asked for and taken before the store bound it (another
                # test process on a loaded machine): ask for another one.
                if "EADDRINUSE" not in str(exc) or attempt == 4:
                    raise
    finally:
        # Only the group's set-up reads them: a RANK left behind would name every later
        # test's trace in this worker after rank 0 (spectrace takes RANK as the process's rank).
        for key in added:
            os.environ.pop(key, None)
    _STATE["ready"] = True


def stub_setproctitle() -> None:
    """scheduler.py (imported by eagle_worker_v2) needs setproctitle, absent from the CPU venv."""
    try:
        import setproctitle  # noqa: F401
    except ImportError:
        stub = types.ModuleType("setproctitle")
        stub.setproctitle = lambda title: None  # type: ignore[attr-defined]
        stub.getproctitle = lambda: ""  # type: ignore[attr-defined]
        sys.modules["setproctitle"] = stub


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


def setup_tp(rank: int, world_size: int, port: int) -> None:
    """`setup()` for one rank of a tensor-parallel group on gloo (one process per rank):
    SGLang's own parallel state at `tp_size=world_size`, so its linear layers shard and its
    loaders narrow the checkpoint's full tensors."""
    if _STATE["ready"]:
        return
    stub_torchvision_meta_registrations()
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(rank))
    _init_parallel(rank, world_size, port)
    _STATE["ready"] = True


def _init_parallel(rank: int, world_size: int, port: int) -> None:
    """The `_is_cpu` patch, a published `ServerArgs(device="cpu", tp_size=world_size)` and
    SGLang's parallel state on gloo (both set-ups share it)."""
    import sglang.srt.layers.rotary_embedding.base as rope_base

    rope_base._is_cpu = True
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if parallel_state._WORLD is None:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu", tp_size=world_size), role="test", ranks=SpawnRanks(world_rank=rank))
    if parallel_state._WORLD is None:
        parallel_state.init_distributed_environment(
            world_size=world_size, rank=rank, local_rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
        )
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="gloo")


# --------------------------------------------------------------------------------------
# attention backend (plain torch) and the per-forward context
# --------------------------------------------------------------------------------------


class TorchKVPool:
    """A KV cache indexed by token slot (`out_cache_loc`), one entry per layer id.

    `set_kv_buffer` is what SGLang's attention layers (and the MLA prefill's latent
    cache) call; the stored tensors are allocated lazily at the first write."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def _buf(self, store: dict, layer_id: int, like: torch.Tensor) -> torch.Tensor:
        buf = store.get(layer_id)
        if buf is None or buf.shape[1:] != like.shape[1:] or buf.dtype != like.dtype:
            buf = like.new_zeros((self.size, *like.shape[1:]))
            store[layer_id] = buf
        return buf

    def set_kv_buffer(self, layer, loc, cache_k, cache_v=None, *args, **kwargs) -> None:
        lid = layer.layer_id
        loc = getattr(loc, "loc", loc)  # 0.5.23 passes a KVWriteLoc bundle
        self._buf(self.k, lid, cache_k)[loc.long()] = cache_k
        if cache_v is not None:
            self._buf(self.v, lid, cache_v)[loc.long()] = cache_v

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v[layer_id]

    def get_kv_buffer(self, layer_id: int):
        return self.k[layer_id], self.v.get(layer_id)


class TorchSDPABackend:
    """The one method `RadixAttention` calls: causal `scaled_dot_product_attention` per
    sequence. EXTEND with or without a cached prefix (so a one-token EXTEND after a
    prefix is a decode step); plain DECODE mode too. The KV cache is `TorchKVPool`,
    the req->token map `req_to_token` (filled by `make_extend_batch`).

    `prefill/decode_attention_backend_str = "triton"` makes DeepSeek's MLA pick the
    non-absorbed MHA path for an EXTEND without prefix."""

    prefill_attention_backend_str = "triton"
    decode_attention_backend_str = "triton"

    def __init__(self, max_reqs: int = 16, max_tokens: int = 4096) -> None:
        self.token_to_kv_pool = TorchKVPool(max_tokens)
        self.req_to_token = torch.zeros((max_reqs, max_tokens), dtype=torch.int64)
        self.req_to_token_pool = types.SimpleNamespace(req_to_token=self.req_to_token)

    # SGLang calls backend.forward(q, k, v, layer, forward_batch, save_kv_cache, **kw)
    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        nq, nkv = layer.tp_q_head_num, layer.tp_k_head_num
        qk_dim = getattr(layer, "qk_head_dim", layer.head_dim)
        v_dim = layer.v_head_dim
        q = q.reshape(-1, nq, qk_dim)
        if k is not None:
            k = k.reshape(-1, nkv, qk_dim)
            v = v.reshape(-1, layer.tp_v_head_num, v_dim)
            if save_kv_cache:
                self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        kbuf = self.token_to_kv_pool.k.get(layer.layer_id)
        vbuf = self.token_to_kv_pool.v.get(layer.layer_id)
        mode = forward_batch.forward_mode
        out = q.new_empty((q.shape[0], nq, v_dim))
        bs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens_cpu.tolist()
        if mode.is_decode():
            ext_lens = [1] * bs
        else:
            ext_lens = list(forward_batch.extend_seq_lens_cpu)
        pos = 0
        for i in range(bs):
            n_new, n_all = ext_lens[i], seq_lens[i]
            n_prefix = n_all - n_new
            qi = q[pos : pos + n_new]
            if n_prefix == 0 and k is not None:
                ki, vi = k[pos : pos + n_new], v[pos : pos + n_new]
            else:
                req = int(forward_batch.req_pool_indices[i])
                locs = self.req_to_token[req, :n_all]
                ki, vi = kbuf[locs], vbuf[locs]
            # (heads, tokens, dim); causal mask offset by the cached prefix
            qh, kh, vh = qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1)
            mask = torch.ones(n_new, n_all, dtype=torch.bool).tril(diagonal=n_prefix)
            oi = torch.nn.functional.scaled_dot_product_attention(
                qh,
                kh,
                vh,
                attn_mask=mask,
                scale=layer.scaling,
                enable_gqa=nq != kh.shape[0],
            )
            out[pos : pos + n_new] = oi.transpose(0, 1)
            pos += n_new
        return out.reshape(q.shape[0], nq * v_dim)


@contextlib.contextmanager
def forward_context(backend: TorchSDPABackend):
    """Publish `backend` as the attention backend for the duration of one forward."""
    from sglang.srt.model_executor.forward_context import (
        ForwardContext,
    )
    from sglang.srt.model_executor.forward_context import (
        forward_context as _sgl_forward_context,
    )

    with _sgl_forward_context(ForwardContext(attn_backend=backend)):
        yield


# --------------------------------------------------------------------------------------
# ForwardBatch
# --------------------------------------------------------------------------------------


@dataclass
class SpecInfo:
    """Stands in for SGLang's EagleDraftInput: the draft reads `.hidden_states`."""

    hidden_states: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)


def _as_seqs(input_ids) -> list[torch.Tensor]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            return [input_ids.long()]
        return [row.long() for row in input_ids]
    if len(input_ids) and isinstance(input_ids[0], int):
        return [torch.tensor(input_ids, dtype=torch.long)]
    return [torch.as_tensor(s, dtype=torch.long) for s in input_ids]


def make_extend_batch(
    input_ids,
    *,
    backend: Optional[TorchSDPABackend] = None,
    prefix_lens: Optional[Sequence[int]] = None,
    hidden_states: Optional[torch.Tensor] = None,
    capture_hidden_mode: Any = None,
    forward_mode: Any = None,
):
    """An EXTEND `ForwardBatch` for one or more sequences (1-D tensor, 2-D tensor of
    equal rows, or a list of id lists), flattened in SGLang's ragged layout.

    `prefix_lens[i]` tokens of request i are taken as already in the KV cache of
    `backend` (slots 0..prefix-1 of its row); the new tokens get the next slots. The
    default capture mode is FULL (every token's hidden state is stored, aux concat
    when the model captures). `hidden_states` becomes `spec_info.hidden_states`."""
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )

    seqs = _as_seqs(input_ids)
    bs = len(seqs)
    backend = backend or TorchSDPABackend()
    prefix = list(prefix_lens) if prefix_lens is not None else [0] * bs
    ext = [int(s.numel()) for s in seqs]
    seq_lens = [p + e for p, e in zip(prefix, ext)]
    row_stride = backend.req_to_token.shape[1] // max(bs, 1)
    locs, positions = [], []
    for i in range(bs):
        slots = torch.arange(i * row_stride, i * row_stride + seq_lens[i])
        backend.req_to_token[i, : seq_lens[i]] = slots
        locs.append(slots[prefix[i] :])
        positions.append(torch.arange(prefix[i], seq_lens[i]))
    flat_ids = torch.cat(seqs)
    start = [0]
    for e in ext[:-1]:
        start.append(start[-1] + e)
    fb = ForwardBatch(
        forward_mode=forward_mode if forward_mode is not None else ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=flat_ids,
        req_pool_indices=torch.arange(bs, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.cat(locs).to(torch.int64),
        seq_lens_sum=sum(seq_lens),
        positions=torch.cat(positions),
        extend_seq_lens=torch.tensor(ext, dtype=torch.int32),
        extend_seq_lens_cpu=ext,
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32),
        extend_prefix_lens_cpu=prefix,
        extend_start_loc=torch.tensor(start, dtype=torch.int32),
        extend_num_tokens=int(flat_ids.numel()),
        capture_hidden_mode=(capture_hidden_mode if capture_hidden_mode is not None else CaptureHiddenMode.FULL),
        spec_info=SpecInfo(hidden_states=hidden_states),
    )
    return fb, backend


def forward(model, forward_batch, backend: TorchSDPABackend):
    """`model.forward(input_ids, positions, forward_batch)` inside the forward context
    (SGLang's model runner calls the root model's `.forward()` the same way)."""
    with torch.no_grad(), forward_context(backend):
        return model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


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


def randomize_weights_(model: torch.nn.Module, seed: int = 0, std: float = 0.02):
    """Fill every parameter deterministically: norms (weights named `*norm*`) with 1,
    the rest with N(0, std). SGLang allocates most parameters with `torch.empty` and
    expects `load_weights` to fill them, so a model that is not loaded holds whatever
    memory it got (NaN/inf logits are possible)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # RMSNorm weights: hidden_norm, input_layernorm, ...
                p.fill_(1.0)
            elif p.dtype.is_floating_point:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)
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

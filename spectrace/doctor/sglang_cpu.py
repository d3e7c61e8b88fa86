"""SGLang's own model classes, run on a CPU without a server: the process set-up and a forward.

No CUDA, no sgl_kernel, vLLM or flashinfer: SGLang's model classes, its ``LogitsProcessor``
and its loaders, driven by a hand-built ``ForwardBatch`` and a small plain-torch attention
backend. Install SGLang with ``scripts/install-sglang-cpu.sh VENV``. ``spectrace doctor``
runs a user's shrunk pair through it; the project's tests build their tiny pairs on it.

    from spectrace.doctor import sglang_cpu as cpu
    cpu.setup()                                  # once per process (idempotent), ~7 s
    fb, backend = cpu.make_extend_batch(input_ids)
    out = cpu.forward(target, fb, backend)       # LogitsProcessorOutput

Facts it relies on (measured on SGLang 0.5.23, CPU only):

- torchvision's compiled ops do not load beside a CPU torch: a stub module for
  ``torchvision._meta_registrations`` lets SGLang's import chain through.
- ``sglang.srt.layers.rotary_embedding.base._is_cpu`` must be True, else the rotary
  layer imports ``vllm._custom_ops``. With it, every RMSNorm / SiluAndMul / rotary layer
  runs ``forward_native``.
- ``RadixAttention.forward`` calls the backend published in
  ``model_executor.forward_context`` (not ``forward_batch.attn_backend``).
- Do not set ``SGLANG_USE_CPU_ENGINE=1`` (needs an unpublished CPU sgl_kernel).

Importing this module imports torch, not SGLang; the functions do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

# SGLang's DeepSeek MoE routing goes through torch.compile; eager is faster for tiny
# models (first forward 4.5 s -> ~1 s). Must be set before torch._dynamo reads it.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch

_STATE: dict[str, Any] = {"ready": False}


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


def _init_parallel(rank: int, world_size: int, port: int, server_args: Any = None) -> None:
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
    args = server_args if server_args is not None else ServerArgs(model_path="dummy", device="cpu", tp_size=world_size)
    publish(args, role="test", ranks=SpawnRanks(world_rank=rank))
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
                assert kbuf is not None and vbuf is not None  # a prefix was cached by an earlier forward
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


def publish_server(server_args: Any = None) -> None:
    """Publish ``server_args`` as this process's server arguments, as a server's spawned
    worker does (``None``: the plain CPU arguments ``setup()`` publishes). SGLang's
    getters (``runtime_context.get_spec()``...) answer from them; the parallel state stays."""
    setup()
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    # SGLang's publish is last-publish-wins and keeps the groups the set-up built.
    publish(server_args or ServerArgs(model_path="dummy", device="cpu", tp_size=1), role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)


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

"""Which tensors get no statistics by default: those that are a function of the token ids alone.

An embedding output row is a table row: at a one-token decode step its mean, std and
absmax pick that row out of the embedding table, so a default trace would spell out the
prompt and the reply. The same holds for everything computed from that row alone before
any attention mixes in the context: the first decoder layer's input norm and its q/k/v
projections (a dictionary attack with the model's weights runs the 256 or 128k candidate
rows through them). By default (``SPECTRACE_TOKEN_STATS`` unset) such tensors keep their
shape and dtype and get no statistics, whatever the profile or module glob:

- every output of an embedding module: the ``target.embed`` and ``draft.embed`` roles,
  or a module whose class is one of :data:`EMBEDDING_TYPES`;
- in the target's first decoder layer (role ``target.layer[0]``), every tensor of the
  modules before attention: the input norm, and everything inside the attention module
  but its output projection (q/k/v or fused qkv projections, q/k norms, rotary, MLA's
  low-rank parts); the inputs of the layer itself, of its attention module and of the
  attention kernel module (``attn``: its q, k and v), whose outputs mix the context;
- in the EAGLE-3 draft's decoder layer: the input norm (it normalises the draft's own
  embedding), and the inputs of its attention and q/k/v projections (their input is that
  norm's output side by side with the hidden states, whose statistics are recorded: the
  halves' mean and spread could be told apart by arithmetic);
- the very same tensor object, or a view of it, wherever it is seen next in the step,
  e.g. as the first decoder layer's ``hidden_states`` input, the EAGLE-3 draft layer's
  ``embeds``, or the v slice of a fused qkv output.

A module of the first layer that other layers call too (SGLang builds one rotary module
and hands it to every layer) gets no statistics in any of its calls, and its tensors are
not remembered: the later layers' attention inputs keep theirs.

Everything else keeps its statistics: a decoder layer's output and the logits are a
function of the whole prefix, not of one id (docs/settings.md, privacy: what that still
allows).

    >>> private = TokenTensors()
    >>> private.is_token_module("target.embed", "Embedding")
    True
    >>> private.remember(row); private.holds(row)
    True
    >>> token_scope(model, "model.layers.0.self_attn.q_proj")
    'all'
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Literal

from torch import nn

from .roles import DRAFT_EMBED, DRAFT_LAYER, TARGET_EMBED, role_of, target_layer

TOKEN_ROLES = frozenset({TARGET_EMBED, DRAFT_EMBED})
# Token-embedding classes of torch, SGLang and vLLM (not rotary "embeddings": those are
# a function of positions).
EMBEDDING_TYPES = frozenset({"Embedding", "VocabParallelEmbedding", "ParallelEmbedding", "EmbeddingBag"})
# Token-only outputs remembered per tracer: a step hands each to the next module at once,
# so a few suffice (embedding, input norm, q, k, v, rotary per root and thread, with room).
REMEMBERED = 64

# What a module's place in the model says: "all" (inputs and outputs are a function of
# the token ids alone), "inputs" (its inputs are; its outputs mix the context), or None.
# "shared": an "all" module that other layers call too (SGLang hands one rotary module to
# every layer): no statistics at all, and its tensors are not remembered, since most of
# its calls belong to later layers whose attention inputs keep theirs.
Scope = Literal["all", "inputs", "shared"]
ALL: Scope = "all"
INPUTS: Scope = "inputs"
SHARED: Scope = "shared"
_TARGET_LAYER0 = target_layer(0)
# Layer containers (Hugging Face, SGLang, vLLM, GPT-2) and the draft's single layer.
_STACKS = ("layers", "h", "layer", "blocks")
_DRAFT_LAYERS = ("midlayer",)
# A decoder layer's norm before attention (Llama/Qwen/DeepSeek, GPT-2/Falcon, Mistral-style).
_INPUT_NORMS = frozenset({"input_layernorm", "ln_1", "input_layer_norm", "attention_norm", "ln_attn", "norm1"})
# A decoder layer's attention module.
_ATTENTIONS = frozenset({"self_attn", "attn", "attention", "self_attention"})
# Inside an attention module: the output projection (after attention: keeps statistics)
# and the attention kernel module (its q, k, v inputs are token-only, its output is not).
_OUT_PROJS = frozenset({"o_proj", "out_proj", "dense", "c_proj", "wo"})
_KERNELS = frozenset({"attn", "attn_mqa", "attn_mha", "core_attention", "inner_attention"})
# The draft layer's projections of [embeds, hidden states] (their inputs only).
_QKV = frozenset({"qkv_proj", "q_proj", "k_proj", "v_proj", "c_attn", "query_key_value", "Wqkv"})


def token_scope(root: nn.Module, name: str, hint: str | None = None) -> Scope | None:
    """Which of a module's tensors are a function of the token ids alone, from its place
    under ``root`` (``name``: dotted, below ``root``; ``hint``: the root's key, as
    :func:`.roles.role_of` takes it). Names not under a first or draft decoder layer
    answer None at once (a string scan: attach asks it of every hooked module)."""
    parts = name.split(".") if name else []
    for depth in range(len(parts)):
        part = parts[depth]
        if part in _DRAFT_LAYERS:
            end = depth + 1
        elif part in _STACKS and depth + 1 < len(parts) and parts[depth + 1] == "0":
            end = depth + 2
        else:
            continue
        layer_name = ".".join(parts[:end])
        layer = root.get_submodule(layer_name)
        role = role_of(root, layer_name, layer, hint=hint)
        rel = tuple(parts[end:])
        if role == _TARGET_LAYER0:
            return _target_scope(rel)
        if role == DRAFT_LAYER:
            return _draft_scope(rel)
    return None


def shared(root: nn.Module, module: nn.Module) -> bool:
    """Whether ``module`` sits at more than one place under ``root``."""
    places = 0
    for _name, node in root.named_modules(remove_duplicate=False):
        if node is module:
            places += 1
            if places > 1:
                return True
    return False


def _target_scope(rel: tuple[str, ...]) -> Scope | None:
    if not rel:
        return INPUTS  # the layer's input is the embedding output; its output mixes the context
    if rel[0] in _INPUT_NORMS:
        return ALL
    if rel[0] in _ATTENTIONS:
        if len(rel) == 1 or rel[1] in _KERNELS:
            return INPUTS
        if rel[1] in _OUT_PROJS:
            return None
        return ALL  # q/k/v, fused qkv, q/k norms, rotary, MLA's low-rank parts: before attention
    return None


def _draft_scope(rel: tuple[str, ...]) -> Scope | None:
    if rel[:1] and rel[0] in _INPUT_NORMS:
        return ALL
    if len(rel) == 1 and rel[0] in _ATTENTIONS:
        return INPUTS
    if len(rel) == 2 and rel[0] in _ATTENTIONS and rel[1] in _QKV:
        return INPUTS
    return None


class TokenTensors:
    """The token-only tensors of the current steps, by identity (weak: never kept alive)."""

    def __init__(self) -> None:
        self._refs: dict[int, Any] = {}
        self._order: list[int] = []
        self._lock = threading.Lock()

    @property
    def refs(self) -> dict[int, Any]:
        """id -> weak reference of each remembered tensor (read-only; :meth:`holds` per tensor)."""
        return self._refs

    @staticmethod
    def is_token_module(role: str | None, module_type: str) -> bool:
        """Whether a module's outputs are a function of one token id each."""
        return role in TOKEN_ROLES or module_type in EMBEDDING_TYPES

    def remember(self, tensor: Any) -> None:
        try:
            ref = weakref.ref(tensor)
        except TypeError:
            return
        with self._lock:
            key = id(tensor)
            if key not in self._refs:
                self._order.append(key)
            self._refs[key] = ref
            while len(self._order) > REMEMBERED:
                self._refs.pop(self._order.pop(0), None)

    def holds(self, tensor: Any) -> bool:
        """Whether ``tensor`` is a remembered token-only tensor (the object itself), or a
        view of one (a fused qkv output's v slice)."""
        refs = self._refs
        ref = refs.get(id(tensor))
        if ref is not None and ref() is tensor:
            return True
        base = getattr(tensor, "_base", None)
        if base is None:
            return False
        ref = refs.get(id(base))
        return ref is not None and ref() is base

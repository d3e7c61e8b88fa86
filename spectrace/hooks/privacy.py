"""Which tensors get no statistics by default: those that are a function of one token id.

An embedding output row is a table row: at a one-token decode step its mean, std and
absmax pick that row out of the embedding table, so a default trace would spell out the
prompt and the reply. By default (``SPECTRACE_TOKEN_STATS`` unset) such tensors keep
their shape and dtype and get no statistics:

- every output of an embedding module: the ``target.embed`` and ``draft.embed`` roles,
  or a module whose class is one of :data:`EMBEDDING_TYPES`;
- the very same tensor object wherever it is seen next in the step, e.g. as the first
  decoder layer's ``hidden_states`` input, or the EAGLE-3 draft layer's ``embeds``.

Everything else keeps its statistics: a decoder layer's output and the logits are a
function of the whole prefix, not of one id (docs/privacy: what that still allows).

    >>> private = TokenTensors()
    >>> private.is_token_module("target.embed", "Embedding")
    True
    >>> private.remember(row); private.holds(row)
    True
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .roles import DRAFT_EMBED, TARGET_EMBED

TOKEN_ROLES = frozenset({TARGET_EMBED, DRAFT_EMBED})
# Token-embedding classes of torch, SGLang and vLLM (not rotary "embeddings": those are
# a function of positions).
EMBEDDING_TYPES = frozenset({"Embedding", "VocabParallelEmbedding", "ParallelEmbedding", "EmbeddingBag"})
# Embedding outputs remembered per tracer: a step hands its embedding output to the next
# module at once, so a few suffice (one per root and thread, with room).
REMEMBERED = 16


class TokenTensors:
    """The embedding outputs of the current steps, by identity (weak: never kept alive)."""

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
        """Whether ``tensor`` is a remembered embedding output (the object itself)."""
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor

"""An EAGLE-3 target: a Hugging Face causal LM that stores aux hidden states the way SGLang does.

The capture follows an engine convention from :mod:`spectrace.rules.conventions`
(ids -> boundaries, with the engine's silent drops), the chunks are joined by a child
module ``aux_concat`` (so forward hooks can see the fused input), and when nothing was
captured the stored states fall back, silently, to the final *normed* hidden state, as
SGLang's ``LogitsProcessor._get_hidden_states_to_store`` does.

    >>> target = Eagle3Target(tiny_llama(), layer_ids=[-1, 1, 3], convention="sglang_llama")
    >>> target.capture.boundaries
    [0, 2, 4]
    >>> target(torch.tensor([1, 2, 3])).hidden_states.shape
    torch.Size([3, 192])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..rules.conventions import CaptureResult, default_ids, engine_boundaries


class AuxConcat(nn.Module):
    """Joins captured chunks along the feature axis; a module only so hooks can observe it."""

    def forward(self, *chunks: torch.Tensor) -> torch.Tensor:
        return torch.cat(chunks, dim=-1)


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (T, vocab)
    hidden_states: torch.Tensor  # (T, width): the aux concat, or the final normed state when none


def require_transformers() -> None:
    """The pair's models are transformers classes: say what to install, not where it broke."""
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "transformers":
            raise
        raise ModuleNotFoundError(
            "spectrace.eagle3 (the tiny reference pair) needs transformers: pip install 'spectrace[demo]'", name="transformers"
        ) from None


def tiny_llama(
    vocab_size: int = 128,
    hidden_size: int = 64,
    num_layers: int = 6,
    intermediate_size: int = 96,
    seed: int = 0,
) -> nn.Module:
    """A random-weight tiny ``LlamaForCausalLM`` (no download).

    >>> tiny_llama(num_layers=4).config.num_hidden_layers
    4
    """
    require_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


def tiny_deepseek_v3(vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 6, seed: int = 0) -> nn.Module:
    """A random-weight tiny ``DeepseekV3ForCausalLM`` (MoE, MLA; no download).

    >>> tiny_deepseek_v3().config.model_type
    'deepseek_v3'
    """
    require_transformers()
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return DeepseekV3ForCausalLM(config).eval()


class Eagle3Target(nn.Module):
    """Wraps a HF causal LM; ``forward(input_ids)`` returns logits and the states to store.

    ``capture`` says which boundaries the engine really captures for ``layer_ids`` under
    ``convention`` (ids past the end are dropped silently for SGLang Llama; SGLang
    DeepSeek 0.5.23 raises at forward on a count mismatch, as the engine does).
    ``aux_enabled=False`` is the engine with capture switched off (EAGLE algorithm,
    ``use_aux_hidden_state`` false): the final normed state is stored instead.
    """

    def __init__(
        self,
        model: nn.Module,
        layer_ids: Sequence[int] | None = None,
        convention: str = "sglang_llama",
        aux_enabled: bool = True,
    ) -> None:
        super().__init__()
        self.model = model
        self.aux_concat = AuxConcat()
        self.convention = convention
        self.num_layers: int = int(model.config.num_hidden_layers)
        self.hidden_size: int = int(model.config.hidden_size)
        self.vocab_size: int = int(model.config.vocab_size)
        self.capture: CaptureResult = engine_boundaries(list(layer_ids or []), convention, self.num_layers)
        self.aux_enabled = aux_enabled

    @property
    def capture_aux_hidden_states(self) -> bool:
        """SGLang's attribute name for ``aux_enabled``."""
        return self.aux_enabled

    @property
    def architecture(self) -> str:
        archs = getattr(self.model.config, "architectures", None) or [type(self.model).__name__]
        return str(archs[0])

    def set_eagle3_layers_to_capture(self, layer_ids: Sequence[int] | None = None) -> CaptureResult:
        """Turn capture on for ``layer_ids`` (None: the engine's literal default ``[2, n//2, n-3]``)."""
        n = self.num_layers
        ids = default_ids("sglang", n) if layer_ids is None else [int(i) for i in layer_ids]
        self.capture = engine_boundaries(ids, self.convention, n)
        self.aux_enabled = True
        return self.capture

    def get_embed(self) -> nn.Parameter:
        """The input embedding weight (what SGLang hands the draft through ``set_embed``)."""
        return self.model.get_input_embeddings().weight

    def forward(self, input_ids: torch.Tensor) -> TargetOutput:
        """Run (T,) ``input_ids``; returns (T, vocab) logits and (T, width) states to store."""
        ids = input_ids.view(1, -1)
        out = self.model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        normed = out.last_hidden_state[0]
        logits = self.model.lm_head(normed)
        stored = normed
        if self.aux_enabled and self.capture.error:
            raise RuntimeError(self.capture.error)  # SGLang DeepSeek 0.5.23 fails loudly here
        if self.aux_enabled and self.capture.boundaries:
            # HF hidden_states[b]: 0 = embedding output, b = output of block b-1.
            # (HF's hidden_states[n] is already normed; SGLang rules never reach b = n.)
            chunks = [out.hidden_states[b][0] for b in self.capture.boundaries]
            stored = self.aux_concat(*chunks)
        return TargetOutput(logits=logits, hidden_states=stored)

    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
        """Plain greedy decoding, one token per forward (the reference speculation must equal)."""
        ids = [int(t) for t in input_ids.view(-1)]
        new: list[int] = []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                nxt = int(self.forward(torch.tensor(ids)).logits[-1].argmax())
                ids.append(nxt)
                new.append(nxt)
        return new

    def describe(self) -> dict[str, Any]:
        """A plain dict of the capture in effect (for records and tests)."""
        return {
            "architecture": self.architecture,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "aux_enabled": self.aux_enabled,
            "convention": self.convention,
            "ids": list(self.capture.ids),
            "boundaries": list(self.capture.boundaries) if self.aux_enabled else [],
            "dropped_ids": list(self.capture.dropped_ids),
        }

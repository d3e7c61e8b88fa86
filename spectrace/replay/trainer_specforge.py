"""SpecForge's own ``LlamaForCausalLMEagle3`` as the replay's reference (``--reference specforge``).

For a Llama EAGLE-3 draft in the flat config.json format SpecForge writes (the draft's own
fields beside a Llama config; tensors under ``midlayer.*``), built with its SDPA attention.
Its modules run as its forward runs them: ``project_hidden_states`` (``fc_norm`` and fc),
its ``midlayer`` (hidden norm, input layernorm, attention with its own rotary, the raw
hidden state as residual), the final norm and head. SpecForge compiles its rotary and
norms with ``torch.compile``; they run eagerly here (same operations, no compiler).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .reference import ReferenceError
from .trainer_model import TrainerReference, causal_mask
from .trainer_speculators import is_speculators_checkpoint

PACKAGE = "specforge"


class SpecForgeReference(TrainerReference):
    TRAINER = "specforge"

    @classmethod
    def build_model(cls, raw: dict[str, Any]) -> torch.nn.Module:
        if is_speculators_checkpoint(raw) or "hidden_size" not in raw:
            raise ReferenceError("--reference specforge: config.json is not SpecForge's flat Llama EAGLE-3 format")
        from transformers import LlamaConfig

        with warnings.catch_warnings():  # "flash_attn is not found": SDPA is what runs here
            warnings.simplefilter("ignore")
            from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

        fields = {k: v for k, v in raw.items() if k not in ("architectures", "auto_map")}
        if fields.get("draft_vocab_size") is None:  # null: the whole vocabulary (as vLLM reads it too)
            fields["draft_vocab_size"] = fields.get("vocab_size")
        return LlamaForCausalLMEagle3(LlamaConfig(**fields), attention_backend="sdpa")

    @classmethod
    def model_name(cls, name: str) -> str:
        return "midlayer." + name[len("layers.0.") :] if name.startswith("layers.0.") else name

    def fc(self, fused: torch.Tensor) -> torch.Tensor | None:
        if "fc.weight" not in self.has:
            return None
        with torch.no_grad(), _eager():
            return self.model.project_hidden_states(fused.float()).float()

    def layer(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), _eager():
            out = self.model.midlayer(
                input_emb=embeds.float()[None],
                hidden_states=hidden.float()[None],
                cache_hidden=None,
                attention_mask=causal_mask(hidden.shape[0]),
                position_ids=positions.long()[None],
            )
        return out[0].float()

    def norm(self, layer_out: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), _eager():
            return self.model.norm(layer_out.float()).float()


def _eager() -> Any:
    """SpecForge's ``torch.compile``d functions, run as plain Python (no compiler here)."""
    import torch._dynamo

    return torch._dynamo.config.patch(disable=True)

"""speculators' own ``Eagle3DraftModel`` as the replay's reference (``--reference speculators``).

For a speculators-format checkpoint (``speculators_model_type: eagle3`` with a nested
``transformer_layer_config``), built with eager attention (the flex attention speculators
trains with has no CPU path here). Its modules run as its forward runs them: the input
norms (``norm_before_fc``, ``fc_norm``) and ``fc``; the rotary built for twice the hidden
size; the first decoder layer (embeddings and hidden state split, normed, joined, the
residual it keeps); the final norm and head.
"""

from __future__ import annotations

from typing import Any

import torch

from .reference import ReferenceError
from .trainer_model import TrainerReference, causal_mask

PACKAGE = "speculators"


def is_speculators_checkpoint(raw: dict[str, Any]) -> bool:
    return raw.get("speculators_model_type") == "eagle3" and isinstance(raw.get("transformer_layer_config"), dict)


class SpeculatorsReference(TrainerReference):
    TRAINER = "speculators"

    @classmethod
    def build_model(cls, raw: dict[str, Any]) -> torch.nn.Module:
        if not is_speculators_checkpoint(raw):
            raise ReferenceError("--reference speculators: config.json is not speculators' format (no speculators_model_type eagle3)")
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        config = Eagle3SpeculatorConfig.from_dict(raw)
        config.transformer_layer_config._attn_implementation = "eager"
        return Eagle3DraftModel(config)

    def fc(self, fused: torch.Tensor) -> torch.Tensor | None:
        if "fc.weight" not in self.has:
            return None
        m = self.model
        with torch.no_grad():
            x = fused.float()
            if m.input_norm is not None:
                x = m.input_norm(x)
            if m.fc_norm is not None:
                x = torch.cat([norm(chunk) for norm, chunk in zip(m.fc_norm, x.chunk(len(m.fc_norm), dim=-1), strict=True)], dim=-1)
            return m.fc(x).float()

    def layer(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = torch.cat([embeds.float(), hidden.float()], dim=-1)[None]
        pos = positions.long()[None]
        with torch.no_grad():
            position_embeddings = m.rotary_emb(x, pos)
            out = m.layers[0](x, attention_mask=causal_mask(x.shape[1]), position_ids=pos, position_embeddings=position_embeddings)
        return (out[0] if isinstance(out, tuple) else out)[0].float()

"""The trainer's own modelling code as the reference: speculators' ``Eagle3DraftModel``.

Used for a speculators-format checkpoint (``speculators_model_type: eagle3`` with a nested
``transformer_layer_config``) when the ``speculators`` package is installed. The model is
built from config.json alone, with eager attention; its weights are the ones spectrace
read itself (``replay/weights.py``: safetensors, pickles never executed), so speculators
never opens the folder nor fetches the verifier. Each module is speculators' own: the
input norms and ``fc``, the rotary built as its forward builds it, its first decoder layer
(the embeddings and hidden state split, normed and joined, the residual it keeps), its
final norm and head. Only the order they run in, one served forward at a time with a
causal mask over its rows, is spectrace's: speculators' forward trains several steps at
once and has no entry for one module.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .reference import Reference, ReferenceError

PACKAGE = "speculators"


def installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def is_speculators_checkpoint(raw: dict[str, Any]) -> bool:
    return raw.get("speculators_model_type") == "eagle3" and isinstance(raw.get("transformer_layer_config"), dict)


@dataclass
class SpeculatorsReference(Reference):
    """The same interface as the built-in reference, each module run by speculators' model."""

    model: Any = None
    has: frozenset[str] = frozenset()  # the tensor names the checkpoint holds

    @classmethod
    def wrap(cls, base: Reference, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> SpeculatorsReference:
        """Build speculators' draft for ``raw`` and load ``base``'s weights (already split and
        normalised) into it; :class:`ReferenceError` when it cannot take them."""
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        try:
            config = Eagle3SpeculatorConfig.from_dict(raw)
            # Eager: the attention speculators trains with by default (flex) has no CPU path here.
            config.transformer_layer_config._attn_implementation = "eager"
            model = Eagle3DraftModel(config).float().eval()
        except Exception as exc:  # speculators' own validation of the config
            raise ReferenceError(f"speculators could not build the draft from config.json ({type(exc).__name__}: {exc})") from None
        state = dict(base.w)
        for name in ("d2t", "t2d"):
            if name in tensors:
                state[name] = tensors[name]
        own = model.state_dict()
        wrong = [n for n, t in state.items() if n in own and tuple(own[n].shape) != tuple(t.shape)]
        if wrong:
            raise ReferenceError(
                f"speculators' draft does not take {wrong[0]} {tuple(state[wrong[0]].shape)} (it has {tuple(own[wrong[0]].shape)})"
            )
        missing, unexpected = model.load_state_dict({n: t for n, t in state.items() if n in own}, strict=False)
        notes = list(base.notes)
        notes.append("reference: speculators' own Eagle3DraftModel (eager attention), with the checkpoint's weights")
        ignored = [n for n in state if n not in own]
        if ignored:
            notes.append(f"speculators' draft has no place for {len(ignored)} checkpoint tensor(s), e.g. {ignored[0]}")
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        return cls(**fields | {"notes": notes}, model=model, has=frozenset(state) - frozenset(missing))

    # ------------------------------------------------------------- modules
    def embed(self, ids: torch.Tensor) -> torch.Tensor | None:
        if "embed_tokens.weight" not in self.has:
            return None
        with torch.no_grad():
            return self.model.embed_tokens(ids.long()).float()

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

    def fc_only(self, fc_in: torch.Tensor) -> torch.Tensor | None:
        if "fc.weight" not in self.has:
            return None
        with torch.no_grad():
            return self.model.fc(fc_in.float()).float()

    def layer(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = torch.cat([embeds.float(), hidden.float()], dim=-1)[None]
        pos = positions.long()[None]
        rows = x.shape[1]
        mask = torch.full((rows, rows), float("-inf")).triu(1)[None, None]  # causal over the kept rows
        with torch.no_grad():
            position_embeddings = m.rotary_emb(x, pos)
            out = m.layers[0](x, attention_mask=mask, position_ids=pos, position_embeddings=position_embeddings)
        return (out[0] if isinstance(out, tuple) else out)[0].float()

    def norm(self, layer_out: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model.norm(layer_out.float()).float()

    def head_weight(self) -> torch.Tensor | None:
        return self.model.lm_head.weight.detach().float() if "lm_head.weight" in self.has else None

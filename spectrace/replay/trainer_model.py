"""A trainer's own modelling code as the replay's reference: what both trainers share.

The trainer's draft class is built from config.json alone and given the weights spectrace
read itself (``replay/weights.py``: safetensors, pickles never executed), so the trainer's
code never opens the folder nor fetches a verifier. Each served module is then run by the
trainer's own module; only the order they run in, one served forward at a time with a
causal mask over its rows, is spectrace's (the trainers' forwards train several steps at
once and have no entry for one module). A subclass says how to build the model, how its
tensors are named, and how its fc and decoder layer are called.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .reference import Reference, ReferenceError


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


@dataclass
class TrainerReference(Reference):
    """The built-in reference's interface, each module run by a trainer's model."""

    model: Any = None
    has: frozenset[str] = frozenset()  # the tensor names (spectrace's spelling) the checkpoint holds

    # ------------------------------------------------------------- to say per trainer
    TRAINER = ""

    @classmethod
    def build_model(cls, raw: dict[str, Any]) -> torch.nn.Module:
        raise NotImplementedError

    @classmethod
    def model_name(cls, name: str) -> str:
        """A tensor's name in the trainer's model, from spectrace's normalised spelling."""
        return name

    # ------------------------------------------------------------- shared
    @classmethod
    def wrap(cls, base: Reference, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> TrainerReference:
        """The trainer's draft for ``raw`` with ``base``'s weights (already split and
        normalised); :class:`ReferenceError` when it cannot take them."""
        try:
            model = cls.build_model(raw).float().eval()
        except ReferenceError:
            raise
        except Exception as exc:  # the trainer's own validation of the config
            raise ReferenceError(f"{cls.TRAINER} could not build the draft from config.json ({type(exc).__name__}: {exc})") from None
        state = dict(base.w)
        for name in ("d2t", "t2d"):
            if name in tensors:
                state[name] = tensors[name]
        own = model.state_dict()
        named = {cls.model_name(n): (n, t) for n, t in state.items()}
        wrong = [m for m, (_, t) in named.items() if m in own and tuple(own[m].shape) != tuple(t.shape)]
        if wrong:
            m = wrong[0]
            raise ReferenceError(
                f"{cls.TRAINER}'s draft does not take {named[m][0]} {tuple(named[m][1].shape)} (it has {tuple(own[m].shape)})"
            )
        model.load_state_dict({m: t for m, (_, t) in named.items() if m in own}, strict=False)
        notes = list(base.notes)
        notes.append(f"reference: {cls.TRAINER}'s own modelling code ({type(model).__name__}), with the checkpoint's weights")
        ignored = [n for m, (n, _) in named.items() if m not in own]
        if ignored:
            notes.append(f"{cls.TRAINER}'s draft has no place for {len(ignored)} checkpoint tensor(s), e.g. {ignored[0]}")
        fields = {f: getattr(base, f) for f in Reference.__dataclass_fields__}
        return cls(**fields | {"notes": notes}, model=model, has=frozenset(n for m, (n, _t) in named.items() if m in own))

    def embed(self, ids: torch.Tensor) -> torch.Tensor | None:
        if "embed_tokens.weight" not in self.has:
            return None
        with torch.no_grad():
            return self.model.embed_tokens(ids.long()).float()

    def fc_only(self, fc_in: torch.Tensor) -> torch.Tensor | None:
        if "fc.weight" not in self.has:
            return None
        with torch.no_grad():
            return self.model.fc(fc_in.float()).float()

    def norm(self, layer_out: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model.norm(layer_out.float()).float()

    def head_weight(self) -> torch.Tensor | None:
        return self.model.lm_head.weight.detach().float() if "lm_head.weight" in self.has else None


def causal_mask(rows: int) -> torch.Tensor:
    """An additive causal mask (1, 1, rows, rows) over one forward's kept rows."""
    return torch.full((rows, rows), float("-inf")).triu(1)[None, None]

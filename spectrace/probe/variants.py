"""The candidate ways the draft could have been trained, each one reference draft.

Every variant is spectrace's reference draft (:mod:`spectrace.replay.reference`) built from
the checkpoint as its config says, with one setting changed: the rotary base (the
target's, and the bases trainers commonly copy), the rotary style (neox / gptj), the
``norm_before_residual`` flag, the draft's own embedding, and the vocabulary map rebuilt
from ``t2d``. Each is run end to end on the served draft's own kept inputs (the fused
input, the embeddings the engine gave it, the positions) to a top-1 target id per row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..replay.reference import Reference
from ..rules.conventions import engine_boundaries, trainer_boundaries

# Bases trainers copy from common targets (Llama 2 and most, Llama 3, Qwen 2.5 / 3).
COMMON_BASES = (10000.0, 500000.0, 1000000.0)


@dataclass
class Variant:
    """One candidate: its name, the axis it decides, and the fix that serves the draft that way."""

    name: str
    axis: str  # "served", "config", "rope", "norm_before_residual", "embed", "vocabulary map"
    fix: str
    ref: Reference | None = None  # None: the served draft's own top-1
    embed: bool = False  # the checkpoint's own embedding, not the one the engine gave
    fused_from: list[int] | None = None  # the fused input rebuilt from these target boundaries (--target)
    head: torch.Tensor | None = None  # another head over the whole target vocabulary (the target's; no map)


TARGETS_OWN = " (the target's)"  # a variant that serves the draft with its target's own setting


def _base(b: float) -> str:
    return f"{b:g}"


# How each trainer reads capture ids, in words; the engine's reading is the served draft's.
READINGS = {"specforge": "SpecForge's output of block k", "speculators": "speculators' and vLLM's boundary k"}


def variants(
    ref: Reference,
    t2d: list[bool] | None,
    target_rotary: dict[str, Any] | None,
    has_embed: bool,
    target: TargetFacts | None = None,
) -> list[Variant]:
    """The served draft, the checkpoint as its config says, and each one-setting change."""
    out = [
        Variant("as served", "served", ""),
        Variant(
            "the checkpoint as its config says",
            "config",
            "the engine does not run the draft as its config says: run spectrace replay TRACE_DIR --draft DRAFT_DIR "
            "to name the module that computes otherwise",
            ref,
        ),
    ]
    style = "neox" if ref.rope_neox else "gptj"
    target_base = float(target_rotary["base"]) if target_rotary and isinstance(target_rotary.get("base"), (int, float)) else None
    bases = [target_base] if target_base is not None else []
    bases += [b for b in COMMON_BASES if b not in bases]
    for base in bases:
        if base == ref.rope_theta:
            continue
        whose = TARGETS_OWN if base == target_base else ""
        out.append(
            Variant(
                f"rope base {_base(base)}{whose}",
                "rope",
                f"set the draft config's rope_theta (rope_parameters.rope_theta) to {_base(base)}, the base the draft was "
                f"trained at (served: {_base(ref.rope_theta)})",
                dataclasses.replace(ref, rope_theta=base),
            )
        )
    other = "gptj" if ref.rope_neox else "neox"
    whose = TARGETS_OWN if target_rotary and bool(target_rotary.get("neox", True)) == (other == "neox") else ""
    out.append(
        Variant(
            f"rotary style {other}{whose}",
            "rope",
            f"set rope_is_neox_style to {str(other == 'neox').lower()} in the draft config: the draft was trained with "
            f"the {other} rotary (served: {style})",
            dataclasses.replace(ref, rope_neox=not ref.rope_neox),
        )
    )
    nbr = bool(ref.flags.get("norm_before_residual"))
    out.append(
        Variant(
            f"norm_before_residual {str(not nbr).lower()}",
            "norm_before_residual",
            f"the draft was trained with norm_before_residual={str(not nbr).lower()}: set it so in the draft config and "
            "serve with an engine that honours it (served as if it were "
            f"{str(nbr).lower()})",
            dataclasses.replace(ref, flags={**ref.flags, "norm_before_residual": not nbr}),
        )
    )
    if has_embed:
        out.append(
            Variant(
                "the checkpoint's own embed_tokens",
                "embed",
                "serve the draft with its own trained embed_tokens (the engine gave it the target's)",
                ref,
                embed=True,
            )
        )
    if t2d is not None and ref.d2t is not None:
        hot = [i for i, flag in enumerate(t2d) if flag]
        rebuilt = [target - draft for draft, target in enumerate(hot)]
        if len(rebuilt) == len(ref.d2t) and rebuilt != list(ref.d2t):
            out.append(
                Variant(
                    "vocabulary map rebuilt from t2d",
                    "vocabulary map",
                    "the checkpoint's d2t does not match its t2d: rebuild d2t from t2d (d2t[i] = the i-th target id t2d "
                    "marks, minus i) and save it with the checkpoint",
                    dataclasses.replace(ref, d2t=rebuilt),
                )
            )
    if target is not None:
        out += _target_variants(ref, target)
    return out


@dataclass
class TargetFacts:
    """What ``--target`` adds: how many boundaries were recomputed, the draft's capture ids,
    the engine (its own reading is the served one), the target's head."""

    boundaries: int
    ids: list[int] | None
    engine: str
    head: torch.Tensor


def _engine_reading(engine: str, ids: list[int], layers: int) -> list[int] | None:
    rule = "sglang_llama" if engine.startswith("sglang.") else "speculators" if engine.startswith("vllm.") else None
    return engine_boundaries(ids, rule, layers).boundaries if rule is not None else None


def _capture_fix(engine: str, bounds: list[int], how: str) -> str:
    what = f"the draft was trained on the target's boundaries {bounds} ({how}); make the engine capture them: "
    if engine.startswith("sglang."):
        return what + f"eagle_aux_hidden_state_layer_ids {[b - 1 for b in bounds]} (SGLang captures id k as boundary k+1)"
    if engine.startswith("vllm."):
        return what + f"eagle_aux_hidden_state_layer_ids {bounds} (vLLM captures id k as boundary k)"
    return what + "set the capture ids the engine's rule reads as these boundaries"


def _target_variants(ref: Reference, target: TargetFacts) -> list[Variant]:
    out = []
    if target.ids:
        served = _engine_reading(target.engine, target.ids, target.boundaries)
        for convention, how in READINGS.items():
            bounds = trainer_boundaries(target.ids, convention)
            if bounds == served or not all(0 <= b < target.boundaries for b in bounds):
                continue
            out.append(
                Variant(
                    f"capture ids {target.ids} read as {how} (boundaries {bounds})",
                    "capture",
                    _capture_fix(target.engine, bounds, f"ids {target.ids} read as {how}"),
                    ref,
                    fused_from=bounds,
                )
            )
    out.append(
        Variant(
            "the target's head",
            "head",
            "the draft was trained with its target's head: serve it with the target's lm_head (SGLang: "
            '"draft_vocab_size": null makes the worker load it) and no vocabulary map',
            ref,
            head=target.head,
        )
    )
    return out


def predict(variant: Variant, t: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The variant's top-1 target id for every kept row of one forward; None where it cannot run."""
    if variant.ref is None:
        served = t.get("target_ids")
        return served[:, 0].long() if served is not None and served.dim() == 2 else None
    ref = variant.ref
    if variant.fused_from is not None:
        states = t.get("target_states")
        if states is None or "fc.weight" not in ref.w:
            return None
        n = int(t["input_ids"].numel()) if "input_ids" in t else states.shape[1]
        hidden: torch.Tensor | None = ref.fc(torch.cat([states[b, :n] for b in variant.fused_from], dim=-1))
    else:
        hidden = _fc(ref, t)
    ids = t.get("input_ids")
    embeds = ref.embed(ids) if variant.embed and ids is not None else t.get("embeds")
    head = variant.head if variant.head is not None else ref.head_weight()
    if hidden is None or embeds is None or head is None:
        return None
    positions = t.get("positions")
    positions = positions.long() if positions is not None else torch.arange(hidden.shape[0])
    n = min(hidden.shape[0], embeds.shape[0], positions.shape[0])
    with torch.no_grad():
        normed = ref.norm(ref.layer(positions[:n], embeds[:n], hidden[:n]))
        top = (normed @ head.t()).argmax(-1)
        return top if variant.head is not None else ref.target_ids(top)


def _fc(ref: Reference, t: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """fc over the served fused input (the input norms the variant's flags ask for), else
    over what the engine's fc read (vLLM applies its input norms before fc, outside the draft)."""
    fc = ref.w.get("fc.weight")
    fused, fc_in = t.get("hidden_in"), t.get("fc_in")
    if fc is not None and fused is not None and fused.shape[-1] == fc.shape[1]:
        return ref.fc(fused)
    if fc is not None and fc_in is not None:
        return ref.fc_only(fc_in)
    if fused is not None and fused.shape[-1] == ref.hidden:  # a draft without fc reads the state as is
        return fused.float()
    return None

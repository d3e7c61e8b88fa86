"""rope_mismatch on evidence: the rotary the engine builds against the one the draft was
TRAINED with, not against the target's.

A trainer does not always copy its target's rotary: SpecForge's Llama drafts rotate with the
base their own config gives (10000 when it gives none), the EAGLE reference trainer always
with 10000 (:mod:`spectrace.rules.trainers`). The engine builds its rotary from that same
config, so training and serving agree, and "copy the target's rope_theta" would *create* the
mismatch. So:

- an error only when the engine provably builds other than the draft was trained with: a
  record states the trained base, or the trainer is known or recognised and its rule, applied
  to this config, gives another rotary than the engine's (or the engine fails to build it);
- a warning where the files cannot tell: the trainer is unknown, its releases disagree on
  this config, or the config names no base while the target's differs (a draft trained at
  its target's base whose config lost the key looks exactly like a healthy SpecForge draft).
  The warning says what is unknown and names the command that decides it
  (:data:`spectrace.rules.trainers.PROBE_COMMAND`).

No fix asks to change a value the evidence says is right.
"""

from __future__ import annotations

import json
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.trainers import PROBE_COMMAND, Recognition, RopeConfig, TrainedRotary, trained_rotaries
from .facts import RopeKeys
from .rope import LiveRotary, Rotary, check_live_rope, check_rope, effective_rotary

PROBE = f"`{PROBE_COMMAND}` decides it from the draft's own weights"


def rope_config(keys: RopeKeys) -> RopeConfig:
    """The plain rotary keys a trainer read, from the audit's facts."""
    return RopeConfig(
        rope_theta=keys.rope_theta,
        rope_parameters=keys.rope_parameters,
        rope_scaling=keys.rope_scaling,
        partial_rotary_factor=keys.partial_rotary_factor,
    )


def _built(r: Rotary) -> str:
    scale = "" if r.rope_type == "default" else f", {r.rope_type} x{r.factor:g}" if r.factor else f", {r.rope_type}"
    part = "" if r.partial_rotary_factor == 1.0 else f", {r.partial_rotary_factor:g} of each head"
    how = "its default: the config names no base where it reads one" if r.base_from == "default" else f"from {r.base_from}"
    return f"base {r.base:g} ({how}){scale}{part}"


def _trained(t: TrainedRotary) -> str:
    scale = "" if t.rope_type == "default" else f", {t.rope_type} x{t.factor:g}" if t.factor else f", {t.rope_type}"
    part = "" if t.partial_rotary_factor == 1.0 else f", {t.partial_rotary_factor:g} of each head"
    return f"base {t.base:g}{scale}{part}"


def _matches(t: TrainedRotary, r: Rotary) -> bool:
    return t.same_as(r.base, r.rope_type, r.factor, r.partial_rotary_factor)


def _want(draft: Rotary, t: TrainedRotary) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in draft.params.items() if not isinstance(v, dict) and k not in ("partial_rotary_factor", "type")}
    if t.rope_type != draft.rope_type:
        out = {k: v for k, v in out.items() if k in ("rope_theta",)}
        if t.factor is not None:
            out["factor"] = t.factor
    out["rope_type"] = t.rope_type
    out["rope_theta"] = t.base
    return out


def _fix(draft: Rotary, keys: RopeKeys, t: TrainedRotary) -> str:
    parts = []
    if not t.same_as(draft.base, draft.rope_type, draft.factor, t.partial_rotary_factor):
        parts.append(f'"{draft.dict_key}" to {json.dumps(_want(draft, t), sort_keys=True)}')
        if keys.rope_theta is not None and not draft.dict_key.endswith("rope_scaling"):
            parts.append(f'"{keys.where}rope_theta" to {t.base:g}')
    if abs(draft.partial_rotary_factor - t.partial_rotary_factor) > 1e-9:
        parts.append(f'"{keys.where}partial_rotary_factor" to {t.partial_rotary_factor:g}')
    return "in the draft's config.json set " + " and ".join(parts) + " (what the draft was trained with)"


def _evidence(draft: Rotary, target: Rotary | None, engine: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"engine": engine, "draft_rope": draft.summary(), **extra}
    if target is not None:
        out["target_rope"] = target.summary()
    if draft.not_read:
        out["not_read"] = dict(draft.not_read)
    return out


def check_trained_rope(
    keys: RopeKeys,
    target_keys: RopeKeys | None,
    trainer: Recognition,
    *,
    trained_base: float | None = None,
    trained_base_source: str = "",
    engine: str = "sglang",
    label: str = "SGLang",
) -> list[Finding]:
    """One ``rope_mismatch`` at most: the engine's rotary against the trained one (see the module)."""
    draft = effective_rotary(keys, engine=engine)
    target = effective_rotary(target_keys, one_rotary=False, engine=engine) if target_keys is not None else None
    if draft.nested and engine == "sglang":
        return check_rope(keys, target_keys, engine=engine, label=label)  # the draft does not build at all: an error
    built = f"{label} builds the draft's rotary embedding with {_built(draft)}"
    if trained_base is not None:
        if abs(draft.base - trained_base) <= 1e-6 * max(trained_base, 1.0):
            return []
        stated = TrainedRotary(trained_base, draft.rope_type, draft.factor, draft.partial_rotary_factor, trained_base_source)
        return [
            finding(
                "rope_mismatch",
                f"{built}, but {trained_base_source} says the draft was trained with base {trained_base:g}: every "
                "position is rotated with another phase than in training; nothing fails, acceptance drops",
                module="config.json",
                evidence=_evidence(draft, target, engine, trained_rope_theta=trained_base, trained_from=trained_base_source),
                fix=_fix(draft, keys, stated),
            )
        ]
    if not trainer.known:
        return _unknown(keys, target_keys, trainer, engine, label)
    verifier = target.bases[0] if target is not None else None
    candidates = trained_rotaries(trainer.trainers, rope_config(keys), verifier_base=verifier)
    agree = [(who, t) for who, t in candidates if _matches(t, draft)]
    differ = [(who, t) for who, t in candidates if not _matches(t, draft)]
    evidence = _evidence(
        draft, target, engine, trainer=list(trainer.trainers), trainer_from=trainer.how, trainer_why=trainer.why,
        trained_rope={who: {"rope_theta": t.base, "rope_type": t.rope_type, "factor": t.factor,
                            "partial_rotary_factor": t.partial_rotary_factor, "rule": t.why} for who, t in candidates},
    )  # fmt: skip
    if differ and not agree:
        trained = {_trained(t) for _, t in differ}
        rules = "; ".join(dict.fromkeys(t.why for _, t in differ))
        (only,) = differ[:1]
        message = (
            f"{built}, but the draft was trained with {' or '.join(sorted(trained))} ({trainer.why}; {rules}): every "
            "position is rotated with another phase than in training; nothing fails, acceptance drops"
        )
        fix = _fix(draft, keys, only[1]) if len(trained) == 1 else f"set the rotary the draft was trained with; {PROBE}"
        return [finding("rope_mismatch", message, module="config.json", evidence=evidence, fix=fix)]
    if differ:
        message = (
            f"{built}; {', '.join(w for w, _ in agree)} trained such a config with the same, but "
            + "; ".join(f"{w} trained it with {_trained(t)}" for w, t in differ)
            + f" ({trainer.why}). Which release trained this draft is not known; {PROBE}"
        )
        return [
            finding("rope_mismatch", message, severity="warning", module="config.json", evidence=evidence,
                    fix=f"{PROBE}; keep the config as it is if the draft was trained by {agree[0][0]}")
        ]  # fmt: skip
    # The engine builds what the trainer trained with, from this config. Two things a config alone cannot rule out:
    strays = {p: v for p, v in draft.not_read.items() if p.endswith("rope_theta") and isinstance(v, (int, float)) and v != draft.base}
    lost = (
        draft.base_from == "default"
        and any(t.from_config for _, t in agree)
        and target is not None
        and not any(abs(draft.base - b) <= 1e-6 * b for b in target.bases)
    )
    if not strays and not lost:
        return []
    what = []
    if strays:
        what.append(
            f"{', '.join(f'{p} = {v:g}' for p, v in strays.items())} {'is' if len(strays) == 1 else 'are'} written where neither {label} nor the trainer reads it"
        )
    if lost and target is not None:
        what.append(
            f"the target rotates with base {target.bases[0]:g}: a draft trained at its target's base whose config lost the key looks exactly like this one"
        )
    message = (
        f"{built}, as {trainer.label} trained such a config ({trainer.why}; {agree[0][1].why}), so engine and trainer agree "
        f"if this config is the one the draft was trained with; but {'; '.join(what)}. The config cannot tell: {PROBE}"
    )
    return [
        finding("rope_mismatch", message, severity="warning", module="config.json", evidence=evidence,
                fix=f"{PROBE}; keep the config as it is unless the probe says the draft was trained with another base")
    ]  # fmt: skip


def _unknown(keys: RopeKeys, target_keys: RopeKeys | None, trainer: Recognition, engine: str, label: str) -> list[Finding]:
    """No trainer known: the target's rotary is the likeliest trained one, but not evidence; a warning."""
    found = check_rope(keys, target_keys, engine=engine, label=label)
    for f in found:
        f.severity = "warning"
        f.message += f". The trainer is not known ({trainer.why}), so which rotary it trained with is not either: {PROBE}"
        f.fix += f" -- if `{PROBE_COMMAND}` confirms the draft was trained with that rotary"
        f.evidence["trainer"] = []
        f.evidence["trainer_why"] = trainer.why
    return found


# ------------------------------------------------------------------ the rotary the engine built (live)


def _live_partial(d: LiveRotary) -> float:
    return d.rotary_dim / d.head_size if d.head_size else 1.0


def _live_matches(t: TrainedRotary, d: LiveRotary) -> bool:
    # Every trainer known rotates NeoX-style (rotate_half): a GPT-J-style draft was not trained so.
    return d.neox and t.same_as(d.base, d.rope_type, d.factor, _live_partial(d))


def _live_built(d: LiveRotary, label: str) -> str:
    style = "" if d.neox else ", GPT-J style (rotate interleaved pairs)"
    scale = "" if d.rope_type == "default" else f", {d.rope_type}" + (f" x{d.factor:g}" if d.factor else "")
    part = "" if abs(_live_partial(d) - 1.0) < 1e-9 else f", {d.rotary_dim} of {d.head_size} head dims"
    return f"{label} built the draft's rotary embedding ({d.module}) with base {d.base:g}{scale}{part}{style}"


def check_live_trained_rope(
    drafts: list[LiveRotary],
    targets: list[LiveRotary],
    *,
    draft_keys: RopeKeys | None,
    target_keys: RopeKeys | None,
    trainer: Recognition,
    trained_base: float | None = None,
    trained_base_source: str = "",
    label: str = "SGLang",
    source: str = "",
) -> list[Finding]:
    """rope_mismatch from the rotaries the engine built, judged against the trained rotary as
    :func:`check_trained_rope` judges the config: an error on evidence (a stated trained base, a
    known or recognised trainer's rule), else a warning naming the probe."""
    if not targets:
        return []
    if trained_base is None and (not trainer.known or draft_keys is None):
        found = check_live_rope(drafts, targets, draft_keys=draft_keys, target_keys=target_keys, label=label, source=source)
        why = trainer.why if draft_keys is not None else "the draft's config is not known"
        for f in found:
            f.severity = "warning"
            f.message += f". The trainer is not known ({why}), so which rotary it trained with is not either: {PROBE}"
            f.fix += f" -- if `{PROBE_COMMAND}` confirms the draft was trained with the target's rotary"
        return found
    out: list[Finding] = []
    config = effective_rotary(draft_keys) if draft_keys is not None else None
    for d in drafts:
        evidence: dict[str, Any] = {
            "observed": "the engine's rotary modules", "draft_rope": d.summary(), "target_rope": [t.summary() for t in targets],
            "trainer": list(trainer.trainers), "trainer_from": trainer.how, "trainer_why": trainer.why,
        }  # fmt: skip
        built = _live_built(d, label)
        if trained_base is not None:
            if abs(d.base - trained_base) <= 1e-6 * max(trained_base, 1.0):
                continue
            evidence["trained_rope_theta"] = trained_base
            out.append(
                finding(
                    "rope_mismatch",
                    f"{built}, but {trained_base_source} says the draft was trained with base {trained_base:g}: every position is "
                    "rotated with another phase than in training; nothing fails, acceptance drops",
                    module="draft",
                    evidence=evidence,
                    source=source,
                    fix=f'in the draft\'s config.json set the base the engine reads ("{draft_keys.where if draft_keys else ""}rope_parameters".rope_theta) to {trained_base:g}',
                )  # fmt: skip
            )
            continue
        assert draft_keys is not None and config is not None
        verifier = targets[0].base
        candidates = trained_rotaries(trainer.trainers, rope_config(draft_keys), verifier_base=verifier)
        agree = [(w, t) for w, t in candidates if _live_matches(t, d)]
        differ = [(w, t) for w, t in candidates if not _live_matches(t, d)]
        evidence["trained_rope"] = {
            w: {"rope_theta": t.base, "rope_type": t.rope_type, "factor": t.factor, "rule": t.why} for w, t in candidates
        }
        if differ and not agree:
            trained = sorted({_trained(t) for _, t in differ})
            rules = "; ".join(dict.fromkeys(t.why for _, t in differ))
            style = "" if d.neox else " (every trainer known rotates NeoX-style, rotate_half)"
            out.append(
                finding(
                    "rope_mismatch",
                    f"{built}, but the draft was trained with {' or '.join(trained)}{style} ({trainer.why}; {rules}): every position "
                    "is rotated with another phase than in training; nothing fails, acceptance drops",
                    module="draft",
                    evidence=evidence,
                    source=source,
                    fix=(
                        _fix(config, draft_keys, differ[0][1])
                        if len(trained) == 1 and d.neox
                        else f'in the draft\'s config.json set "{draft_keys.where}rope_is_neox_style" to true'
                        if not d.neox
                        else PROBE
                    ),
                )  # fmt: skip
            )
        elif differ:
            out.append(
                finding(
                    "rope_mismatch",
                    f"{built}; {', '.join(w for w, _ in agree)} trained such a config with the same, but "
                    + "; ".join(f"{w} trained it with {_trained(t)}" for w, t in differ)
                    + f" ({trainer.why}). Which release trained this draft is not known; {PROBE}",
                    severity="warning",
                    module="draft",
                    evidence=evidence,
                    source=source,
                    fix=f"{PROBE}; keep the config as it is if the draft was trained by {agree[0][0]}",
                )  # fmt: skip
            )
        elif (
            config.base_from == "default"
            and any(t.from_config for _, t in agree)
            and not any(abs(d.base - t.base) <= 1e-6 * t.base for t in targets)
        ):
            out.append(
                finding(
                    "rope_mismatch",
                    f"{built} ({label}'s default: the config names no base), as {trainer.label} trained such a config "
                    f"({trainer.why}); but the target rotates with base {targets[0].base:g}, and a draft trained at its target's "
                    f"base whose config lost the key looks exactly like this one. The config cannot tell: {PROBE}",
                    severity="warning",
                    module="draft",
                    evidence=evidence,
                    source=source,
                    fix=f"{PROBE}; keep the config as it is unless the probe says the draft was trained with another base",
                )  # fmt: skip
            )
    return out

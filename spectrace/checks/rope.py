"""RoPE truths: the rotary embedding the engine builds for the draft and for the target.

How the engine builds a rotary from a config.json, for the draft and for the target. Which
rotary the draft was *trained* with is its trainer's business (SpecForge rotates with the
base its own config gives, the EAGLE trainer with 10000 always: :mod:`spectrace.rules.trainers`);
:mod:`.rope_trained` judges the engine's rotary against that one, and uses the comparison
with the target here (:func:`check_rope`, :func:`check_live_rope`) only where the trainer is
unknown, or the engine cannot build the draft's rotary at all. The files are read alike only
when the keys sit where the engine looks:

- transformers 5 moved ``rope_theta`` into ``rope_parameters``; a config class takes
  ``rope_scaling`` (the old name) in place of ``rope_parameters`` when both are written,
  then a top-level ``rope_theta``, then its class default (10000 for Llama) for a base the
  dict lacks;
- SGLang 0.5.23 builds each decoder layer's rotary from that dict
  (``models/llama.py`` ``LlamaDecoderLayer.__init__``:
  ``rope_parameters.get("rope_theta", 10000)``; the EAGLE-3 draft layer of
  ``models/llama_eagle3.py`` inherits it), reads the scaling type from ``rope_type`` or
  ``type`` (``layers/rotary_embedding/factory.py::get_rope``) and
  ``partial_rotary_factor`` and ``rope_is_neox_style`` as attributes of the config, so a
  ``partial_rotary_factor`` inside ``rope_parameters`` alone is not read;
- a Llama draft has one rotary: a per-attention-type dict
  (``rope_parameters.full_attention.rope_theta``, copied from a Gemma-3 or Laguna target)
  is not read, the outer base (the default) is;
- a speculators config builds the layer from ``transformer_layer_config`` alone.

A draft that rotates with another base or scaling than it was trained with scores every
position with another phase; nothing fails, acceptance drops.

    >>> from spectrace.checks.facts import RopeKeys
    >>> effective_rotary(RopeKeys(rope_parameters={"rope_type": "default"})).base
    10000.0
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding
from .facts import RopeKeys

# The base a config class gives a dict without one: transformers 5's ``default_theta``
# (10000 for the Llama, Qwen, Mistral, DeepSeek and GLM classes; gpt_oss differs).
DEFAULT_BASE = 10000.0
CLASS_DEFAULT_BASE = {"gpt_oss": 150000.0}
# Keys of a rotary dict that are not scaling parameters.
_NOT_SCALING = {"rope_theta", "rope_type", "type", "partial_rotary_factor"}


@dataclass
class Rotary:
    """The rotary embedding a model gets from its config, as the engine reads it."""

    base: float
    base_from: str  # the key path the base was read from, or "default"
    rope_type: str  # "default" when there is no scaling
    factor: float | None
    partial_rotary_factor: float
    head_dim: int | None
    neox: bool
    dict_key: str  # the dict the engine reads (rope_scaling shadows rope_parameters), with its prefix
    params: dict[str, Any]  # that dict as read
    # Several bases: a target whose class keeps one rotary per attention type.
    bases: list[float] = field(default_factory=list)
    # Values written where this engine does not read them: path -> value.
    not_read: dict[str, Any] = field(default_factory=dict)
    # Per-attention-type dicts inside a one-rotary model's dict (their key names).
    nested: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rope_theta": self.base,
            "rope_theta_from": self.base_from,
            "rope_type": self.rope_type,
            "factor": self.factor,
            "partial_rotary_factor": self.partial_rotary_factor,
            "head_dim": self.head_dim,
            "is_neox_style": self.neox,
        }
        if len(self.bases) > 1:
            out["rope_theta_per_attention_type"] = self.bases
        return out


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _nested(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-attention-type dicts of a rotary dict (full_attention: {...}, ...)."""
    return {k: v for k, v in params.items() if isinstance(v, dict) and ("rope_theta" in v or "rope_type" in v)}


def effective_rotary(keys: RopeKeys, *, one_rotary: bool = True, engine: str = "sglang") -> Rotary:
    """The rotary the engine builds from ``keys``.

    ``one_rotary``: the model is a Llama-style layer with one rotary (the draft), so a
    per-attention-type dict is not read; False for a target, whose class may keep one per
    attention type (each base is then one the draft may match).
    """
    w = keys.where
    if keys.rope_scaling:  # transformers 5: ``rope_scaling or rope_parameters``
        dict_key, params = "rope_scaling", dict(keys.rope_scaling)
    elif keys.rope_parameters:
        dict_key, params = "rope_parameters", dict(keys.rope_parameters)
    else:
        dict_key, params = "rope_parameters", {}
    not_read: dict[str, Any] = dict(keys.stray)
    if keys.rope_scaling and keys.rope_parameters:
        for k, v in keys.rope_parameters.items():
            if k in ("rope_theta", "rope_type", "factor") and v != keys.rope_scaling.get(k):
                not_read[f"{w}rope_parameters.{k}"] = v
    default = CLASS_DEFAULT_BASE.get(keys.model_type, DEFAULT_BASE)
    nested = _nested(params)
    bases: list[float] = []
    if nested and not one_rotary:
        bases = [b for b in (_num(v.get("rope_theta")) for v in nested.values()) if b is not None]
    elif nested:
        # SGLang 0.5.23's get_rope hashes the dict's items for its cache: a dict value raises
        # TypeError (unhashable type: 'dict') and the draft never builds.
        for name, inner in nested.items():
            if "rope_theta" in inner:
                not_read[f"{w}{dict_key}.{name}.rope_theta"] = inner["rope_theta"]
    theta = _num(params.get("rope_theta"))
    if theta is not None:
        base, base_from = theta, f"{w}{dict_key}.rope_theta"
        if keys.rope_theta is not None and not _close(keys.rope_theta, theta):
            not_read[f"{w}rope_theta"] = keys.rope_theta  # the dict's own base wins
    elif keys.rope_theta is not None:
        base, base_from = keys.rope_theta, f"{w}rope_theta"
    elif bases:
        base, base_from = bases[0], f"{w}{dict_key}.{next(iter(nested))}.rope_theta"
    else:
        base, base_from = default, "default"
    if not bases:
        bases = [base]
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    factor = _num(params.get("factor")) if rope_type != "default" else None
    partial = keys.partial_rotary_factor
    in_dict = _num(params.get("partial_rotary_factor"))
    if partial is None and in_dict is not None:
        if engine == "sglang":
            # LlamaAttention reads getattr(config, "partial_rotary_factor", 1): transformers 5
            # keeps a top-level factor as an attribute, never one written inside the dict.
            if not _close(in_dict, 1.0):
                not_read[f"{w}{dict_key}.partial_rotary_factor"] = in_dict
        else:
            partial = in_dict
    head_dim = keys.head_dim
    if head_dim is None and keys.hidden_size and keys.num_attention_heads:
        head_dim = keys.hidden_size // keys.num_attention_heads
    return Rotary(
        base=base,
        base_from=base_from,
        rope_type=rope_type,
        factor=factor,
        partial_rotary_factor=partial if partial is not None else 1.0,
        head_dim=head_dim,
        neox=keys.rope_is_neox_style if keys.rope_is_neox_style is not None else True,
        dict_key=f"{w}{dict_key}",
        params=params,
        bases=bases,
        not_read=not_read,
        nested=list(nested) if one_rotary else [],
    )


def _scaling(rotary: Rotary) -> tuple[str, float | None]:
    return rotary.rope_type, rotary.factor


def _flat(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if not isinstance(v, dict) and k != "partial_rotary_factor"}


def _wanted_dict(draft: Rotary, target: Rotary | None, base: float) -> dict[str, Any]:
    """The dict to write in the draft's config: its own (or the target's scaling) with ``base``."""
    if target is None or _scaling(draft) == _scaling(target):
        out = _flat(draft.params)
        out.setdefault("rope_type", draft.rope_type)
    else:
        out = {k: v for k, v in _flat(target.params).items() if k != "type"}
        out["rope_type"] = target.rope_type
    out["rope_theta"] = base
    return out


def _fix_for(draft: Rotary, want: dict[str, Any] | None, keys: RopeKeys, partial: float | None) -> str:
    """The exact keys and values to write into the draft's config.json."""
    parts = []
    if want is not None:
        parts.append(f'"{draft.dict_key}" to {json.dumps(want, sort_keys=True)}')
        if not draft.dict_key.endswith("rope_scaling") and keys.rope_theta is not None and not _close(keys.rope_theta, want["rope_theta"]):
            parts.append(f'"{keys.where}rope_theta" to {want["rope_theta"]}')
    if partial is not None:
        parts.append(f'"{keys.where}partial_rotary_factor" to {partial} (at the top level of that config, where SGLang reads it)')
    fix = "in the draft's config.json set " + " and ".join(parts)
    if draft.dict_key.endswith("rope_scaling") and want is not None:
        fix += " (transformers 5 reads rope_scaling in place of rope_parameters when both are written)"
    if keys.stray:
        fix += "; " + ", ".join(keys.stray) + (" is" if len(keys.stray) == 1 else " are") + " not read and can go"
    return fix


def _not_read_text(rotary: Rotary, label: str) -> str:
    parts = [f"{path} = {json.dumps(value)}" for path, value in rotary.not_read.items()]
    return (
        f"{'; '.join(parts)} {'is' if len(parts) == 1 else 'are'} written where {label} does not read {'it' if len(parts) == 1 else 'them'}"
    )


def check_rope(draft_keys: RopeKeys, target_keys: RopeKeys | None, *, engine: str = "sglang", label: str = "SGLang") -> list[Finding]:
    """The draft's rotary against the target's (base, scaling type and factor), and values the
    draft's config writes where the engine does not read them (a base, a partial rotary factor).

    One ``rope_mismatch`` at most: an error when the draft's rotary differs from the target's,
    or when the draft falls back to a default beside a value written where the engine does
    not look; a warning when, with no target to compare, a read value and an unread one
    disagree (which one the draft was trained with is not known)."""
    draft = effective_rotary(draft_keys, engine=engine)
    evidence: dict[str, Any] = {"engine": engine, "draft_rope": draft.summary()}
    if draft.not_read:
        evidence["not_read"] = dict(draft.not_read)
    differs: list[str] = []
    want: dict[str, Any] | None = None
    lenient = False  # only a read base and an unread one disagreeing, no target to say which is right
    partial = next((_num(v) for p, v in draft.not_read.items() if p.endswith("partial_rotary_factor")), None)
    if target_keys is not None:
        target = effective_rotary(target_keys, one_rotary=False, engine=engine)
        evidence["target_rope"] = target.summary()
        base_ok = any(_close(draft.base, b) for b in target.bases)
        if not base_ok:
            shown = f"{target.bases[0]:g}" if len(target.bases) == 1 else str(target.bases)
            how = "its default" if draft.base_from == "default" else f"from {draft.base_from}"
            differs.append(f"base {draft.base:g} ({how}) where the target's is {shown}")
        if _scaling(draft) != _scaling(target):
            differs.append(
                f"scaling {draft.rope_type}" + (f" x{draft.factor:g}" if draft.factor else "")
                + f" where the target's is {target.rope_type}" + (f" x{target.factor:g}" if target.factor else "")
            )  # fmt: skip
        if differs:
            want = _wanted_dict(draft, target, draft.base if base_ok else target.bases[0])
    else:
        # No target: a base written where the engine does not read it, beside the one it reads.
        stated = [_num(v) for p, v in draft.not_read.items() if p.endswith("rope_theta")]
        other = next((v for v in stated if v is not None and not _close(v, draft.base)), None)
        if other is not None:
            how = "its default: the config gives no base where it reads one" if draft.base_from == "default" else f"from {draft.base_from}"
            differs.append(f"base {draft.base:g} ({how})")
            want = _wanted_dict(draft, None, other)
            lenient = draft.base_from != "default"
    if partial is not None:
        differs.append(f"partial_rotary_factor 1 (its default) where the config writes {partial:g} inside its rotary dict")
    if draft.nested and engine == "sglang":
        lenient = False
        differs.append(
            f"per-attention-type entries {draft.nested} inside {draft.dict_key}, which a Llama draft layer does not "
            "read; SGLang 0.5.23's get_rope hashes the dict's values for its cache and fails on them (TypeError: "
            "unhashable type: 'dict'), so the draft does not build"
        )
        if want is None:
            inner = next((_num(v) for p, v in draft.not_read.items() if p.endswith(".rope_theta") and p.count(".") >= 2), None)
            want = _wanted_dict(draft, None, inner if inner is not None else draft.base)
    if not differs:
        return []
    why = f"; {_not_read_text(draft, label)}" if draft.not_read else ""
    after = (
        ": every position is rotated with another phase than the target's (and than the draft was trained with, "
        "if it was trained beside this target)"
        if target_keys is not None
        else "; pass --target-config to compare with the target's"
    )
    message = f"{label} builds the draft's rotary embedding with {'; '.join(differs)}{why}{after}"
    fix = _fix_for(draft, want, draft_keys, partial)
    if target_keys is None and want is not None:
        fix += " (if that is the base the draft was trained with: the target's)"
    return [finding("rope_mismatch", message, severity="warning" if lenient else "error", module="config.json", evidence=evidence, fix=fix)]


# ------------------------------------------------------------------ the rotary the engine built
#
# At runtime the question is not what config.json says but what the engine built: the
# integrations read each model's rotary modules (integrations/core/rotary.py) and hand
# them here. A draft rotates like its target when one of the target's rotaries has the
# same base, scaling, style and rotated width, and the same cos/sin rows at the positions
# read. Whether the draft was trained with the target's is the trainer's business
# (:mod:`.rope_trained` decides); compared with the target alone, a difference is a lead.

# cos/sin values agree to this much when both rotaries are built alike (bfloat16 caches round).
COS_SIN_TOLERANCE = 1e-2


@dataclass
class LiveRotary:
    """One rotary module as the engine built it."""

    module: str  # its name in the model
    cls: str  # the engine's class (its scaling kind)
    base: float
    rope_type: str
    factor: float | None
    rotary_dim: int
    head_size: int | None
    neox: bool
    positions: list[int] = field(default_factory=list)  # the positions whose cos/sin rows were read
    cos_sin: list[list[float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "class": self.cls,
            "rope_theta": self.base,
            "rope_type": self.rope_type,
            "factor": self.factor,
            "rotary_dim": self.rotary_dim,
            "head_size": self.head_size,
            "is_neox_style": self.neox,
        }


def _style(neox: bool) -> str:
    return "NeoX (rotate halves)" if neox else "GPT-J (rotate interleaved pairs)"


def _partial(r: LiveRotary) -> float | None:
    return r.rotary_dim / r.head_size if r.head_size else None


def _cos_sin_gap(a: LiveRotary, b: LiveRotary) -> tuple[float, int] | None:
    """The largest cos/sin difference and its position, where both rows were read alike."""
    if not a.cos_sin or a.positions != b.positions or a.rotary_dim != b.rotary_dim:
        return None
    worst, at = 0.0, a.positions[0]
    for pos, ra, rb in zip(a.positions, a.cos_sin, b.cos_sin):
        if len(ra) != len(rb):
            return None
        gap = max((abs(x - y) for x, y in zip(ra, rb)), default=0.0)
        if gap > worst:
            worst, at = gap, pos
    return worst, at


def live_differences(draft: LiveRotary, target: LiveRotary) -> list[str]:
    """How ``draft`` rotates other than ``target`` (empty: alike)."""
    out: list[str] = []
    if not _close(draft.base, target.base):
        out.append(f"base {draft.base:g} where the target's is {target.base:g}")
    if (draft.rope_type, draft.factor) != (target.rope_type, target.factor) and not (
        draft.rope_type == target.rope_type and _close(draft.factor, target.factor)
    ):
        out.append(
            f"scaling {draft.rope_type}" + (f" x{draft.factor:g}" if draft.factor else "")
            + f" where the target's is {target.rope_type}" + (f" x{target.factor:g}" if target.factor else "")
        )  # fmt: skip
    if draft.neox != target.neox:
        out.append(f"{_style(draft.neox)} style where the target's is {_style(target.neox)}")
    pd, pt = _partial(draft), _partial(target)
    if pd is not None and pt is not None and not _close(pd, pt):
        out.append(
            f"{draft.rotary_dim} of {draft.head_size} head dims rotated where the target rotates {target.rotary_dim} of {target.head_size}"
        )
    if not out:
        gap = _cos_sin_gap(draft, target)
        if gap is not None and gap[0] > COS_SIN_TOLERANCE:
            out.append(f"cos/sin values {gap[0]:.3g} apart from the target's at position {gap[1]} (a scaling parameter differs)")
    return out


def _live_fix(draft: LiveRotary, target: LiveRotary, draft_keys: RopeKeys | None, target_keys: RopeKeys | None) -> str:
    """The keys to write into the draft's config.json: the config route when both configs are
    known (the exact dict, where the engine reads it), else the target's values as built."""
    where = draft_keys.where if draft_keys is not None else ""
    parts: list[str] = []
    if not _dict_unchanged(draft, target):
        if draft_keys is not None and target_keys is not None:
            config = effective_rotary(draft_keys)
            want = _wanted_dict(config, effective_rotary(target_keys, one_rotary=False), target.base)
            parts.append(_fix_for(config, want, draft_keys, None).removeprefix("in the draft's config.json set "))
        else:
            want = {"rope_theta": target.base, "rope_type": target.rope_type}
            if target.factor is not None:
                want["factor"] = target.factor
            extra = " with the other scaling keys of the target's config" if target.rope_type != "default" else ""
            parts.append(f'"{where}rope_parameters" to {json.dumps(want, sort_keys=True)}{extra}')
    if draft.neox != target.neox:
        parts.append(f'"{where}rope_is_neox_style" to {json.dumps(target.neox)}')
    pt = _partial(target)
    if pt is not None and not _close(_partial(draft), pt):
        parts.append(f'"{where}partial_rotary_factor" to {pt:g} (at the top level of that config, where the engine reads it)')
    return "in the draft's config.json set " + "; ".join(parts)


def _dict_unchanged(draft: LiveRotary, target: LiveRotary) -> bool:
    """True when the draft differs from the target only in what keys outside the rotary dict
    decide (style, rotated width): the dict itself needs no change."""
    return not any(d.startswith(("base ", "scaling ", "cos/sin ")) for d in live_differences(draft, target))


def check_live_rope(
    drafts: list[LiveRotary],
    targets: list[LiveRotary],
    *,
    draft_keys: RopeKeys | None = None,
    target_keys: RopeKeys | None = None,
    label: str = "SGLang",
    source: str = "",
) -> list[Finding]:
    """rope_mismatch from the rotaries the engine built: a draft rotary that rotates like none
    of the target's. ``draft_keys`` / ``target_keys`` (the configs, when known) say where the
    draft's base came from and make the fix the exact dict to write."""
    if not targets:
        return []
    out: list[Finding] = []
    for draft in drafts:
        if any(not live_differences(draft, t) for t in targets):
            continue
        target = min(targets, key=lambda t: len(live_differences(draft, t)))
        differs = live_differences(draft, target)
        evidence: dict[str, Any] = {
            "observed": "the engine's rotary modules",
            "draft_rope": draft.summary(),
            "target_rope": [t.summary() for t in targets],
        }
        from_config = ""
        if draft_keys is not None:
            config = effective_rotary(draft_keys)
            evidence["draft_config_rope"] = config.summary()
            if config.not_read:
                evidence["not_read"] = dict(config.not_read)
            if _close(config.base, draft.base):
                from_config = (
                    f" ({label}'s default: the config gives no base where {label} reads one)"
                    if config.base_from == "default"
                    else f" (read from {config.base_from})"
                )
            if config.not_read:
                from_config += f"; {_not_read_text(config, label)}"
        message = (
            f"{label} built the draft's rotary embedding ({draft.module}) with {'; '.join(differs)}{from_config}: "
            "every position is rotated with another phase than the target's; "
            "nothing fails, acceptance drops"
        )
        out.append(
            finding(
                "rope_mismatch",
                message,
                module="draft",
                evidence=evidence,
                fix=_live_fix(draft, target, draft_keys, target_keys),
                source=source,
            )
        )
    return out

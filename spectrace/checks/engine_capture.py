"""The layers the engine's target captures for this draft, against those it was trained on.

The ids the engine reads from the config, the capture rule its target applies and the
boundaries that yields, compared with every plausible reading of what the trainer meant.
Pure functions over facts (:mod:`spectrace.checks.facts`) and the engine models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..records import Capture, Finding
from ..rules.catalogue import finding
from ..rules.conventions import default_ids, engine_boundaries, sglang_capture_facts
from ..rules.engines import Engine
from ..rules.readings import IDS_KEY, Reading
from ..rules.readings import trained_readings as shared_readings
from .capture import aux_ids_fix, check_engine_support, ids_for_boundaries
from .facts import DraftConfigFile, TargetConfig
from .trainer import recognition, settled

# Names the trainers use for the same aux-id list, for messages.
TRAINER_MEANING = {
    "speculators": "speculators ids (id k = boundary k, 0 = embeddings)",
    "specforge": "SpecForge ids (id k = output of block k = boundary k+1)",
}


@dataclass(frozen=True)
class EngineCapture:
    ids: list[int] | None
    source: str
    rule: str
    boundaries: list[int] | None  # None: defaults on an unknown layer count
    dropped_ids: list[int]
    error: str | None
    releases: str = ""  # the engine releases this rule holds for, in words ("SGLang >= 0.5.22")

    @property
    def rule_named(self) -> str:
        """The rule with the releases it applies to: what a fix quotes."""
        return f"the {self.rule} rule" + (f" of {self.releases}" if self.releases else "")


def _sglang_defaults(n: int) -> list[int]:
    # set_eagle3_layers_to_capture(None) stores these as layers_to_capture directly: no +1.
    wanted = set(default_ids("sglang", n))
    return [b for b in range(n) if b in wanted]


def engine_capture(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> EngineCapture:
    """Which ids the engine reads from this config and the boundaries its target then captures."""
    ids, source = None, ""
    for src in engine.ids_sources:
        value = cfg.top_level_ids if src == "top_level" else cfg.eagle_config_ids
        if value:
            ids, source = value, ("top-level " if src == "top_level" else "eagle_config.") + IDS_KEY
            break
    arch = (target.architectures[0] if target and target.architectures else "") or (target.model_type if target else "")
    rule = engine.capture_rule(arch)
    releases = _rule_releases(engine, arch)
    n = target.num_hidden_layers if target else None
    if ids is None:
        return EngineCapture(None, "defaults [2, n//2, n-3]", rule, _sglang_defaults(n) if n else None, [], None, releases)
    # Without a target the layer count only decides what is dropped: assume enough layers.
    res = engine_boundaries(ids, rule, n if n else max(ids) + 2)
    return EngineCapture(ids, source, rule, res.boundaries, res.dropped_ids if n else [], res.error if n else None, releases)


def _rule_releases(engine: Engine, arch: str) -> str:
    """The SGLang releases whose capture facts for this target are the ones applied (``SGLANG_CAPTURE``)."""
    if engine.name != "sglang":
        return ""
    facts = sglang_capture_facts(arch or "LlamaForCausalLM", "0.5.0" if engine.version == "older" else engine.version)
    return f"SGLang {facts.span}" if facts is not None else ""


def trained_readings(cfg: DraftConfigFile, n: int | None) -> list[Reading]:
    """The boundaries the draft was trained on, most likely first (the runtime's rule)."""
    found = shared_readings(
        stated=cfg.stated,
        top_level_ids=cfg.top_level_ids,
        eagle_config_ids=cfg.eagle_config_ids,
        speculators_hints=bool(cfg.speculators_traces),
        num_layers=n,
    )
    # A known trainer leaves one reading: the ambiguity warning becomes an error or nothing.
    known = [r for r in found if cfg.trained_with is not None and r.convention == cfg.trained_with]
    # So does a layout that signs its trainer (SpecForge: midlayer.* and eagle_config).
    return known[:1] or settled(found, recognition(cfg))


def _describe(reading: Reading) -> str:
    if reading.ids is None:
        return f"the trainer's default boundaries {reading.boundaries}"
    if reading.convention not in TRAINER_MEANING:  # stated in config.json, no convention named
        return f"boundaries {reading.boundaries}, as config.json states"
    return f"{reading.ids} read as {TRAINER_MEANING[reading.convention]} = boundaries {reading.boundaries}"


def check_aux_layers(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Trained boundaries versus captured ones, under every plausible reading of the ids."""
    label = engine.label
    n = target.num_hidden_layers if target else None
    cap = engine_capture(cfg, engine, target)
    readings = trained_readings(cfg, n)
    out: list[Finding] = []
    ignored_top = bool(cfg.top_level_ids) and "top_level" not in engine.ids_sources
    engine_says = (
        f"{label} reads {cap.source} {cap.ids} and its target ({cap.rule} rule) captures boundaries {cap.boundaries}"
        if cap.ids is not None
        else f"{label} finds no ids in eagle_config, so its target captures its defaults [2, n//2, n-3]"
        + (f" = boundaries {cap.boundaries} (n={n})" if cap.boundaries is not None else "")
    )
    if ignored_top:
        fix_ids = ids_for_boundaries(readings[0].boundaries, cap.rule, n or max(readings[0].boundaries) + 2) if readings else None
        # The engine's defaults may capture the very boundaries the ids name (a conversion that kept the
        # ids at the top level): ignored, with nothing lost. Said, not an error.
        same = bool(readings) and cap.boundaries is not None and n is not None and readings[0].boundaries == cap.boundaries
        out.append(
            finding(
                "unsupported_config_flag",
                f"top-level {IDS_KEY} {cfg.top_level_ids} is ignored by {label}, which reads eagle_config only"
                + (
                    f"; its defaults capture the same boundaries {cap.boundaries}, so the draft gets the layers it was trained on"
                    if same
                    else ("" if n else "; pass --target-config to see which layers the target captures instead")
                ),
                severity="info" if same else None,
                module="config.json",
                evidence={"top_level_ids": cfg.top_level_ids, "eagle_config_ids": cfg.eagle_config_ids, "same_as_engine_capture": same},
                fix=f"put the ids in eagle_config.{IDS_KEY}" + (f" as {fix_ids} ({cap.rule_named})" if fix_ids is not None else ""),
            )
        )
    if cap.boundaries is None or not readings:
        return out
    matches = {r.convention: r.boundaries == cap.boundaries for r in readings}
    primary, others = readings[0], readings[1:]
    bad_alt = [r for r in others if not matches[r.convention]]
    if matches[primary.convention] and not bad_alt:
        return out
    if primary.ids is None and cap.ids is None and sorted(set(primary.boundaries)) == cap.boundaries:
        # Trainer and engine took the same defaults; the engine only collapsed a layer the
        # defaults name twice on a shallow target. One cause, reported once: short_capture.
        return out
    n_eff = n or max(max(primary.boundaries), max(cap.boundaries)) + 2
    fix_ids, fix = aux_ids_fix(primary.boundaries, cap.rule, n_eff, cap.rule_named)
    evidence: dict[str, Any] = {
        "engine_ids": cap.ids,
        "engine_ids_source": cap.source,
        "engine_rule": cap.rule,
        "engine_boundaries": cap.boundaries,
        "fix_ids": fix_ids,
        "readings": {r.convention: {"ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in readings},
        "target_layers": n,
    }
    tail = (
        " The widths match, so nothing fails loudly: only acceptance drops."
        if len(cap.boundaries) == len(primary.boundaries)
        else " See short_capture for the width."
    )
    if not matches[primary.convention]:
        alt = "".join(
            f" Read as {TRAINER_MEANING[r.convention]} they mean boundaries {r.boundaries}"
            + (", which the engine does capture." if matches[r.convention] else ", also not captured.")
            for r in others
        )
        message = f"trained on {_describe(primary)} ({primary.source}), but {engine_says}.{alt}{tail}"
        out.append(finding("aux_layers_mismatch", message, module="config.json", evidence=evidence, fix=fix))
    else:
        other = bad_alt[0]
        message = (
            f"the ids are ambiguous: {_describe(primary)} matches what {label} captures ({cap.boundaries}), but if "
            f"they were written for the other trainer ({_describe(other)}), the engine captures {cap.boundaries} "
            f"instead of {other.boundaries}. Check which trainer produced eagle_config.{IDS_KEY}."
        )
        alt_fix = ids_for_boundaries(other.boundaries, cap.rule, n_eff)
        out.append(
            finding(
                "aux_layers_mismatch",
                message,
                severity="warning",
                module="config.json",
                evidence=evidence,
                fix=(
                    f"if the draft was trained by {other.convention}, set eagle_config.{IDS_KEY} to {alt_fix}"
                    if alt_fix is not None
                    else fix
                ),
            )
        )
    return out


def check_short_capture(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Ids at or past the target's layer count (or colliding defaults) capture fewer chunks than trained."""
    if target is None:
        return []
    n = target.num_hidden_layers
    cap = engine_capture(cfg, engine, target)
    readings = trained_readings(cfg, n)
    want = len(readings[0].boundaries) if readings else 3
    out = []
    if cap.boundaries is not None and (len(cap.boundaries) < want or cap.dropped_ids):
        label = engine.label
        wide = f"the fused input is {len(cap.boundaries)} x hidden wide instead of {want} x hidden"
        evidence: dict[str, Any] = {"target_layers": n, "engine_ids": cap.ids, "engine_boundaries": cap.boundaries, "wanted": want}
        if cap.ids is None:
            # No ids anywhere the engine reads: its defaults name the same layer twice on a
            # target this shallow. No id was dropped, and none can be "moved below n".
            defaults = default_ids("sglang", n)
            message = (
                f"the target has {n} layers and {label} finds no ids in eagle_config, so it captures its defaults "
                f"[2, n//2, n-3] = {defaults}: only {len(cap.boundaries)} distinct boundaries {cap.boundaries} of {want}, "
                f"the same layer named twice on so shallow a target; {cap.error or wide}"
            )
            fix = (
                f"set eagle_config.{IDS_KEY} to the {want} distinct layers below {n} the draft was trained on, "
                "or serve it with the deeper target it was trained for"
            )
        elif cap.dropped_ids:
            message = (
                f"the target has {n} layers; {cap.source} {cap.ids} captures only {len(cap.boundaries)} distinct "
                f"boundaries {cap.boundaries} of {want}: ids {cap.dropped_ids} are past its last layer; "
                + (cap.error or f"{label}'s capture loop never reaches them and drops them silently; {wide}")
            )
            evidence["dropped_ids"] = cap.dropped_ids
            fix = "use layer ids below the target's layer count; the engine drops the others without a word"
        else:
            message = (
                f"the target has {n} layers; {cap.source} {cap.ids} names only {len(cap.boundaries)} distinct "
                f"boundaries {cap.boundaries} of {want}: {cap.error or wide}"
            )
            fix = f"give {want} distinct ids in eagle_config.{IDS_KEY}, below the target's layer count {n}"
        out.append(finding("short_capture", message, module="config.json", evidence=evidence, fix=fix))
    for r in readings[:1]:
        beyond = [b for b in r.boundaries if b > n]
        if beyond:
            out.append(
                finding(
                    "short_capture",
                    f"the draft was trained on boundaries {r.boundaries} but the target has only {n} layers "
                    f"(boundaries 0..{n}): {beyond} do not exist on this target; was the draft trained for another one?",
                    module="config.json",
                    evidence={"target_layers": n, "trained_boundaries": r.boundaries},
                )
            )
    return out


def check_capture_support(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Will this SGLang release crash on the capture list? The runtime check's table and finding.

    The capture the engine would make (ids it reads, its rule, the target's layer count) goes
    through ``checks.capture.check_engine_support``, the function the runtime join calls at
    ``set_eagle3_layers_to_capture``, so ``--engine sglang==V`` says what a live V would.
    Without --target-config the target is taken to be a Llama (the audit's default rule).
    """
    if engine.name != "sglang" or engine.version == "older":
        return []
    cap = engine_capture(cfg, engine, target)
    if cap.boundaries is None:
        return []
    arch = (target.architectures[0] if target and target.architectures else "") or (target.model_type if target else "")
    n = target.num_hidden_layers if target else 0
    capture = Capture(
        module="target", requested_ids=cap.ids, boundaries=cap.boundaries, num_layers=n,
        hidden_size=target.hidden_size if target else 0, rule=cap.rule,
    )  # fmt: skip
    found = check_engine_support(capture, engine.version, target_class=arch or "LlamaForCausalLM")
    for f in found:
        if not arch:
            f.evidence["target_class_assumed"] = "no --target-config: a Llama target assumed"
    return found

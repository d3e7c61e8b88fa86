"""Capture checks: is the target feeding the draft the layers it was trained on?

Compares the capture in effect (canonical boundaries, from a ``capture`` record) with
the draft config read under each plausible trainer convention.

    >>> check_capture(Capture(module="target", requested_ids=[2, 30, 58], boundaries=[3, 31, 59],
    ...               num_layers=61, hidden_size=7168, rule="sglang_deepseek_old"),
    ...               {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    [Finding(code='aux_layers_mismatch', ...)]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import Capture, Finding
from ..rules.catalogue import finding
from ..rules.conventions import (
    CONVENTIONS,
    SGLANG_DRAFT_FLAG_NAMES,
    SGLANG_DRAFT_READ,
    SGLangCaptureFacts,
    default_ids,
    engine_boundaries,
    first_sglang_capturing_embedding,
    first_sglang_implementing,
    sglang_draft_flag,
    sglang_family,
    sglang_family_facts,
    sglang_flag_applies,
    sglang_flag_everywhere,
    sglang_flag_value,
)
from ..rules.readings import IDS_KEY, is_eagle3_architecture, readings, trained_with, uses_aux_hidden_state
from .trainer import last_state_by_config


def _name(boundaries: list[int]) -> str:
    return "[" + ", ".join("embedding" if b == 0 else f"out(block {b - 1})" for b in boundaries) + "]"


def ids_for_boundaries(boundaries: list[int], rule: str, n: int) -> list[int] | None:
    """Ids that make the engine capture exactly ``boundaries`` under ``rule`` on an ``n``-layer
    target (None if its sorting forbids the order, or no ids reach them).

        >>> ids_for_boundaries([0, 2, 4], "sglang_llama", 6)
        [-1, 1, 3]
    """
    if rule not in CONVENTIONS:
        return None
    for cand in ([b - 1 for b in boundaries], list(boundaries)):
        if engine_boundaries(cand, rule, n).boundaries == boundaries:
            return cand
    return None


def aux_ids_fix(trained: list[int], rule: str, n: int, rule_named: str | None = None) -> tuple[list[int] | None, str]:
    """The ids to write so the target captures the ``trained`` boundaries, and the fix that says so.

    One computation for the audit and the runtime check: both quote the same ids.
    ``rule_named`` is how the fix names the rule (default ``the <rule> rule``).
    """
    named = rule_named or f"the {rule} rule"
    ids = ids_for_boundaries(trained, rule, n)
    if ids is not None:
        return ids, f"set eagle_config.{IDS_KEY} to {ids}: {named} maps them to the trained boundaries {trained}"
    if sorted(trained) != trained:
        return None, (
            "the engine captures layers in ascending order; retrain with sorted ids or permute fc.weight's input "
            f"column blocks to the order {sorted(trained)}"
        )
    return (
        None,
        f"no ids make the engine capture boundaries {trained} on this {n}-layer target; check that the draft was trained for this target",
    )


def _capture_fix(algorithm: str | None, use_aux: bool | None) -> str | None:
    """What turns aux capture on, as far as the facts say why it is off (None: the catalogue's both)."""
    parts = []
    if algorithm and algorithm.upper() != "EAGLE3":
        parts.append(f"launch with --speculative-algorithm EAGLE3 (not {algorithm})")
    if use_aux is False:
        parts.append("set eagle_config.use_aux_hidden_state=true in the draft's config.json")
    if not parts and use_aux is True and not algorithm:
        # The config asks for aux states and capture is still off: of the two switches,
        # the launch's algorithm is the one left (an EAGLE-3 draft served as EAGLE).
        parts.append(
            "launch with --speculative-algorithm EAGLE3: the draft's config already asks for aux states "
            "(use_aux_hidden_state true), so the algorithm left capture off"
        )
    return " and ".join(parts) or None


def check_capture(
    capture: Capture, config: Mapping[str, Any] | None, algorithm: str | None = None, engine_version: str | None = None
) -> list[Finding]:
    findings: list[Finding] = []
    config = config or {}
    eagle3 = is_eagle3_architecture(config) if config else True
    if not capture.enabled or not capture.boundaries:
        if config and (algorithm is None or algorithm.upper() == "EAGLE3") and last_state_by_config(config):
            return findings  # trained on the last hidden state: no aux capture is what it was trained with
        why = []
        if algorithm and algorithm.upper() != "EAGLE3":
            why.append(f"speculative algorithm is {algorithm}, not EAGLE3")
        if config and not uses_aux_hidden_state(config):
            why.append("eagle_config.use_aux_hidden_state is false")
        if eagle3:
            use_aux = uses_aux_hidden_state(config) if config else None
            findings.append(
                finding(
                    "aux_capture_disabled",
                    f"aux capture off in the target (enabled={capture.enabled}, boundaries {capture.boundaries}) for an EAGLE-3 draft"
                    + (f" asking ids {capture.requested_ids}" if capture.requested_ids else "")
                    + (f" ({'; '.join(why)})" if why else ""),
                    module=capture.module,
                    evidence={
                        "requested_ids": capture.requested_ids,
                        "algorithm": algorithm,
                        "enabled": capture.enabled,
                        "use_aux_hidden_state": use_aux,
                    },
                    fix=_capture_fix(algorithm, use_aux),
                    source="checks.capture",
                )
            )
        return findings
    options = readings(config, capture.num_layers) if config else []
    if capture.requested_ids is not None and len(capture.boundaries) < len(capture.requested_ids):
        dropped = _dropped_ids(capture)
        trained_ids, trained_fix = aux_ids_fix(options[0].boundaries, capture.rule, capture.num_layers) if options else (None, "")
        short_fix = (
            f"ids {dropped} are past the target's {capture.num_layers} layers and are dropped without a word; "
            if dropped
            else f"the {capture.rule} rule maps ids {capture.requested_ids} onto fewer distinct layers; "
        )
        short_fix += (
            trained_fix
            if trained_ids is not None
            else f"give {len(capture.requested_ids)} distinct ids that the {capture.rule} rule maps below {capture.num_layers}"
        )
        findings.append(
            finding(
                "short_capture",
                f"asked for {len(capture.requested_ids)} aux layers {capture.requested_ids}, the target captured "
                f"{len(capture.boundaries)} (boundaries {capture.boundaries}; it has {capture.num_layers} layers)",
                module=capture.module,
                evidence={
                    "requested_ids": capture.requested_ids,
                    "boundaries": capture.boundaries,
                    "num_layers": capture.num_layers,
                    "rule": capture.rule,
                    "dropped_ids": dropped,
                },
                fix=short_fix,
                source="checks.capture",
            )
        )
    if not options:
        return findings
    primary, alternates = options[0], options[1:]
    extra = capture.model_extra or {}
    rule_known = extra.get("rule_known", True) is not False
    # A target whose rule spectrace has not read: the boundaries were observed, not derived.
    under = (
        f"under {capture.rule}"
        if rule_known
        else f"(rule unknown for {extra.get('target_class') or 'this target'}; observed boundaries {capture.boundaries})"
    )
    trainer = trained_with(config)
    if trainer is not None:
        # The trainer is known: one reading, no "SpecForge or speculators?" warning.
        primary = next((r for r in options if r.convention == trainer), primary)
        alternates = []
    evidence = {
        "captured_boundaries": capture.boundaries,
        "engine_rule": capture.rule if rule_known else "unknown",
        "requested_ids": capture.requested_ids,
        "trained_with": trainer,
        "readings": {r.convention: {"ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in options},
    }
    if primary.boundaries != capture.boundaries:
        agreeing = [r.convention for r in alternates if r.boundaries == capture.boundaries]
        note = f"; under the {agreeing[0]} reading they agree" if agreeing else ""
        fix_ids, fix = aux_ids_fix(primary.boundaries, capture.rule, capture.num_layers)
        if fix_ids is not None:
            fix += _release_caveat(capture, primary.boundaries, engine_version)
            if not rule_known:
                fix += " (the +1 rule most SGLang targets apply; the rule of this target is unknown, so confirm the observed boundaries after the change)"
        findings.append(
            finding(
                "aux_layers_mismatch",
                f"trained on boundaries {primary.boundaries} {_name(primary.boundaries)} ({primary.convention} reading of "
                f"{primary.source} ids {primary.ids}), target captures {capture.boundaries} {_name(capture.boundaries)} "
                f"{under}{note}",
                module=capture.module,
                evidence={**evidence, "fix_ids": fix_ids},
                fix=fix,
                source="checks.capture",
            )
        )
    else:
        for alt in alternates:
            if alt.boundaries != capture.boundaries:
                alt_ids = ids_for_boundaries(alt.boundaries, capture.rule, capture.num_layers)
                findings.append(
                    finding(
                        "aux_layers_mismatch",
                        f"captured {capture.boundaries} matches the {primary.convention} reading of ids {primary.ids}; "
                        f"if the draft was trained with {alt.convention}, it expects {alt.boundaries} {_name(alt.boundaries)} "
                        "and every chunk is off by one",
                        module=capture.module,
                        evidence={**evidence, "fix_ids": alt_ids},
                        severity="warning",
                        fix=f"confirm which trainer wrote the draft; if {alt.convention}, set eagle_config.{IDS_KEY} to "
                        + (
                            f"{alt_ids}, which the {capture.rule} rule captures as {alt.boundaries}"
                            if alt_ids is not None
                            else f"ids the {capture.rule} rule captures as {alt.boundaries}"
                        ),
                        source="checks.capture",
                    )
                )
                break
    return findings


def _release_caveat(capture: Capture, boundaries: list[int], version: str | None) -> str:
    """What the fix's ids would meet on this release: a Llama target before 0.5.22 cannot
    capture the embedding (boundary 0) and crashes at the first forward, so ids that ask for
    it are no fix there on their own (capture_unsupported says why)."""
    extra = capture.model_extra or {}
    version = version or extra.get("engine_version")
    target_class = extra.get("target_class") or ""
    family = extra.get("target_family") or (sglang_family(target_class) if target_class else None)
    if 0 not in boundaries or not version or family is None:
        return ""
    facts = sglang_family_facts(family, version)
    if facts is None or facts.embedding != "crash":
        return ""
    since = first_sglang_capturing_embedding(facts.family)
    return f"; but SGLang {version} cannot capture the embedding those ids ask for (capture_unsupported): " + _embedding_fix(
        "SGLang", since, facts, capture.num_layers
    )


def _dropped_ids(capture: Capture) -> list[int]:
    """The requested ids the engine's capture loop never reaches (the rule says which)."""
    if capture.requested_ids is None or capture.rule not in CONVENTIONS:
        return []
    return list(engine_boundaries(capture.requested_ids, capture.rule, capture.num_layers).dropped_ids)


def check_algorithm(algorithm: str | None, config: Mapping[str, Any]) -> list[Finding]:
    if not algorithm or not config or not is_eagle3_architecture(config):
        return []
    if algorithm.upper() == "EAGLE3":
        return []
    return [
        finding(
            "algorithm_mismatch",
            f"the draft is an EAGLE-3 architecture ({', '.join(map(str, config.get('architectures') or ['eagle3']))}) "
            f"served under --speculative-algorithm {algorithm}",
            evidence={"algorithm": algorithm, "architectures": config.get("architectures")},
            fix=f"launch with --speculative-algorithm EAGLE3 (not {algorithm}) for this EAGLE-3 draft "
            f"({', '.join(map(str, config.get('architectures') or ['eagle3']))})",
            source="checks.capture",
        )
    ]


def check_config_flags(config: Mapping[str, Any], engine: str = "sglang", version: str | None = None) -> list[Finding]:
    """Training flags the draft config sets that this SGLang release's draft class does not implement.

    Reads :data:`spectrace.rules.conventions.SGLANG_DRAFT_FLAGS`, the table the audit reads
    (``spectrace audit --engine sglang==V``), with the flag looked up where the release looks
    (``eagle_config.norm_before_fc`` before the top level, ``use_aux_norm`` for ``fc_norm``).
    ``version`` None (the release is not known): only the flags every release read ignores.
    Other engines: nothing (the table is SGLang's).
    """
    if engine.lower() != "sglang":
        return []
    tlc = config.get("transformer_layer_config")
    view: Mapping[str, Any] = {**tlc, **config} if isinstance(tlc, Mapping) else config
    label = f"SGLang {version}" if version else f"SGLang (every release read, {SGLANG_DRAFT_READ[0]} to {SGLANG_DRAFT_READ[-1]})"
    findings: list[Finding] = []
    for flag in SGLANG_DRAFT_FLAG_NAMES:
        if version is None and sglang_flag_everywhere(flag) != "ignored":
            continue  # whether it is honoured depends on the release
        row = sglang_draft_flag(flag, version)
        if row is None or row.support == "implemented" or not sglang_flag_value(row, view):
            continue
        head_from_target = view.get("draft_vocab_size") is None and not view.get("tie_word_embeddings")
        if row.support == "ignored" and not sglang_flag_applies(
            row, view.get("hidden_size"), view.get("target_hidden_size"), head_from_target=head_from_target
        ):
            continue
        value = next((view[k] for k in row.keys if k in view), True)
        evidence = {
            "flag": flag, "value": value, "engine": "sglang", "engine_version": version, "releases": row.span,
            "read_in": list(row.read_in),
        }  # fmt: skip
        since = first_sglang_implementing(flag)
        if row.support == "unknown":
            findings.append(
                finding(
                    "unsupported_config_flag",
                    f"the draft config sets {flag}=true; {label}'s draft class was not read, so whether it "
                    f"implements the flag is not known ({row.how}). If it ignores it: {row.effect}",
                    severity="warning",
                    module=f"config.json:{flag}",
                    evidence=evidence,
                    fix=f"read {label}'s draft class for {flag} ({row.how}); if it ignores it, retrain with {flag}=false"
                    + (f" or serve with SGLang {since} or newer, which implements it" if since else ""),
                    source="checks.capture",
                )
            )
            continue
        unread = "" if version is None or row.read(version) else f"; {version} itself was not read"
        findings.append(
            finding(
                "unsupported_config_flag",
                f"the draft config sets {flag}=true; {label} ignores it: {row.effect} ({row.how}{unread})",
                severity=row.severity,  # type: ignore[arg-type]
                module=f"config.json:{flag}",
                evidence=evidence,
                fix=f"retrain with {flag}=false" + (f", or serve with SGLang {since} or newer, which implements it" if since else ""),
                source="checks.capture",
            )
        )
    return findings


def check_engine_support(
    capture: Capture,
    version: str | None,
    *,
    target_class: str | None = None,
    family: str | None = None,
    module: str | None = "target",
    engine: str = "SGLang",
) -> list[Finding]:
    """Can this SGLang release capture what ``capture`` asks for, or will it crash?

    Reads :data:`spectrace.rules.conventions.SGLANG_CAPTURE` (one table for the runtime
    check and the audit). ``capture`` needs its boundaries, requested ids, layer count and
    rule; ``target_class`` / ``family`` default to ``capture.target_class`` (a record's
    extra field) and the family of that name. Says nothing when the version or the
    family is unknown, or capture is off.

        >>> check_engine_support(Capture(module="target", requested_ids=[-1, 1, 3], boundaries=[0, 2, 4],
        ...     num_layers=6, hidden_size=64, rule="sglang_llama"), "0.5.17", target_class="LlamaForCausalLM")
        [Finding(code='capture_unsupported', ...)]
    """
    extra = capture.model_extra or {}
    target_class = target_class or extra.get("target_class") or ""
    family = family or extra.get("target_family") or (sglang_family(target_class) if target_class else None)
    if not version or not capture.enabled or not capture.boundaries:
        return []
    facts = sglang_family_facts(family, version)
    if facts is None:
        return []
    out: list[Finding] = []
    asked = f"ids {capture.requested_ids}" if capture.requested_ids is not None else "SGLang's default ids"
    evidence = {
        "engine": engine.lower(),
        "engine_version": version,
        "target_class": target_class,
        "target_family": facts.family,
        "requested_ids": capture.requested_ids,
        "boundaries": capture.boundaries,
        "rule": capture.rule,
        "releases": facts.span,
        "read_in": list(facts.read_in),
    }
    if 0 in capture.boundaries and facts.embedding in ("crash", "unknown"):
        since = first_sglang_capturing_embedding(facts.family)
        evidence.update(kind="embedding", supported_since=since)
        fix = _embedding_fix(engine, since, facts, capture.num_layers)
        if facts.embedding == "crash":
            out.append(
                finding(
                    "capture_unsupported",
                    f"{engine} {version}'s {target_class} cannot capture the embedding output the draft asks for "
                    f"({asked} -> boundaries {capture.boundaries} under the {capture.rule} rule; boundary 0 is "
                    f"the embedding, asked for by id {facts.embedding_ids}): {facts.embedding_how}",
                    module=module,
                    evidence=evidence,
                    fix=fix,
                    source="checks.capture",
                )
            )
        else:
            out.append(
                finding(
                    "capture_unsupported",
                    f"{engine} {version}'s {target_class} is asked to capture the embedding output ({asked} -> "
                    f"boundaries {capture.boundaries}); whether this release can is not known to spectrace: "
                    f"{facts.embedding_how}",
                    module=module,
                    evidence=evidence,
                    severity="warning",
                    fix=f"read {_FORWARD.get(facts.family, 'the target forward')} of this release (what it captures "
                    "before layer 0) before launch; " + fix,
                    source="checks.capture",
                )
            )
    requested = capture.requested_ids
    if facts.short == "raises" and requested is not None and len(capture.boundaries) < len(requested):
        evidence = {**evidence, "kind": "short"}
        out.append(
            finding(
                "capture_unsupported",
                f"{engine} {version}'s {target_class} reaches {len(capture.boundaries)} of the {len(requested)} "
                f"layers asked for ({asked} -> boundaries {capture.boundaries} under the {capture.rule} rule; it "
                f"has {capture.num_layers} layers) and then crashes: {facts.short_how}",
                module=module,
                evidence=evidence,
                fix=f"write ids that the {capture.rule} rule maps inside [0, {capture.num_layers}) (under it the "
                f"embedding is asked for by {facts.embedding_ids}); see short_capture for the layers reached",
                source="checks.capture",
            )
        )
    return out


_FORWARD = {
    "llama": "models/llama.py::LlamaModel.forward (`hidden_states + residual` at layer 0 crashes)",
    "deepseek": "models/deepseek_v2.py::DeepseekV2Model.forward",
}


def _embedding_fix(engine: str, since: str | None, facts: SGLangCaptureFacts, num_layers: int) -> str:
    name = {"llama": "Llama", "deepseek": "DeepSeek"}.get(facts.family, facts.family)
    newer = f"serve with {engine} {since} or newer (its {name} target captures the embedding)" if since else ""
    ids = default_ids("specforge", num_layers)
    distinct = num_layers > 0 and len(set(ids)) == len(ids) and min(ids) >= 0
    example = f" (e.g. SpecForge's defaults {ids} for {num_layers} layers)" if distinct else ""
    retrain = (
        f"retrain the draft on layers without the embedding{example}: rewriting the ids alone does not help, "
        "the draft was trained on the embedding chunk"
    )
    return f"{newer}, or {retrain}" if newer else retrain

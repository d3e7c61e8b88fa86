"""Capture checks: is the target feeding the draft the layers it was trained on?

Compares the capture in effect (canonical boundaries, from a ``capture`` record) with
the draft config read under each plausible trainer convention.

    >>> check_capture(Capture(module="target", requested_ids=[2, 30, 58], boundaries=[3, 31, 59],
    ...               num_layers=61, hidden_size=7168, rule="sglang_deepseek_old"),
    ...               {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    [Finding(code='aux_layers_mismatch', ...)]
"""

from __future__ import annotations

from typing import Any, Mapping

from ..eagle3.draft_config import is_eagle3_architecture, readings, uses_aux_hidden_state
from ..findings import finding
from ..records import Capture, Finding


def _name(boundaries: list[int]) -> str:
    return "[" + ", ".join("embedding" if b == 0 else f"out(block {b - 1})" for b in boundaries) + "]"


def check_capture(capture: Capture, config: Mapping[str, Any] | None, algorithm: str | None = None) -> list[Finding]:
    findings: list[Finding] = []
    config = config or {}
    eagle3 = is_eagle3_architecture(config) if config else True
    if not capture.enabled or not capture.boundaries:
        why = []
        if algorithm and algorithm.upper() != "EAGLE3":
            why.append(f"speculative algorithm is {algorithm}, not EAGLE3")
        if config and not uses_aux_hidden_state(config):
            why.append("eagle_config.use_aux_hidden_state is false")
        if eagle3:
            findings.append(
                finding(
                    "aux_capture_disabled",
                    "the target captures no aux hidden states for an EAGLE-3 draft"
                    + (f" ({'; '.join(why)})" if why else ""),
                    module=capture.module,
                    evidence={"requested_ids": capture.requested_ids, "algorithm": algorithm, "enabled": capture.enabled},
                    source="checks.capture",
                )
            )
        return findings
    if capture.requested_ids is not None and len(capture.boundaries) < len(capture.requested_ids):
        findings.append(
            finding(
                "short_capture",
                f"asked for {len(capture.requested_ids)} aux layers {capture.requested_ids}, the target captured "
                f"{len(capture.boundaries)} (boundaries {capture.boundaries}; it has {capture.num_layers} layers)",
                module=capture.module,
                evidence={"requested_ids": capture.requested_ids, "boundaries": capture.boundaries, "num_layers": capture.num_layers, "rule": capture.rule},
                source="checks.capture",
            )
        )
    if not config:
        return findings
    options = readings(config, capture.num_layers)
    primary, alternates = options[0], options[1:]
    evidence = {
        "captured_boundaries": capture.boundaries,
        "engine_rule": capture.rule,
        "requested_ids": capture.requested_ids,
        "readings": {r.convention: {"ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in options},
    }
    if primary.boundaries != capture.boundaries:
        agreeing = [r.convention for r in alternates if r.boundaries == capture.boundaries]
        note = f"; under the {agreeing[0]} reading they agree" if agreeing else ""
        findings.append(
            finding(
                "aux_layers_mismatch",
                f"trained on boundaries {primary.boundaries} {_name(primary.boundaries)} ({primary.convention} reading of "
                f"{primary.source} ids {primary.ids}), target captures {capture.boundaries} {_name(capture.boundaries)} "
                f"under {capture.rule}{note}",
                module=capture.module,
                evidence=evidence,
                source="checks.capture",
            )
        )
    else:
        for alt in alternates:
            if alt.boundaries != capture.boundaries:
                findings.append(
                    finding(
                        "aux_layers_mismatch",
                        f"captured {capture.boundaries} matches the {primary.convention} reading of ids {primary.ids}; "
                        f"if the draft was trained with {alt.convention}, it expects {alt.boundaries} {_name(alt.boundaries)} "
                        "and every chunk is off by one",
                        module=capture.module,
                        evidence=evidence,
                        severity="warning",
                        fix=f"confirm which trainer wrote the draft; for {alt.convention} write ids so the engine captures {alt.boundaries}",
                        source="checks.capture",
                    )
                )
                break
    return findings


def check_algorithm(algorithm: str | None, config: Mapping[str, Any]) -> list[Finding]:
    if not algorithm or not config or not is_eagle3_architecture(config):
        return []
    if algorithm.upper() == "EAGLE3":
        return []
    return [
        finding(
            "algorithm_mismatch",
            f"the draft is an EAGLE-3 architecture ({', '.join(map(str, config.get('architectures') or ['eagle3']))}) "
            f"but the speculative algorithm is {algorithm}: the target captures no aux states",
            evidence={"algorithm": algorithm, "architectures": config.get("architectures")},
            source="checks.capture",
        )
    ]


def check_config_flags(config: Mapping[str, Any], engine: str = "sglang") -> list[Finding]:
    """Flags the draft was trained with that the engine does not implement."""
    findings: list[Finding] = []
    tlc = config.get("transformer_layer_config") or {}
    for flag in ("norm_before_residual",):
        value = config.get(flag, tlc.get(flag) if isinstance(tlc, Mapping) else None)
        if value:
            findings.append(
                finding(
                    "unsupported_config_flag",
                    f"the draft config sets {flag}=true; {engine} ignores it, so the decoder layer runs a different residual path than in training",
                    module=f"config.json:{flag}",
                    evidence={"flag": flag, "value": value, "engine": engine},
                    source="checks.capture",
                )
            )
    return findings

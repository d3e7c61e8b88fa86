"""vLLM's EAGLE-3 findings: the shared codes, with the causes and fixes vLLM's own code gives.

Facts come from the runtime hooks (``integrations/vllm``) or the audit; the rules are
:mod:`spectrace.rules.vllm`. Each function returns findings and never raises on odd input.

    >>> [f.code for f in check_vllm_runner_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}},
    ...                                         "mrv2", captured=[1, 2], num_layers=4)]
    ['aux_layers_mismatch']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import Capture, Finding, Weights
from ..rules.catalogue import finding
from ..rules.readings import readings
from ..rules.vllm import (
    D2T_PARAM,
    IDS_KEY,
    RUNNER_NAMES,
    default_ids,
    ignored_nested_ids,
    unread_flags,
    uses_aux_hidden_state,
    vllm_boundaries,
    vllm_release,
)
from .capture import check_capture
from .weights import check_weights

SOURCE = "checks.vllm"


def _bias_names(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".bias")]


def check_vllm_weights(record: Weights, draft_class: str = "Eagle3LlamaForCausalLM") -> list[Finding]:
    """weights_missing / weights_dropped of a vLLM draft load, with vLLM's fixes.

    ``record.missing`` holds vLLM's parameter names (``draft_id_to_target_id``,
    ``model.fc.weight``); ``record.ignored`` the checkpoint names no parameter took.
    """
    out: list[Finding] = []
    for found in check_weights(record):
        names = list(found.evidence.get("missing") or found.evidence.get("dropped") or [])
        parts: list[str] = []
        if found.code == "weights_missing":
            if D2T_PARAM in names:
                parts.append(
                    f"the checkpoint has no d2t, so {draft_class}.{D2T_PARAM} stays all zeros and every draft id is "
                    "proposed as the same target id: save the trainer's d2t (int64, draft_vocab_size entries, "
                    "target_id - draft_id) with the checkpoint, or drop draft_vocab_size if the draft uses the full vocabulary"
                )
            if any(n.endswith("fc.weight") for n in names):
                parts.append(
                    "the checkpoint has no fc.weight, so vLLM leaves the fc that fuses the target's aux states "
                    "uninitialised (vLLM does not raise on it): add the trained fc.weight under the name 'fc.weight'"
                )
        elif found.code == "weights_dropped":
            biases = _bias_names(names)
            if biases:
                parts.append(
                    f"vLLM's AutoWeightsLoader ignores unexpected '.bias' tensors without a word ({', '.join(biases[:6])}); "
                    f"{draft_class} builds its fc and projections with bias=False, so the draft serves without the trained "
                    "biases: retrain with bias=False, or fold the bias away before serving"
                )
        update: dict[str, Any] = {"source": SOURCE}
        if parts and not found.evidence.get("rename_map"):
            update["fix"] = "; ".join(parts)
        out.append(found.model_copy(update=update))
    return out


def check_vllm_runner_ids(
    config: Mapping[str, Any], runner: str, *, captured: list[int] | None, num_layers: int, module: str | None = "target"
) -> list[Finding]:
    """aux_layers_mismatch: the runner did not read the ids the draft config nests in eagle_config."""
    nested = ignored_nested_ids(config, runner)
    if nested is None:
        return []
    options = readings(config, num_layers)
    trained = options[0].boundaries if options else vllm_boundaries(nested, num_layers)
    defaults = default_ids(num_layers)
    got = captured if captured is not None else vllm_boundaries(defaults, num_layers)
    if got == trained:
        return []
    name = RUNNER_NAMES.get(runner, runner)
    convention = f" ({options[0].convention} reading)" if options else ""
    return [
        finding(
            "aux_layers_mismatch",
            f"the draft config nests its ids in eagle_config.{IDS_KEY} {nested}, which {name} does not read: the "
            f"target captures its defaults {tuple(defaults)} = boundaries {got} instead of the trained boundaries "
            f"{trained}{convention}; vLLM logs this fallback at info level only",
            module=module,
            evidence={
                "runner": runner,
                "nested_ids": nested,
                "default_ids": defaults,
                "captured_boundaries": got,
                "trained_boundaries": trained,
                "num_layers": num_layers,
            },
            fix=f"write {IDS_KEY}: {trained} at the top level of the draft's config.json (vLLM's convention: id k = "
            f"boundary k, 0 = the embedding; both runners read it), or serve with VLLM_USE_V2_MODEL_RUNNER=0, whose "
            "V1 runner reads eagle_config but takes its ids literally",
            source=SOURCE,
        )
    ]


def check_vllm_fc_bypass(
    config: Mapping[str, Any], *, module: str | None = "draft", version: str | None = None, runner: str | None = None
) -> list[Finding]:
    """fc_bypass: ``use_aux_hidden_state`` false makes vLLM build no fc and feed the draft raw states.

    With ``version`` and ``runner`` "mrv2" given, a release whose Model Runner V2 does not read
    the flag (before 0.33.0, vllm#40551) is said too: its target still returns aux states."""
    if uses_aux_hidden_state(config):
        return []
    message = (
        "the draft config sets eagle_config.use_aux_hidden_state=false: vLLM builds the EAGLE-3 draft without fc, "
        "drops fc.weight from the checkpoint, and combine_hidden_states hands the target's last hidden state to "
        "the draft unfused"
    )
    evidence: dict[str, Any] = {"use_aux_hidden_state": False}
    if version is not None and runner == "mrv2":
        reads = vllm_release(version).mrv2_reads_use_aux
        evidence["runner_reads_flag"] = reads
        if not reads:
            message += (
                f"; Model Runner V2 of vLLM {version} does not read the flag and still makes the target return its "
                "aux hidden states, which the draft, built without fc, was not made for (read from 0.33.0 on)"
            )
    return [
        finding(
            "fc_bypass",
            message,
            module=module,
            evidence=evidence,
            fix="set eagle_config.use_aux_hidden_state=true for an EAGLE-3 draft trained on fused aux states "
            "(remove the key: vLLM's default is true)",
            source=SOURCE,
        )
    ]


def check_vllm_class_flags(config: Mapping[str, Any], draft_class: str, *, module: str | None = "config.json") -> list[Finding]:
    """unsupported_config_flag: a training flag the config sets that ``draft_class`` never reads
    (e.g. ``norm_before_fc`` on ``Eagle3DeepseekV2ForCausalLM``), so the draft computes other
    than it was trained to, without a word."""
    out: list[Finding] = []
    for flag in unread_flags(config, draft_class):
        value = "false" if flag == "use_aux_hidden_state" else "true"
        where = "eagle_config." if flag == "use_aux_hidden_state" else ""
        out.append(
            finding(
                "unsupported_config_flag",
                f"{where}{flag}={value} is not read by vLLM's {draft_class}: the draft runs as if it were "
                f"{'true' if value == 'false' else 'false'}, other than it was trained",
                module=module,
                evidence={"flag": flag, "draft_class": draft_class},
                fix=f"retrain without {flag}, or serve with a draft class that reads it (Eagle3LlamaForCausalLM "
                "reads norm_before_residual, norm_before_fc, fc_norm, norm_output and use_aux_hidden_state)",
                source=SOURCE,
            )
        )
    return out


def check_vllm_fc_width(seen_width: int, fc_in_features: int, *, module: str | None = "draft.model.fc") -> list[Finding]:
    """fc_bypass: the fc input is not as wide as fc expects (the target captured other layers)."""
    if seen_width == fc_in_features:
        return []
    return [
        finding(
            "fc_bypass",
            f"the draft's fc received {seen_width}-wide hidden states but expects {fc_in_features} "
            "(num_aux_hidden_states x target hidden size): the target did not capture the layers fc was built for",
            module=module,
            evidence={"seen_width": seen_width, "fc_in_features": fc_in_features},
            fix=f"make the target's aux states add up to {fc_in_features} wide ({seen_width} now): one distinct top-level "
            f"{IDS_KEY} entry per aux state the draft was trained on, each between 0 (the embedding) and the target's "
            "layer count",
            source=SOURCE,
        )
    ]


def check_vllm_aux_count(asked: list[int], returned: int, num_layers: int, *, module: str | None = "target") -> list[Finding]:
    """short_capture: the target's forward returned fewer aux states than it was asked for."""
    if returned >= len(asked):
        return []
    reach = vllm_boundaries(asked, num_layers)
    return [
        finding(
            "short_capture",
            f"the target was asked for aux layers {asked} and its forward returned {returned} aux hidden states "
            f"(it has {num_layers} layers; vLLM reaches ids 0..{num_layers} and drops the others without a word)",
            module=module,
            evidence={"requested_ids": asked, "returned": returned, "num_layers": num_layers, "reachable": reach},
            fix=f"use ids between 0 (the embedding) and {num_layers} (the last layer's output), one per aux state",
            source=SOURCE,
        )
    ]


def check_vllm_capture(capture: Capture, config: Mapping[str, Any] | None, runner: str | None = None) -> list[Finding]:
    """The capture in effect against the draft config, with vLLM's fixes.

    ``capture.boundaries`` are what the target captures (vLLM: id = boundary). A runner that
    ignored nested ids gets :func:`check_vllm_runner_ids` instead of the generic mismatch.
    """
    config = config or {}
    ignored = bool(config) and runner is not None and ignored_nested_ids(config, runner) is not None
    out: list[Finding] = []
    if ignored:
        out += check_vllm_runner_ids(config, runner or "", captured=list(capture.boundaries), num_layers=capture.num_layers)
    for found in check_capture(capture, config or None):
        if found.code == "aux_layers_mismatch" and ignored:
            continue  # said above, with the runner as the cause
        update: dict[str, Any] = {"source": SOURCE}
        if found.code == "short_capture":
            update["fix"] = (
                f"use distinct ids between 0 (the embedding) and {capture.num_layers} (the last layer's output): "
                "vLLM captures each id once and drops the others without a word"
            )
        elif found.code == "aux_layers_mismatch":
            trained = found.evidence.get("readings", {})
            first = next(iter(trained.values()), None) if isinstance(trained, dict) else None
            if first and first.get("boundaries"):
                update["fix"] = (
                    f"write {IDS_KEY}: {first['boundaries']} at the top level of the draft's config.json: vLLM takes ids "
                    "literally (id k = boundary k, 0 = the embedding), while SpecForge's id k means the output of block k "
                    "(boundary k+1)"
                )
        out.append(found.model_copy(update=update))
    return out

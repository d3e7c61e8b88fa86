"""draft_class_mismatch: the draft class SGLang builds for the checkpoint's ``architectures``
is not the draft it should be. Two directions: an EAGLE-3 checkpoint built as a NextN/MTP
or EAGLE-1 class (:func:`check_draft_class`, :func:`check_built_draft_class`), and a draft
checkpoint whose architectures name a target class SGLang does not rename to its NextN/MTP
head, so the draft worker builds the FULL target model (sglang#20809: a DeepSeek-V3.2 MTP
checkpoint, ``DeepseekV32ForCausalLM``, before SGLang renamed it;
:func:`check_draft_built_as_target`). The rules are :mod:`spectrace.rules.draft_classes`."""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.draft_classes import (
    EAGLE3_CLASSES,
    EAGLE_CLASSES,
    NEXTN_CLASSES,
    SGLANG_CLASSES_READ,
    WHOLE_MODEL_DRAFTS,
    ModelSize,
    built_class,
    target_sized,
)

FC_NAMES = ("fc.weight", "model.fc.weight")


def is_eagle3_checkpoint(tensor_names: Iterable[str], has_aux_ids: bool) -> bool:
    """An fc over aux states, or aux-layer ids in the config: what only an EAGLE-3 draft has."""
    return has_aux_ids or any(name in FC_NAMES for name in tensor_names)


def check_draft_class(
    architectures: list[str],
    tensor_names: Iterable[str],
    has_aux_ids: bool,
    *,
    target_architectures: list[str] | None = None,
    layers: int | None = None,
    target_layers: int | None = None,
) -> list[Finding]:
    """An EAGLE-3 checkpoint whose ``architectures`` make SGLang build a NextN/MTP or EAGLE-1
    class; or (with the target's config) a draft whose architectures make it build the
    target's own class with as many layers: the full model."""
    built, kind = built_class(architectures)
    if kind == "unknown" and built and target_architectures and built == target_architectures[0]:
        if layers is not None and target_layers is not None and target_layers > 1 and layers >= target_layers:
            return [
                finding(
                    "draft_class_mismatch",
                    f"the draft's architectures {architectures} make SGLang {SGLANG_CLASSES_READ} build {built}, the "
                    f"target's own class, with {layers} decoder layers like the target's {target_layers}: the full "
                    "target model, not a draft (SGLang renames only some target classes to their NextN/MTP head)",
                    module="config.json",
                    evidence={"architectures": list(architectures), "built_class": built, "class_kind": "target", "target_class": built},
                    fix="set the draft's architectures to its draft class: its NextN/MTP head for an MTP checkpoint, "
                    "LlamaForCausalLMEagle3 for an EAGLE-3 draft",
                )
            ]
    if kind in ("eagle3", "unknown") or not is_eagle3_checkpoint(tensor_names, has_aux_ids):
        return []
    what = {"nextn": "a multi-token-prediction (NextN/MTP) head", "eagle": "an EAGLE-1 draft"}[kind]
    renamed = f" (SGLang renames a draft's {architectures[0]} to it)" if built != architectures[0] else ""
    return [
        finding(
            "draft_class_mismatch",
            f"the checkpoint is an EAGLE-3 draft (fc over the target's aux states), but its architectures "
            f"{architectures} make SGLang {SGLANG_CLASSES_READ} build {built}{renamed}, {what}: its fc and aux "
            "states are not what that class loads or runs",
            module="config.json",
            evidence={"architectures": list(architectures), "built_class": built, "class_kind": kind},
            fix=f'set architectures to ["LlamaForCausalLMEagle3"] (or Eagle3DeepseekV2ForCausalLM for a DeepSeek-layer '
            f"draft; the EAGLE-3 classes are {', '.join(sorted(EAGLE3_CLASSES))}) and launch with "
            "--speculative-algorithm EAGLE3 (NEXTN is an alias of EAGLE, which captures no aux states)",
        )
    ]


def built_kind(built: str) -> str:
    """The kind of a class an engine really built (no rename: the name is the class's own)."""
    if built in EAGLE3_CLASSES or "Eagle3" in built:
        return "eagle3"
    if built in EAGLE_CLASSES:
        return "eagle"
    if built in NEXTN_CLASSES:
        return "nextn"
    return "unknown"


def check_built_draft_class(
    built: str, architectures: list[str], tensor_names: Iterable[str], has_aux_ids: bool, *, algorithm: str | None = None
) -> list[Finding]:
    """draft_class_mismatch from the draft model SGLang really built (runtime): an EAGLE-3
    checkpoint served by a NextN/MTP or EAGLE-1 class. ``architectures``: the draft's
    config.json as written (before SGLang's rename)."""
    kind = built_kind(built)
    if kind in ("eagle3", "unknown") or not is_eagle3_checkpoint(tensor_names, has_aux_ids):
        return []
    what = {"nextn": "a multi-token-prediction (NextN/MTP) head", "eagle": "an EAGLE-1 draft"}[kind]
    renamed = f" (SGLang renamed the draft's {architectures[0]} to it)" if architectures and built != architectures[0] else ""
    served = f" under --speculative-algorithm {algorithm}" if algorithm else ""
    return [
        finding(
            "draft_class_mismatch",
            f"SGLang built {built}{renamed}, {what}, for a draft checkpoint that is EAGLE-3 (fc over the target's aux "
            f"states; architectures {architectures}){served}: its fc and aux states are not what that class loads or runs",
            module="draft",
            evidence={
                "observed": "the draft model the engine built",
                "architectures": list(architectures),
                "built_class": built,
                "class_kind": kind,
                "algorithm": algorithm,
            },
            fix=f'set architectures to ["LlamaForCausalLMEagle3"] (or Eagle3DeepseekV2ForCausalLM for a DeepSeek-layer '
            f"draft; the EAGLE-3 classes are {', '.join(sorted(EAGLE3_CLASSES))}) and launch with "
            "--speculative-algorithm EAGLE3 (NEXTN is an alias of EAGLE, which captures no aux states)",
            source="sglang.draft_class",
        )
    ]


def check_draft_built_as_target(
    built: str,
    architectures: list[str],
    *,
    target_class: str | None,
    draft_size: ModelSize,
    target_size: ModelSize | None,
    algorithm: str | None = None,
) -> list[Finding]:
    """draft_class_mismatch when the draft worker built a model of no draft kind that is the
    target's own class or as large as the target: the full model, not its draft head.

    A whole-model draft (``--speculative-algorithm STANDALONE``) is often of the target's
    class by design; only its size counts then."""
    if built_kind(built) != "unknown" or not built:
        return []
    same_class = bool(target_class) and built == target_class and (algorithm or "").upper() not in WHOLE_MODEL_DRAFTS
    sized = target_size is not None and target_sized(draft_size, target_size)
    if not (same_class or sized):
        return []
    what = []
    if same_class:
        what.append("the target's own class")
    if sized and target_size is not None:
        layers = f"{draft_size.layers} decoder layers, " if draft_size.layers is not None else ""
        target_layers = f"{target_size.layers} layers, " if target_size.layers is not None else ""
        what.append(f"{layers}{draft_size.params:,} parameters against the target's {target_layers}{target_size.params:,}")
    served = f" under --speculative-algorithm {algorithm}" if algorithm else ""
    return [
        finding(
            "draft_class_mismatch",
            f"the draft worker built {built} ({'; '.join(what)}){served} from the draft's architectures {architectures}: "
            "that is the full target model, not a draft (one EAGLE-3 layer or a NextN/MTP head); SGLang builds the "
            "class the architectures name when it does not rename them to their NextN/MTP head",
            module="draft",
            evidence={
                "observed": "the draft model the engine built",
                "architectures": list(architectures),
                "built_class": built,
                "class_kind": "target",
                "target_class": target_class,
                "draft_params": draft_size.params,
                "draft_layers": draft_size.layers,
                "target_params": target_size.params if target_size else None,
                "target_layers": target_size.layers if target_size else None,
                "algorithm": algorithm,
            },
            fix="set the draft's architectures to its draft class: its NextN/MTP head for an MTP checkpoint (a "
            "DeepSeek-V3/V3.2 MTP layer: DeepseekV3ForCausalLMNextN), LlamaForCausalLMEagle3 for an EAGLE-3 draft; or "
            "serve with an SGLang release that renames this architecture for a draft",
            source="sglang.draft_class",
        )
    ]

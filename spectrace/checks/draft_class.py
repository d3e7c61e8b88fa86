"""draft_class_mismatch: the draft class SGLang builds for the checkpoint's ``architectures``
is not an EAGLE-3 draft, though the checkpoint is one (sglang#20809: a NextN/MTP mapping
picked for an EAGLE-3 head). The rules are :mod:`spectrace.rules.draft_classes`."""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.draft_classes import EAGLE3_CLASSES, EAGLE_CLASSES, NEXTN_CLASSES, SGLANG_CLASSES_READ, built_class

FC_NAMES = ("fc.weight", "model.fc.weight")


def is_eagle3_checkpoint(tensor_names: Iterable[str], has_aux_ids: bool) -> bool:
    """An fc over aux states, or aux-layer ids in the config: what only an EAGLE-3 draft has."""
    return has_aux_ids or any(name in FC_NAMES for name in tensor_names)


def check_draft_class(architectures: list[str], tensor_names: Iterable[str], has_aux_ids: bool) -> list[Finding]:
    """An EAGLE-3 checkpoint whose ``architectures`` make SGLang build a NextN/MTP or EAGLE-1 class."""
    built, kind = built_class(architectures)
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

"""draft_class_mismatch: the draft class SGLang builds for the checkpoint's ``architectures``
is not an EAGLE-3 draft, though the checkpoint is one (sglang#20809: a NextN/MTP mapping
picked for an EAGLE-3 head). The rules are :mod:`spectrace.rules.draft_classes`."""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.draft_classes import EAGLE3_CLASSES, SGLANG_CLASSES_READ, built_class

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

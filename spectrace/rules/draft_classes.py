"""Which draft class SGLang builds for a draft checkpoint's ``architectures``, read from
SGLang 0.5.23 (``srt/models/*`` ``EntryClass`` lists, ``srt/configs/model_config.py``).

Two steps decide it. First, for a draft model SGLang renames some target architectures to
their multi-token-prediction head (``DeepseekV3ForCausalLM`` -> ``DeepseekV3ForCausalLMNextN``,
``Qwen3NextForCausalLM`` -> ``Qwen3NextForCausalLMMTP``, ...), whatever the speculative
algorithm. Then the model registry maps the name to its class. Only two classes are
EAGLE-3 drafts (an ``fc`` over the target's aux states): ``LlamaForCausalLMEagle3`` and
``Eagle3DeepseekV2ForCausalLM``. ``--speculative-algorithm NEXTN`` is an alias of
``EAGLE`` (``spec_registry._RESERVED_ALIASES``), not of ``EAGLE3``: the target captures no
aux states under it.

    >>> built_class(["DeepseekV3ForCausalLM"])
    ('DeepseekV3ForCausalLMNextN', 'nextn')
    >>> built_class(["LlamaForCausalLMEagle3"])
    ('LlamaForCausalLMEagle3', 'eagle3')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

Kind = Literal["eagle3", "eagle", "nextn", "unknown"]
SGLANG_CLASSES_READ = "0.5.23"

EAGLE3_CLASSES: frozenset[str] = frozenset({"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM"})
# EAGLE-1 drafts: no fc over aux states (llama_eagle, qwen2_eagle, mistral_eagle, ...).
EAGLE_CLASSES: frozenset[str] = frozenset(
    {"LlamaForCausalLMEagle", "Qwen2ForCausalLMEagle", "MistralForCausalLMEagle", "MistralLarge3ForCausalLMEagle"}
)
# Multi-token-prediction heads (*_nextn.py, *_mtp.py EntryClass).
NEXTN_CLASSES: frozenset[str] = frozenset(
    {
        "BailingMoeForCausalLMNextN", "DeepseekV3ForCausalLMNextN", "DeepseekV4ForCausalLMNextN",
        "Dots3NoteForCausalLMNextN", "Glm4MoeLiteForCausalLMNextN", "Glm4MoeForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN", "GlmOcrForConditionalGenerationNextN", "GlmMoeDsaForCausalLMNextN",
        "HYV3ForCausalLMNextN", "HYV4ForCausalLMNextN", "LongcatFlashForCausalLMNextN", "GigaChat35ForCausalLMNextN",
        "MiMoMTP", "MiMoV2MTP", "ExaoneMoEForCausalLMMTP", "IQuestQ1MTP",
        "Qwen3_5ForCausalLMMTP", "Qwen3MoeForCausalLMMTP", "Qwen3NextForCausalLMMTP", "Qwen4ExpForCausalLMMTP",
        "Step3p5MTP", "Ernie4_5_MoeForCausalLMMTP",
    }
)  # fmt: skip
# ModelConfig's renames of a draft model's architectures[0] (the unambiguous ones).
DRAFT_RENAMES: dict[str, str] = {
    "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
    "DeepseekV32ForCausalLM": "DeepseekV3ForCausalLMNextN",
    "GlmMoeDsaForCausalLM": "GlmMoeDsaForCausalLMNextN",
    "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
    "Glm4MoeLiteForCausalLM": "Glm4MoeLiteForCausalLMNextN",
    "Glm5NextForConditionalGeneration": "Glm5NextForConditionalGenerationNextN",
    "LongcatFlashForCausalLM": "LongcatFlashForCausalLMNextN",
    "MiMoForCausalLM": "MiMoMTP",
    "Step3p5ForCausalLM": "Step3p5MTP",
    "GigaChat35ForCausalLM": "GigaChat35ForCausalLMNextN",
    "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeForCausalLMMTP",
    "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP",
}


def built_class(architectures: Sequence[str]) -> tuple[str, Kind]:
    """(the class SGLang builds for the draft, its kind); ("", "unknown") with no architectures."""
    if not architectures:
        return "", "unknown"
    first = DRAFT_RENAMES.get(architectures[0], architectures[0])
    if first in EAGLE3_CLASSES:
        return first, "eagle3"
    if first in EAGLE_CLASSES:
        return first, "eagle"
    if first in NEXTN_CLASSES:
        return first, "nextn"
    return first, "unknown"


class ModelSize(NamedTuple):
    """A built model's decoder layers (None: not found) and parameter count."""

    layers: int | None
    params: int


# A draft is one decoder layer (EAGLE-3) or one MTP layer over the target's states: a draft
# model this large against its target is the full model, built from a class SGLang did not
# rename to its NextN/MTP head.
TARGET_SIZE_SHARE = 0.5
# Algorithms whose draft is a whole (small) model of its own, often of the target's class.
WHOLE_MODEL_DRAFTS = frozenset({"STANDALONE"})


def target_sized(draft: ModelSize, target: ModelSize) -> bool:
    """Is the draft as large as a target: its parameters at least TARGET_SIZE_SHARE of the
    target's, or as many decoder layers (more than one)?

    >>> target_sized(ModelSize(4, 900), ModelSize(4, 1000)), target_sized(ModelSize(1, 120), ModelSize(4, 1000))
    (True, False)
    """
    if target.params > 0 and draft.params >= TARGET_SIZE_SHARE * target.params:
        return True
    return draft.layers is not None and target.layers is not None and target.layers > 1 and draft.layers >= target.layers

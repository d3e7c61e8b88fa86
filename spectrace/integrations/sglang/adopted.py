"""The SGLang models spectrace adopted (target and draft), kept weakly with their name prefix.

A leaf of its own so that the draft's rotary check and the weights' fingerprint can list the
adopted targets without importing the module hooks that adopt them.
"""

from __future__ import annotations

import weakref
from typing import Any

DRAFT_CLASSES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
_adopted: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # model -> prefix


def _is_draft(model: Any) -> bool:
    return type(model).__name__ in DRAFT_CLASSES or "Eagle3" in type(model).__name__

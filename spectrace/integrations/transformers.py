"""Auto-activation for Hugging Face transformers: every built model is traced.

``PreTrainedModel.post_init`` ends every model's ``__init__``; wrapping it lets
``SPECTRACE=1`` adopt each model as it is built, with no code change.

    >>> patch(transformers.modeling_utils)  # done by spectrace.runtime on import
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from .. import runtime


def patch(modeling_utils: ModuleType) -> None:
    cls = getattr(modeling_utils, "PreTrainedModel", None)
    if cls is None or not hasattr(cls, "post_init"):
        runtime.recorder().coverage("not_covered", "transformers.PreTrainedModel.post_init not found: HF models are not traced")
        return
    if getattr(cls.post_init, "__spectrace__", False):
        return
    original = cls.post_init

    @functools.wraps(original)
    def post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        runtime.adopt(self)
        return result

    post_init.__spectrace__ = True  # type: ignore[attr-defined]
    cls.post_init = post_init

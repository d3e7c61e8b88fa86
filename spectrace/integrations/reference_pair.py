"""Auto-activation for spectrace's own tiny EAGLE-3 pair (``spectrace.eagle3``).

Its target and draft are plain torch modules around a transformers Llama, not classes an
engine builds, so nothing else adopts them under ``SPECTRACE=1``. The pair is spectrace's
own and is recognised by its classes: each is adopted at the end of its ``__init__`` under
the side it plays (``target`` / ``draft``), as ``spectrace.trace({"target": ..., "draft":
...})`` names them, so both entry points trace the same modules under the same roles. The
Llama inside the target was adopted first, by the transformers integration; it runs only
inside the target's forward, so it is traced as part of it, not twice.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from .. import runtime

# (module, class, side)
PAIR_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("spectrace.eagle3.target", "Eagle3Target", "target"),
    ("spectrace.eagle3.draft", "Eagle3Draft", "draft"),
)


def patch(module: ModuleType) -> None:
    for module_name, class_name, side in PAIR_CLASSES:
        if module.__name__ == module_name:
            _adopt_on_init(module, class_name, side)


def _observe_load(cls: type) -> None:
    """The draft's ``load_weights``, observed as the engines' draft loads are: what was
    offered, written, ignored and missing, checked at once (``weights_dropped`` ...)."""
    original = getattr(cls, "load_weights", None)
    if original is None or getattr(original, "__spectrace__", False):
        return

    @functools.wraps(original)
    def load_weights(self: Any, weights: Any, *args: Any, **kwargs: Any) -> Any:
        from ..checks.weights import check_weights
        from ..hooks.weights import observe_load
        from .core.loads import DraftLoad

        call = DraftLoad(original, (self, weights, *args), kwargs)
        rec = runtime.recorder()

        def observe() -> tuple[Any, Any]:
            exempt = [n for n, _ in self.named_parameters() if n.endswith("embed_tokens.weight")]
            if getattr(self, "load_lm_head_from_target", False):
                exempt += [n for n, _ in self.named_parameters() if n.startswith("lm_head")]
            return observe_load(
                self, call.load, call.weights, module=runtime.name_of(self) or "draft", exempt=exempt, source="load_weights"
            )

        result, record = call.observed(observe, lambda what, exc: rec.internal_error(f"{what}: {type(exc).__name__}: {exc}"))
        if record is not None:
            rec.emit(record)
            for found in check_weights(record):
                rec.emit(found)
        return result

    load_weights.__spectrace__ = True  # type: ignore[attr-defined]
    cls.load_weights = load_weights


def _adopt_on_init(module: ModuleType, class_name: str, side: str) -> None:
    cls = getattr(module, class_name, None)
    if cls is None:
        runtime.recorder().coverage("not_covered", f"{module.__name__}.{class_name} not found: the reference pair is not traced")
        return
    if getattr(cls.__init__, "__spectrace__", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        runtime.adopt(self, side=side)

    __init__.__spectrace__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__
    if side == "draft":
        _observe_load(cls)


def patch_loop(module: ModuleType) -> None:
    """``speculate(target, draft, ...)`` is where the pair meets: its models are checked then,
    once, as ``trace()`` checks the models handed to it."""
    original = getattr(module, "speculate", None)
    if original is None:
        runtime.recorder().coverage("not_covered", f"{module.__name__}.speculate not found: the reference pair's models are not checked")
        return
    if getattr(original, "__spectrace__", False):
        return

    @functools.wraps(original)
    def speculate(target: Any, draft: Any, *args: Any, **kwargs: Any) -> Any:
        runtime.check_pair(target, draft)
        return original(target, draft, *args, **kwargs)

    speculate.__spectrace__ = True  # type: ignore[attr-defined]
    module.speculate = speculate

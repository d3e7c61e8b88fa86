"""One call of an engine's draft ``load_weights``, run under spectrace's observer.

Both engines' AROUND hooks on the draft's load hand the weights to
``spectrace.hooks.weights.observe_load``, which runs the engine's load inside. Whose error
is whose decides what happens: an error of the load itself is the engine's and is raised
unchanged; an error of spectrace's own before the load ran is counted, and the engine's
load then runs as if spectrace were not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class DraftLoad:
    """``(original, self, weights, ...)`` as an AROUND hook receives them."""

    def __init__(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.original = original
        self.model = args[0]
        self.weights: Iterable[Any] = args[1] if len(args) > 1 else kwargs.pop("weights")
        self.rest = args[2:]
        self.kwargs = kwargs
        self.started = False  # has the engine's load begun (its errors are its own from then on)

    def load(self, items: Iterable[Any]) -> Any:
        """The engine's load on ``items`` (what the observer feeds it)."""
        self.started = True
        return self.original(self.model, items, *self.rest, **self.kwargs)

    def plain(self) -> Any:
        """The engine's load as called, without spectrace."""
        return self.original(self.model, self.weights, *self.rest, **self.kwargs)

    def observed(self, observe: Callable[[], tuple[Any, Any]], internal_error: Callable[[str, BaseException], None]) -> tuple[Any, Any]:
        """``observe()`` (which calls :meth:`load`) -> ``(result, record)``; ``record`` is None
        when spectrace failed before the load and the load ran plainly."""
        try:
            return observe()
        except Exception as exc:
            if self.started:
                raise  # the load itself failed: the engine's error, unchanged
            internal_error("draft load_weights", exc)
            return self.plain(), None

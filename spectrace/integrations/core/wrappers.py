"""HookRegistry's BEFORE / AFTER / AROUND semantics, for routes without HookRegistry.

``guarded`` turns a hook into the callable a wrapper (or SGLang's HookRegistry) calls: it
acts once per call even when a hook sits twice on one call chain (an override that
delegates to its base, a function imported by name after its module was patched), and
it may time the hook. ``wrap`` puts a guarded hook around an engine function, marked as
spectrace's:

- ``BEFORE``: ``hook(*args, **kwargs)``; a non-None return ``(args, kwargs)`` replaces the call's;
- ``AFTER``: ``hook(result, *args, **kwargs)``; a non-None return replaces the result;
- ``AROUND``: ``hook(original, *args, **kwargs)`` returns the result.

A BEFORE or AFTER hook that raises is counted (``on_error``) and the engine's call goes on
unchanged: a hook never raises into the model. An AROUND hook runs the engine's function
itself and keeps its own errors apart from the engine's.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from .marks import HOOK_ATTR, keys_on

Timer = Callable[[float], None]  # told the seconds one hook call took


def guarded(
    hook: Callable[..., Any], *, around: bool, reentry: str, active: threading.local, point_key: str, timer: Timer | None = None
) -> Callable[..., Any]:
    """``hook``, acting once per call on each thread while ``reentry`` is already acting.

    A re-entered AROUND hook runs the engine's function plainly; a re-entered BEFORE or
    AFTER hook does nothing. ``timer`` (BEFORE and AFTER only: an AROUND hook runs the
    engine's function inside, so it cannot be timed apart from it) is told each call's time.
    """
    clock = time.perf_counter

    @functools.wraps(hook)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        try:
            acting: set[str] = active.acting
        except AttributeError:
            acting = active.acting = set()
        if reentry in acting:
            return args[0](*args[1:], **kwargs) if around else None
        acting.add(reentry)
        start = clock()
        try:
            return hook(*args, **kwargs)
        finally:
            acting.discard(reentry)
            if timer is not None:
                timer(clock() - start)

    setattr(adapter, HOOK_ATTR, point_key)  # found again by marks.holds inside foreign wrappers
    return adapter


def wrap(
    original: Callable[..., Any],
    hook: Callable[..., Any],
    *,
    kind: str,
    mark: str,
    point_key: str,
    on_error: Callable[[BaseException], None],
) -> Callable[..., Any]:
    """``original`` with the guarded ``hook`` around it, carrying ``mark`` (its keys and ``point_key``)."""
    if kind == "BEFORE":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                changed = hook(*args, **kwargs)
                if changed is not None:
                    args, kwargs = changed
            except Exception as exc:  # never into the host
                on_error(exc)
            return original(*args, **kwargs)

    elif kind == "AFTER":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                changed = hook(result, *args, **kwargs)
            except Exception as exc:
                on_error(exc)
                return result
            return changed if changed is not None else result

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

    functools.update_wrapper(wrapper, original)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, mark, frozenset(keys_on(original, mark) | {point_key}))
    return wrapper

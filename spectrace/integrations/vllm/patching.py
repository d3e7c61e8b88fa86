"""Apply the patch points on vLLM's modules, as they import (or now, if they are imported).

vLLM has no hook registry: every route in (the ``vllm.general_plugins`` entry point, the
``.pth`` bootstrap, :func:`spectrace.integrations.vllm.install`) ends here, and none
patches twice:

- a wrapper carries the point keys it holds (``__spectrace_vllm__``, copied through any
  ``functools.wraps``) and a function that already holds a point of the same feature is
  left alone (Model Runner V2 imports ``set_eagle3_aux_hidden_state_layers`` by name: the
  runner's binding may be the wrapper already);
- at run time a per-thread guard lets a hook that sits twice on one call act once.

A point missing from the installed vLLM is said once as "not covered" (unless an
alternative of its feature is patched); the host's call is never changed or broken.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...importhook import module_exists
from . import state
from .points import POINTS, Point, alternatives, points_for

MARK = "__spectrace_vllm__"
_applied: dict[str, str] = {}
_reported: set[str] = set()
_guard = threading.local()
_lock = threading.RLock()


def _keys(fn: Any) -> set[str]:
    found: set[str] = set()
    depth = 0
    while fn is not None and depth < 32:
        found |= set(getattr(fn, MARK, ()) or ())
        fn = getattr(fn, "__wrapped__", None)
        depth += 1
    return found


def is_patched(fn: Any, point: Point | None = None) -> bool:
    keys = _keys(fn)
    if point is None:
        return bool(keys)
    # Any point with the same hook: an inherited method patched on its base, or a function
    # imported by name after its own module patched it, already runs this hook.
    return bool(keys & {p.key for p in POINTS if p.hook == point.hook})


def _guarded(point: Point) -> Callable[..., Any]:
    hook = point.resolve_hook()
    around = point.kind == "AROUND"
    # Keyed by the hook: a target's override that delegates to SupportsEagle3's method
    # records one capture, not two.
    feature = point.hook

    @functools.wraps(hook)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        try:
            active: set[str] = _guard.active
        except AttributeError:
            active = _guard.active = set()
        if feature in active:
            return args[0](*args[1:], **kwargs) if around else None
        active.add(feature)
        try:
            return hook(*args, **kwargs)
        finally:
            active.discard(feature)

    return adapter


def _wrap(original: Callable[..., Any], point: Point) -> Callable[..., Any]:
    hook = _guarded(point)
    if point.kind == "BEFORE":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                hook(*args, **kwargs)
            except Exception as exc:  # never into the host
                state.internal_error(point.target, exc)
            return original(*args, **kwargs)

    elif point.kind == "AFTER":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                hook(result, *args, **kwargs)
            except Exception as exc:
                state.internal_error(point.target, exc)
            return result

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

    functools.update_wrapper(wrapper, original)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, MARK, frozenset(_keys(original) | {point.key}))
    return wrapper


def not_covered(point: Point, why: str) -> None:
    """Say once that a feature has no patch point in this vLLM (unless an alternative has)."""
    with _lock:
        if point.feature in _reported or any(_applied.get(alt.key) for alt in alternatives(point)):
            return
        _reported.add(point.feature)
    try:
        state.recorder().coverage("not_covered", f"vLLM {point.target} {why}: {point.feature} is not checked")
    except Exception:
        pass


def _owner(module: ModuleType, qualname: str) -> tuple[Any, str] | None:
    *path, attr = qualname.split(".")
    obj: Any = module
    for part in path:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if not hasattr(obj, attr):
        return None
    return obj, attr


def patch_point(module: ModuleType, point: Point) -> bool:
    """Patch one point on an imported module; False if it is missing or already patched."""
    owner = _owner(module, point.qualname)
    if owner is None:
        not_covered(point, "not found")
        return False
    obj, attr = owner
    raw = obj.__dict__.get(attr, getattr(obj, attr)) if isinstance(obj, type) else getattr(obj, attr)
    if isinstance(raw, classmethod):
        # The speculators reader is a classmethod: wrap its function, keep it a classmethod.
        if is_patched(raw.__func__, point):
            return False
        with _lock:
            setattr(obj, attr, classmethod(_wrap(raw.__func__, point)))
            _applied[point.key] = "direct"
        return True
    if isinstance(raw, staticmethod) or not callable(raw):
        not_covered(point, "is not a plain function")
        return False
    if is_patched(raw, point):
        _applied.setdefault(point.key, "inherited")
        return False
    with _lock:
        setattr(obj, attr, _wrap(raw, point))
        _applied[point.key] = "direct"
    return True


def patch_module(module: ModuleType) -> None:
    """Import-hook callback: patch every point of ``module``."""
    for point in points_for(module.__name__):
        try:
            patch_point(module, point)
        except Exception as exc:
            state.internal_error(f"patching {point.target}", exc)


def install_direct() -> list[str]:
    """Patch imported modules now and the others as they import; returns the keys applied now."""
    from ...importhook import when_imported

    before = set(_applied)
    for module_name in dict.fromkeys(p.module for p in POINTS):
        if module_name in sys.modules:
            patch_module(sys.modules[module_name])
        elif module_exists(module_name):
            when_imported(module_name, patch_module)
        else:
            for point in points_for(module_name):
                if not any(module_exists(alt.module) for alt in alternatives(point)):
                    not_covered(point, "module not present")
    return sorted(k for k, v in _applied.items() if k not in before and v == "direct")


def applied() -> dict[str, str]:
    return dict(_applied)

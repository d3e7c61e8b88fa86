"""Apply the patch points: directly (import-hook route, tests) or through SGLang's HookRegistry.

Both routes run the same hook functions; neither patches twice:

- a direct patch marks its wrapper with ``__spectrace_sglang__`` (the point keys it
  carries; ``functools.wraps`` copies the mark onto any wrapper SGLang puts around it);
- a point handed to HookRegistry is *claimed*, so the import hook, which fires while
  HookRegistry imports the module, leaves it alone;
- at run time a per-thread guard lets a hook that somehow sits twice on one call act once.

A point missing from the installed SGLang is reported once as "not covered".
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...importhook import module_exists
from . import cost, state
from .points import POINTS, Point, alternatives, points_for

MARK = "__spectrace_sglang__"
_claimed: set[str] = set()
_applied: dict[str, str] = {}  # point key -> route ("direct" | "plugin")
_reported: set[str] = set()
_guard = threading.local()
STARTUP_CALLS = 2  # calls of each hook counted as start-up (imports, first-use kernel compiles)


def _keys(fn: Any) -> set[str]:
    """Point keys already on ``fn`` or anything it wraps."""
    found: set[str] = set()
    seen = 0
    while fn is not None and seen < 32:
        found |= set(getattr(fn, MARK, ()) or ())
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return found


def is_patched(fn: Any, point: Point | None = None) -> bool:
    keys = _keys(fn)
    return bool(keys) if point is None else point.key in keys


def _owner(module: ModuleType, qualname: str) -> tuple[Any, str] | None:
    *path, attr = qualname.split(".")
    obj: Any = module
    for part in path:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if attr not in getattr(obj, "__dict__", {}) and not hasattr(obj, attr):
        return None
    return obj, attr


def _account(seconds: float, feature: str) -> None:
    try:
        # Split by feature, so a server's cost names the hook to look at (or to skip).
        state.recorder().account_hook(seconds, feature)
    except Exception:
        pass


def guarded(point: Point) -> Callable[..., Any]:
    """The point's hook with HookRegistry's signature, acting once per call even if stacked."""
    hook = point.resolve_hook()
    first_arg_is_fn = point.kind == "AROUND"
    key = point.key  # a property that formats a string: once here, not three times per call
    feature = point.feature
    clock = time.perf_counter
    calls = [0]
    spent_on = cost.of(feature)  # summed here, handed to the recorder in batches

    @functools.wraps(hook)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        try:
            active: set[str] = _guard.active
        except AttributeError:
            active = _guard.active = set()
        if key in active:
            if first_arg_is_fn:
                return args[0](*args[1:], **kwargs)
            return None
        active.add(key)
        start = clock()
        try:
            return hook(*args, **kwargs)
        finally:
            active.discard(key)
            if not first_arg_is_fn:
                # Accounting for the overhead budget: what spectrace itself costs the host per
                # step, independent of how noisy a throughput comparison is. An AROUND hook
                # runs the engine's function inside, so it cannot be timed apart from it.
                # Time during graph warm-up and capture is start-up cost, kept apart.
                spent = clock() - start
                if state.STATE.in_capture:
                    _account(spent, f"{feature}@startup")
                elif calls[0] < STARTUP_CALLS:
                    # A hook's first calls import modules and compile kernels: start-up
                    # cost, kept apart from the per-step figure.
                    calls[0] += 1
                    _account(spent, f"{feature}@startup")
                else:
                    spent_on.add(spent)

    adapter.__spectrace_hook__ = point.key  # type: ignore[attr-defined]
    return adapter


def _wrap(original: Callable[..., Any], point: Point) -> Callable[..., Any]:
    """HookRegistry's BEFORE / AFTER / AROUND semantics, marked as ours."""
    hook = guarded(point)
    if point.kind == "BEFORE":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            changed = hook(*args, **kwargs)
            if changed is not None:
                args, kwargs = changed
            return original(*args, **kwargs)

    elif point.kind == "AFTER":

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            changed = hook(result, *args, **kwargs)
            return changed if changed is not None else result

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

    functools.update_wrapper(wrapper, original)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, MARK, frozenset(_keys(original) | {point.key}))
    return wrapper


def not_covered(point: Point, why: str) -> None:
    """Say once that a feature has no patch point in this SGLang (unless an alternative has)."""
    if point.feature in _reported:
        return
    if any(_applied.get(alt.key) for alt in alternatives(point)):
        return
    _reported.add(point.feature)
    try:
        state.recorder().coverage("not_covered", f"SGLang {point.target} {why}: {point.feature} is not checked")
    except Exception:
        pass


def _current(point: Point) -> Any:
    """What callers of the point see now (None if its module is not imported or lacks it)."""
    module = sys.modules.get(point.module)
    owner = _owner(module, point.qualname) if module is not None else None
    return getattr(*owner, None) if owner is not None else None


_skip_checked: list[bool] = []


def skipped(point: Point) -> bool:
    """A feature the user turned off (``SPECTRACE_SGLANG_SKIP``): left unpatched, said once."""
    try:
        from ... import runtime
        from ...settings import warn

        skip = runtime.settings().sglang_skip
    except Exception:
        return False
    if skip and not _skip_checked:
        _skip_checked.append(True)
        unknown = sorted(set(skip) - {p.feature for p in POINTS} - {"all"})
        if unknown:
            known = ", ".join(sorted({p.feature for p in POINTS}))
            warn(f"SPECTRACE_SGLANG_SKIP names no SGLang feature: {', '.join(unknown)} (ignored; known: {known}, all)")
    if point.feature not in skip and "all" not in skip:
        return False
    if point.feature not in _reported:
        _reported.add(point.feature)
        try:
            state.recorder().coverage("not_covered", f"SGLang {point.target}: {point.feature} is not checked (SPECTRACE_SGLANG_SKIP)")
        except Exception:
            pass
    return True


def superseded(point: Point) -> bool:
    """A fallback point whose job a cheaper point does in this SGLang (``Point.unless``)."""
    return bool(point.unless) and module_exists(point.unless)


def patch_point(module: ModuleType, point: Point) -> bool:
    """Patch one point on an imported module; False if it is missing, skipped or already patched."""
    if point.key in _claimed or superseded(point) or skipped(point):
        return False
    owner = _owner(module, point.qualname)
    if owner is None:
        not_covered(point, "not found")
        return False
    obj, attr = owner
    # Own attribute of a class, or the inherited function callers see; module functions as is.
    raw = obj.__dict__.get(attr, getattr(obj, attr)) if isinstance(obj, type) else getattr(obj, attr)
    if isinstance(raw, (classmethod, staticmethod)) or not callable(raw):
        not_covered(point, "is not a plain function")  # no point is; a future version might make it one
        return False
    if is_patched(raw, point):
        return False
    setattr(obj, attr, _wrap(raw, point))
    _applied[point.key] = "direct"
    return True


def patch_module(module: ModuleType) -> None:
    """Import-hook callback: patch every point of ``module`` (registered by points.import_targets)."""
    for point in points_for(module.__name__):
        try:
            patch_point(module, point)
        except Exception as exc:
            state.internal_error(f"patching {point.target}", exc)


def install_direct() -> list[str]:
    """Patch imported modules now and the others as they import; returns the keys applied now."""
    from ...importhook import when_imported

    done_before = set(_applied)
    for module_name in dict.fromkeys(p.module for p in POINTS):
        if module_name in sys.modules:
            patch_module(sys.modules[module_name])
        elif module_exists(module_name):
            when_imported(module_name, patch_module)
        else:
            for point in points_for(module_name):
                _missing_module(point)
    return sorted(set(_applied) - done_before)


def _missing_module(point: Point) -> None:
    # Absent modules are normal for the other version's alternatives; report a feature
    # only when none of its alternatives' modules exists either.
    if superseded(point):
        return
    if any(module_exists(alt.module) for alt in alternatives(point)):
        return
    not_covered(point, "module not present")


def claim(point: Point) -> None:
    _claimed.add(point.key)
    _applied[point.key] = "plugin"


def applied() -> dict[str, str]:
    return dict(_applied)


def hooked(target_fn: Any, point: Point) -> bool:
    """Is ``point``'s hook on ``target_fn``, by mark (direct) or inside a HookRegistry wrapper?"""
    fn, depth = target_fn, 0
    while fn is not None and depth < 32:
        if point.key in set(getattr(fn, MARK, ()) or ()):
            return True
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if getattr(cell.cell_contents, "__spectrace_hook__", None) == point.key:
                    return True
            except ValueError:
                continue
        fn = getattr(fn, "__wrapped__", None)
        depth += 1
    return False


def register_with_hook_registry() -> list[str]:
    """Plugin route (0.5.17+): patch SGLang without importing anything it does not load.

    SGLang calls this at the start of every process it runs, before any model code is
    imported. HookRegistry imports each registered target's module when it applies the
    hooks, so registering every point would import every model file spectrace knows
    (DeepSeek and Kimi into a Llama server, all of them into the HTTP process). Only the
    points whose module is already imported go to HookRegistry; the others are patched
    by the import hook as SGLang imports their modules (the same hook functions).
    """
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from ... import runtime

    # Claim first: the import hook (runtime.activate, or the .pth bootstrap) must leave
    # these points to HookRegistry.
    candidates = [
        p
        for p in POINTS
        if p.module in sys.modules and p.key not in _claimed and _applied.get(p.key) != "direct" and not superseded(p) and not skipped(p)
    ]
    pending = []
    for point in candidates:
        if is_patched(_current(point), point):
            continue  # the import hook got there first
        _claimed.add(point.key)
        pending.append(point)
    runtime.activate()  # exit flush + import hooks (registered by points.import_targets); idempotent
    install_direct()  # the points of modules not imported yet: patched when SGLang imports them
    registered: list[str] = []
    for point in pending:
        if not module_exists(point.module):
            _release(point)
            _missing_module(point)
            continue
        try:
            module = importlib.import_module(point.module)
        except Exception as exc:
            _release(point)
            not_covered(point, f"cannot be imported ({type(exc).__name__}: {exc})")
            continue
        if _owner(module, point.qualname) is None:
            _release(point)
            not_covered(point, "not found")
            continue
        claim(point)
        HookRegistry.register(point.target, guarded(point), HookType[point.kind])
        registered.append(point.key)
    return registered


def _release(point: Point) -> None:
    _claimed.discard(point.key)
    _applied.pop(point.key, None)

"""Apply an engine's patch points: now on imported modules, or as the engine imports them.

Every route in (an engine's plugin entry point, the ``.pth`` bootstrap's import hooks, an
explicit ``install``) ends in one :class:`Patcher` per engine, and none patches twice:

- a wrapper carries the keys of the points it holds (``marks``); a function that already
  holds the point is left alone. What counts as "the point" is the engine's choice
  (``one_per``): the point itself, or any point running the same hook (vLLM: an override
  that delegates to its base, or a function imported by name after its module was
  patched, already runs the hook);
- a point handed to another patcher (SGLang's HookRegistry) is *claimed*, and left alone;
- all changes to the patched functions and the patcher's books happen under one lock
  (plugin loading and import hooks may run on different threads);
- a classmethod or staticmethod stays one: its function is wrapped and rewrapped.

A point missing from the installed engine is said once as not covered (``coverage``),
unless another point of its feature is patched; the engine's call is never changed or
broken.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from ...importhook import module_exists
from .coverage import CoverageNotes
from .marks import holds, keys_on
from .points import Point, PointTable
from .state import EngineState
from .wrappers import Timer, guarded, wrap


def owner(module: ModuleType, qualname: str) -> tuple[Any, str] | None:
    """The object holding ``qualname``'s last part inside ``module``, and that part's name."""
    *path, attr = qualname.split(".")
    obj: Any = module
    for part in path:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if attr not in getattr(obj, "__dict__", {}) and not hasattr(obj, attr):
        return None
    return obj, attr


def _function(obj: Any, attr: str) -> tuple[Any, Callable[[Any], Any] | None]:
    """The function to wrap at ``obj.attr``, and how to store its wrapper back.

    A class's own attribute as stored, or the inherited function its callers see; a
    module's function as is. A classmethod or staticmethod gives its function and its
    type: the wrapper is stored as one again, so a classmethod still gets its class.
    """
    raw = obj.__dict__.get(attr, getattr(obj, attr)) if isinstance(obj, type) else getattr(obj, attr)
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__, type(raw)
    return raw, None


class Patcher:
    def __init__(
        self,
        *,
        engine: str,
        table: PointTable,
        state: EngineState,
        mark: str,
        one_per: Literal["point", "hook"],
        timer: Callable[[Point], Timer] | None = None,
        skip: Callable[[Point], bool] | None = None,
    ) -> None:
        self.engine = engine  # as people write it, in what is said ("SGLang", "vLLM")
        self.table = table
        self.state = state
        self.mark = mark
        self.one_per = one_per
        self._timer = timer  # makes a point's timer (BEFORE / AFTER hooks), or None: untimed
        self._skip = skip  # a point the user turned off (the engine says so itself)
        self.lock = threading.RLock()
        self.applied: dict[str, str] = {}  # point key -> route ("direct", "inherited", or another patcher's)
        self.claimed: set[str] = set()
        self.coverage = CoverageNotes(state.recorder)
        self._active = threading.local()  # per thread: the hooks acting now (the re-entry guard)

    # ------------------------------------------------------------------ what is on a function
    def is_patched(self, fn: Any, point: Point | None = None) -> bool:
        keys = keys_on(fn, self.mark)
        if point is None:
            return bool(keys)
        return bool(keys & self._same(point))

    def hooked(self, fn: Any, point: Point) -> bool:
        """Is ``point``'s hook on ``fn``, by mark (direct) or inside another patcher's wrapper?"""
        return holds(fn, self.mark, point.key)

    def _same(self, point: Point) -> set[str]:
        return self.table.same_hook(point) if self.one_per == "hook" else {point.key}

    def current(self, point: Point) -> Any:
        """What callers of the point see now (None if its module is not imported or lacks it)."""
        module = sys.modules.get(point.module)
        found = owner(module, point.qualname) if module is not None else None
        return getattr(*found, None) if found is not None else None

    # ------------------------------------------------------------------ hooks and wrappers
    def guarded(self, point: Point) -> Callable[..., Any]:
        """The point's hook with HookRegistry's signature, acting once per call even if stacked."""
        around = point.kind == "AROUND"
        return guarded(
            point.resolve_hook(),
            around=around,
            # A point property formats a string: computed once here, not on every call.
            reentry=point.hook if self.one_per == "hook" else point.key,
            active=self._active,
            point_key=point.key,
            timer=None if around or self._timer is None else self._timer(point),
        )

    def wrap(self, original: Callable[..., Any], point: Point) -> Callable[..., Any]:
        target = point.target
        return wrap(
            original,
            self.guarded(point),
            kind=point.kind,
            mark=self.mark,
            point_key=point.key,
            on_error=lambda exc: self.state.internal_error(target, exc),
        )

    # ------------------------------------------------------------------ coverage
    def not_covered(self, point: Point, why: str) -> None:
        """Say once that a feature has no patch point in this engine (unless an alternative has)."""
        if self.coverage.is_said(point.feature):
            return
        if any(self.applied.get(alt.key) for alt in self.table.alternatives(point)):
            return
        self.coverage.say_once(point.feature, f"{self.engine} {point.target} {why}: {point.feature} is not checked")

    def superseded(self, point: Point) -> bool:
        """A fallback point whose job a cheaper point does in this release (``Point.unless``)."""
        return bool(point.unless) and module_exists(point.unless)

    def missing_module(self, point: Point) -> None:
        # Absent modules are normal for another release's alternatives; a feature is said
        # only when none of its alternatives' modules exists either.
        if self.superseded(point):
            return
        if any(module_exists(alt.module) for alt in self.table.alternatives(point)):
            return
        self.not_covered(point, "module not present")

    # ------------------------------------------------------------------ patching
    def patch_point(self, module: ModuleType, point: Point) -> bool:
        """Patch one point on an imported module; False if it is missing, skipped, claimed or already patched."""
        if point.key in self.claimed or self.superseded(point) or (self._skip is not None and self._skip(point)):
            return False
        found = owner(module, point.qualname)
        if found is None:
            self.not_covered(point, "not found")
            return False
        obj, attr = found
        raw, rebind = _function(obj, attr)
        if not callable(raw):
            self.not_covered(point, "is not a function")
            return False
        if self.is_patched(raw, point):
            self.applied.setdefault(point.key, "inherited")
            return False
        # Built outside the lock: resolving the hook imports its module, and an import may
        # fire another module's import hook, which patches under this lock on its thread.
        wrapped = self.wrap(raw, point)
        with self.lock:
            current, rebind = _function(obj, attr)
            if self.is_patched(current, point):
                return False  # another thread got there first
            if current is not raw:  # changed meanwhile: wrap what callers see now
                wrapped = self.wrap(current, point)
            setattr(obj, attr, rebind(wrapped) if rebind is not None else wrapped)
            self.applied[point.key] = "direct"
        return True

    def patch_module(self, module: ModuleType) -> None:
        """Import-hook callback: patch every point of ``module``."""
        for point in self.table.points_for(module.__name__):
            try:
                self.patch_point(module, point)
            except Exception as exc:
                self.state.internal_error(f"patching {point.target}", exc)

    def install_direct(self) -> list[str]:
        """Patch imported modules now and the others as they import; returns the keys patched now."""
        from ...importhook import when_imported

        before = set(self.applied)
        for module_name in self.table.modules:
            if module_name in sys.modules:
                self.patch_module(sys.modules[module_name])
            elif module_exists(module_name):
                when_imported(module_name, self.patch_module)
            else:
                for point in self.table.points_for(module_name):
                    self.missing_module(point)
        return sorted(k for k, route in self.applied.items() if k not in before and route == "direct")

    def install(self, recorder: Any = None) -> list[str]:
        """Patch the engine now and on import; records go to ``recorder`` (default: the process recorder)."""
        if recorder is not None:
            self.state.use_recorder(recorder)
        return self.install_direct()

    # ------------------------------------------------------------------ another patcher's points
    def claim(self, point: Point, route: str) -> None:
        """Leave ``point`` to another patcher (``route`` names it in :meth:`applied`)."""
        with self.lock:
            self.claimed.add(point.key)
            self.applied[point.key] = route

    def release(self, point: Point) -> None:
        with self.lock:
            self.claimed.discard(point.key)
            self.applied.pop(point.key, None)

    def applied_routes(self) -> dict[str, str]:
        return dict(self.applied)

"""Apply SGLang's patch points: directly (import-hook route, tests) or through SGLang's HookRegistry.

Both routes run the same hook functions (the shared core's :class:`~..core.patcher.Patcher`
holds the marks, the lock, the re-entry guard and the "not covered" notes); neither
patches twice:

- a direct patch marks its wrapper with ``__spectrace_sglang__`` (the point keys it
  carries; ``functools.wraps`` copies the mark onto any wrapper SGLang puts around it);
- a point handed to HookRegistry is *claimed*, so the import hook, which fires while
  HookRegistry imports the module, leaves it alone;
- at run time a per-thread guard lets a hook that somehow sits twice on one call act once
  (per point: two points of one hook on one call chain both act).

SGLang's own here: each hook's host time is accounted by feature (the overhead budget),
``SPECTRACE_SGLANG_SKIP`` turns features off, and the HookRegistry route.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ...importhook import module_exists
from ..core.patcher import Patcher, owner
from . import cost, state
from .points import POINTS, TABLE, Point

MARK = "__spectrace_sglang__"
STARTUP_CALLS = 2  # calls of each hook counted as start-up (imports, first-use kernel compiles)


def _account(seconds: float, feature: str) -> None:
    try:
        # Split by feature, so a server's cost names the hook to look at (or to skip).
        state.recorder().account_hook(seconds, feature)
    except Exception:
        pass


def _timer(point: Point) -> Callable[[float], None]:
    """Accounting for the overhead budget: what spectrace itself costs the host per step,
    independent of how noisy a throughput comparison is."""
    feature = point.feature
    calls = [0]
    spent_on = cost.of(feature)  # summed here, handed to the recorder in batches

    def account(spent: float) -> None:
        if state.STATE.in_capture:
            # Time during graph warm-up and capture is start-up cost, kept apart.
            _account(spent, f"{feature}@startup")
        elif calls[0] < STARTUP_CALLS:
            # A hook's first calls import modules and compile kernels: start-up cost, kept
            # apart from the per-step figure.
            calls[0] += 1
            _account(spent, f"{feature}@startup")
        else:
            spent_on.add(spent)

    return account


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
    PATCHER.coverage.say_once(point.feature, f"SGLang {point.target}: {point.feature} is not checked (SPECTRACE_SGLANG_SKIP)")
    return True


PATCHER = Patcher(engine="SGLang", table=TABLE, state=state.SHARED, mark=MARK, one_per="point", timer=_timer, skip=skipped)
# The names callers and tests use, bound to this engine's patcher.
patch_module = PATCHER.patch_module  # the import-hook callback the point table names
patch_point = PATCHER.patch_point
install_direct = PATCHER.install_direct
install = PATCHER.install  # the package's install(recorder=None)
applied = PATCHER.applied_routes
is_patched = PATCHER.is_patched
hooked = PATCHER.hooked
guarded = PATCHER.guarded
not_covered = PATCHER.not_covered
superseded = PATCHER.superseded
_reported = PATCHER.coverage.said  # the features said so far (tests forget one to hear it again)


def claim(point: Point) -> None:
    PATCHER.claim(point, "plugin")


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
    with PATCHER.lock:
        candidates = [
            p
            for p in POINTS
            if p.module in sys.modules
            and p.key not in PATCHER.claimed
            and PATCHER.applied.get(p.key) != "direct"
            and not superseded(p)
            and not skipped(p)
        ]
        pending = []
        for point in candidates:
            if is_patched(PATCHER.current(point), point):
                continue  # the import hook got there first
            PATCHER.claimed.add(point.key)
            pending.append(point)
    runtime.activate()  # exit flush + import hooks (registered by points.import_targets); idempotent
    install_direct()  # the points of modules not imported yet: patched when SGLang imports them
    registered: list[str] = []
    for point in pending:
        if not module_exists(point.module):
            PATCHER.release(point)
            PATCHER.missing_module(point)
            continue
        try:
            module = importlib.import_module(point.module)
        except Exception as exc:
            PATCHER.release(point)
            not_covered(point, f"cannot be imported ({type(exc).__name__}: {exc})")
            continue
        if owner(module, point.qualname) is None:
            PATCHER.release(point)
            not_covered(point, "not found")
            continue
        claim(point)
        HookRegistry.register(point.target, guarded(point), HookType[point.kind])
        registered.append(point.key)
    return registered

"""``SPECTRACE=1``: trace a whole process with no code change.

``activate()`` is called by the ``.pth`` bootstrap in every interpreter (server
processes and the children they ``spawn`` alike). It installs import hooks only;
torch and the tracing engine (spectrace.hooks) load when the first model library does. Each process
writes its own ``trace-<host>-<pid>[-rank<r>].jsonl`` and flushes at exit and on
SIGTERM.

    $ SPECTRACE=1 SPECTRACE_DIR=traces python my_script.py
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .hooks.identity import ByIdentity
from .importhook import set_error_handler, when_imported
from .settings import Settings, warn

_lock = threading.RLock()
_state: dict[str, Any] = {}


def _env_rank() -> int | None:
    """``SPECTRACE_RANK``, else ``RANK``, parsed once with the other settings: a bad value
    is one warning and no rank, never an exception in the host's constructor."""
    return settings().rank


def settings() -> Settings:
    with _lock:
        if "settings" not in _state:
            _state["settings"] = Settings.from_env()
        return _state["settings"]


def recorder() -> Any:
    """The process recorder (created on first use; imports no torch)."""
    with _lock:
        if "recorder" not in _state:
            from .api import build_recorder

            _state["recorder"] = build_recorder(settings(), settings().dir, rank=_env_rank())
        return _state["recorder"]


def tracer() -> Any:
    """The process tracer (imports torch: call it once a model library is loading)."""
    with _lock:
        if "tracer" not in _state:
            from .hooks.engine import Tracer

            s = settings()
            _state["tracer"] = Tracer(recorder(), stats=s.stats, sample=s.sample, budget=s.budget)
        return _state["tracer"]


def is_active() -> bool:
    return bool(_state.get("active"))


def adopt(model: Any) -> None:
    """Trace ``model`` from its first outermost forward on (idempotent)."""
    try:
        with _lock:
            # By the object, not its id: a model built after another was freed may reuse its id.
            seen: ByIdentity[bool] = _state.setdefault("adopted", ByIdentity())
            if model in seen:
                return
            seen[model] = True
            counts: dict[str, int] = _state.setdefault("names", {})
            base = type(model).__name__
            counts[base] = counts.get(base, 0) + 1
            prefix = base if counts[base] == 1 else f"{base}#{counts[base]}"
        s = settings()
        tracer().adopt(model, prefix, modules=list(s.modules) or None, profile=s.profile or None)
    except Exception as exc:
        recorder().internal_error(f"adopt: {type(exc).__name__}: {exc}")


def _import_target(spec: str) -> Callable[[ModuleType], None]:
    module_name, _, attr = spec.partition(":")

    def callback(module: ModuleType) -> None:
        import importlib

        patch = getattr(importlib.import_module(module_name), attr)
        patch(module)

    return callback


def shutdown() -> None:
    """Flush everything (atexit, SIGTERM); bounded, never raises."""
    with _lock:
        if _state.get("closed"):
            return
        _state["closed"] = True
    try:
        if "tracer" in _state:
            _state["tracer"].finish_step()
        if "recorder" in _state:
            _state["recorder"].close()
    except Exception as exc:
        warn(f"flush at exit failed: {type(exc).__name__}: {exc}")


def _in_forked_child() -> None:
    """A forked child closes its own trace (the recorder gives it its own file), also when
    it leaves the way ``multiprocessing`` children do: by ``os._exit``, skipping atexit."""
    global _lock
    _lock = threading.RLock()  # a thread holding it at the fork does not exist here
    _state.pop("closed", None)
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        # multiprocessing clears its finalizers in the child, then runs these after-fork
        # hooks: the flush registered there runs at the child's exit.
        util.register_after_fork(_fork_token, _flush_at_multiprocessing_exit)


class _ForkToken:
    """What multiprocessing's after-fork registry is keyed on (it holds it weakly)."""


_fork_token = _ForkToken()


def _flush_at_multiprocessing_exit(_token: Any) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, shutdown, exitpriority=100)


def _on_sigterm(previous: Any) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        shutdown()
        if callable(previous):
            previous(signum, frame)
            return
        # Default action: die of SIGTERM as the host expected.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handler


def activate() -> None:
    """Install the import hooks and exit handlers for this process (once)."""
    with _lock:
        if _state.get("active"):
            return
        _state["active"] = True
    s = settings()
    if not s.enabled:
        return
    set_error_handler(lambda message: recorder().coverage("not_covered", message))
    from .integrations import import_targets  # each integration's own list, from its tables

    for module_name, target in import_targets():
        when_imported(module_name, _import_target(target))
    atexit.register(shutdown)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_in_forked_child)
    try:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, None) or callable(previous):
                signal.signal(signal.SIGTERM, _on_sigterm(previous))
    except Exception:
        pass  # some embedders forbid signal handlers; atexit still flushes
    if not s.quiet and os.environ.get("SPECTRACE_ANNOUNCED") != "1":
        os.environ["SPECTRACE_ANNOUNCED"] = "1"  # children inherit it: say it once per tree
        sys.stderr.write(f"spectrace: tracing on; traces go to {os.path.abspath(s.dir)}\n")

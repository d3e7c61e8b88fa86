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


def adopt(model: Any, side: str | None = None) -> None:
    """Trace ``model`` from its first outermost forward on (idempotent).

    ``side`` (``target`` / ``draft``): the part the model plays in an EAGLE-3 pair, when the
    integration that built it knows; it names the model as ``trace({side: model})`` does.
    """
    try:
        with _lock:
            # By the object, not its id: a model built after another was freed may reuse its id.
            seen: ByIdentity[bool] = _state.setdefault("adopted", ByIdentity())
            if model in seen:
                return
            seen[model] = True
            counts: dict[str, int] = _state.setdefault("names", {})
            base = side or type(model).__name__
            counts[base] = counts.get(base, 0) + 1
            prefix = base if counts[base] == 1 else f"{base}#{counts[base]}"
            names: ByIdentity[str] = _state.setdefault("prefixes", ByIdentity())
            names[model] = prefix
        s = settings()
        tracer().adopt(model, prefix, modules=list(s.modules) or None, profile=s.profile or None)
    except Exception as exc:
        recorder().internal_error(f"adopt: {type(exc).__name__}: {exc}")


def release(model: Any) -> None:
    """An explicit ``trace()`` now holds ``model``: the process tracer leaves it (and the
    models adopted inside it) to that trace, so no module is hooked twice. Never raises."""
    try:
        with _lock:
            held = _state.get("tracer")
        if held is not None:
            held.forget(model)
    except Exception as exc:
        recorder().internal_error(f"release: {type(exc).__name__}: {exc}")


def name_of(model: Any) -> str | None:
    """The name an adopted model's modules are recorded under (``draft``, ``draft#2``, ...)."""
    with _lock:
        names: ByIdentity[str] | None = _state.get("prefixes")
        return names.get(model) if names is not None else None


def check_pair(target: Any, draft: Any) -> None:
    """What an adopted target and draft hold, checked once per pair, as ``trace()`` checks the
    models handed to it (the target's capture against the draft's config, ...). Never raises."""
    try:
        with _lock:
            names: ByIdentity[str] = _state.setdefault("prefixes", ByIdentity())
            if target not in names or draft not in names:
                return
            checked: ByIdentity[bool] = _state.setdefault("pairs_checked", ByIdentity())
            if draft in checked:
                return
            checked[draft] = True
            roots = [(names.get(target) or "target", target), (names.get(draft) or "draft", draft)]
        from .api import check_models

        rec = recorder()
        check_models(rec, roots, rec.records(), tracer().roles.values())
    except Exception as exc:
        recorder().internal_error(f"pair check: {type(exc).__name__}: {exc}")


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
        _say_if_nothing_known()
        if "tracer" in _state:
            _state["tracer"].finish_step()
        if "recorder" in _state:
            _state["recorder"].close()
    except Exception as exc:
        warn(f"flush at exit failed: {type(exc).__name__}: {exc}")


NOTHING_KNOWN = (
    "SPECTRACE=1 saw no model it knows in this process: it adopts Hugging Face transformers models, "
    "SGLang's and vLLM's model classes and spectrace's reference pair as they are built; "
    "trace another model with spectrace.trace(model)"
)


def _say_if_nothing_known() -> None:
    """A program that ran torch models but none spectrace adopts gets a trace that says so,
    once, instead of no trace at all. Engines' helper processes (tokenizers, schedulers
    before their model) and a spawned child are left alone: their models live elsewhere."""
    if not settings().enabled or _state.get("adopted") or "torch" not in sys.modules:
        return
    from .integrations import ENGINE_PACKAGES

    if any(name in sys.modules for name in ENGINE_PACKAGES):
        return
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return
    recorder().coverage("not_covered", NOTHING_KNOWN)


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

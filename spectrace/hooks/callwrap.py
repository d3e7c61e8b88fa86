"""Module calls seen through the module's class ``forward``, not through torch's hooks.

Once a module holds any forward hook, torch runs its whole hook path on every call (the
global hook dicts, the pre-hooks, ``inner()``, the forward hooks); that path alone cost
more host time than spectrace's own hooks in an eager decode step. So a traced module
with a plain class ``forward`` gets a wrapper on its *class* instead: the wrapper finds
the instance in a registry keyed by identity (held weakly) and hands the call to
spectrace's ``around`` function, which runs the original forward between its pre-hook
and post-hook work (one entry per call: a kept call notes and keeps in one place). A deep copy, an unpickled model or any untraced instance of the class finds
nothing there and runs the class's own forward, one dict lookup later (as
:mod:`.stepwrap` does for roots).

The engine falls back to torch's hooks for a module whose ``forward`` is an instance
attribute (another library's wrapper) or not a plain function, and for a root.

    >>> handle = install(layer, around, pre, post)   # around(module, original, args, kwargs)
    >>> handle.remove()
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .stepwrap import release_patch

Pre = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
Post = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]
# around(module, original forward, args, kwargs) -> the forward's output
Around = Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

_is_compiling = torch.compiler.is_compiling
_jit_tracing = torch._C._is_tracing  # torch.jit.trace: eager Python on tracer tensors
_lock = threading.RLock()
# id(instance) -> (weak reference, around, pre-hook or None, post-hook). Read without the
# lock on every call (a dict lookup is atomic); changed under it. The wrapper calls
# ``around`` alone; the hooks are kept for those who ask (hooks_of).
_calls: dict[int, tuple[weakref.ref, Around, Pre | None, Post]] = {}
# class -> [had its own forward attribute, that attribute, our wrapper, traced instances]
_class_patches: dict[type, list[Any]] = {}


def wrappable(module: Any) -> bool:
    """Whether ``module``'s calls can be seen through its class's ``forward``."""
    if "forward" in module.__dict__ or id(module) in _calls:
        return False
    forward = getattr(type(module), "forward", None)
    return inspect.isfunction(forward)


def _class_wrapper(cls: type, original: Callable[..., Any], patch: list[Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Never inside a compiled graph (asked first: dynamo folds it to a constant and
        # traces none of the lookups below, so the compiled graph is the untraced one),
        # nor a torch.jit.trace (its tensors hold no numbers; a statistic would be traced).
        if _is_compiling() or _jit_tracing():
            return original(self, *args, **kwargs)
        entry = _calls.get(id(self))
        # Only instances of exactly this class (a subclass instance calling super().forward
        # is traced by its own class's wrapper), only the traced object itself (an id
        # reused after it died), and only while this wrapper is the class's patch (one left
        # inside another library's wrapper when released must not fire next to a newer one).
        if entry is None or type(self) is not cls or entry[0]() is not self or _class_patches.get(cls) is not patch:
            return original(self, *args, **kwargs)
        return entry[1](self, original, args, kwargs)

    forward.__spectrace_call_wrapper__ = True  # type: ignore[attr-defined]
    return forward


class Handle:
    """Stops tracing one module's calls (idempotent)."""

    def __init__(self, module: Any) -> None:
        self._module = weakref.ref(module)
        self._key = id(module)
        self._removed = False

    def remove(self) -> None:
        with _lock:
            if self._removed:
                return
            self._removed = True
            module = self._module()
            entry = _calls.get(self._key)
            if module is None or entry is None or entry[0]() is not module:
                return
            del _calls[self._key]
            _release_class(type(module))


def install(module: Any, around: Around, pre: Pre | None = None, post: Post | None = None) -> Handle:
    """Hand every call of ``module`` to ``around(module, original, args, kwargs)`` until the
    handle is removed (:func:`wrappable` must hold). ``pre`` and ``post``: the hooks it runs,
    for :func:`hooks_of`."""
    with _lock:
        key = id(module)
        ref = weakref.ref(module, functools.partial(_forget, key, cls=type(module)))
        _calls[key] = (ref, around, pre, post)
        cls = type(module)
        patch = _class_patches.get(cls)
        if patch is not None:
            patch[3] += 1
        else:
            patch = [("forward" in cls.__dict__), cls.__dict__.get("forward"), None, 1]
            patch[2] = wrapper = _class_wrapper(cls, cls.forward, patch)  # type: ignore[attr-defined]
            _class_patches[cls] = patch
            cls.forward = wrapper  # type: ignore[attr-defined]
    return Handle(module)


def hooks_of(module: Any) -> tuple[Pre | None, Post | None] | None:
    """The (pre-hook, post-hook) that ``module``'s calls go through, or None."""
    entry = _calls.get(id(module))
    if entry is None or entry[0]() is not module:
        return None
    return entry[2], entry[3]


def retime(
    module: Any, timed: Callable[[Callable[..., Any]], Callable[..., Any]], excluded: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> bool:
    """Put a benchmark's timer around ``module``'s calls: ``timed(fn)`` counts fn's time,
    ``excluded(fn)`` takes it back (the original forward, run inside). False if untraced."""
    with _lock:
        entry = _calls.get(id(module))
        if entry is None or entry[0]() is not module:
            return False
        around, untimed = entry[1], {}

        def run(mod: Any, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            inner = untimed.get(original)
            if inner is None:
                inner = untimed[original] = excluded(original)
            return around(mod, inner, args, kwargs)

        _calls[id(module)] = (entry[0], timed(run), entry[2], entry[3])
        return True


def _forget(key: int, ref: weakref.ref, cls: type) -> None:
    try:
        with _lock:
            entry = _calls.get(key)
            if entry is not None and entry[0] is ref:
                del _calls[key]
                _release_class(cls)
    except Exception:  # (at interpreter exit this module's globals may be gone)
        pass


def _release_class(cls: type) -> None:
    """One traced instance of ``cls`` fewer; the last one restores the class's forward."""
    release_patch(_class_patches, cls)

"""Make every call of a root module's ``forward`` a traced step, leaving the instance alone.

SGLang calls ``model.forward()`` directly, so a hook on the root would never fire: the
forward itself must be wrapped. A closure stored on the instance (``model.forward =
wrapper``) breaks three things users do with traced models: ``copy.deepcopy`` shares the
closure, so a copy with other weights ran the *original's* forward; ``pickle`` and
``torch.save`` fail on it. So the wrapper sits on the module's *class* and looks the
instance up in a registry keyed by identity (held weakly): a deep copy, an unpickled
model or any untraced instance of the same class finds nothing there and runs the class's
own forward, one dict lookup later.

An instance that already has its own ``forward`` attribute (another library's wrapper)
gets an instance-level :class:`_InstanceForward` instead; it deep-copies and pickles as
the forward it wraps, so copies are untraced and run their own weights.

    >>> handle = install(model, tracer_step)   # tracer_step(root, call, args, kwargs)
    >>> model(ids)                             # one step
    >>> handle.remove()
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

# A tracer's step: (root, forward-to-call, args, kwargs) -> the forward's result. It may
# carry a ``compiled(kind)`` attribute, called when torch.compile ("compile"), torch.export
# ("export") or torch.jit.trace ("jit") traces the root: the graph made is the untraced one.
StepFn = Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

# Re-entrant: a weak-reference callback (a traced model collected) may run inside a
# garbage collection triggered while this thread holds it.
_lock = threading.RLock()
# id(instance) -> (weak reference, the step functions on it innermost first, the class
# patched for it or None). Read without the lock on every forward (a dict lookup is
# atomic); changed under it.
_traced: dict[int, tuple[weakref.ref, list[StepFn], type | None]] = {}
# class -> its patch: (had its own forward attribute, that attribute, our wrapper, users).
_class_patches: dict[type, list[Any]] = {}


def _steps_of(module: Any) -> list[StepFn] | None:
    entry = _traced.get(id(module))
    if entry is None or entry[0]() is not module:  # an id reused after the traced one died
        return None
    return entry[1]


# torch.jit.trace runs the forward eagerly on tracer tensors: nothing of ours may run
# then (a statistic would be traced into the graph and its value is no number).
_jit_tracing = torch._C._is_tracing


def untraceable() -> bool:
    """Whether the current call is being turned into a graph (torch.compile, torch.export,
    torch.jit.trace): hooks then record nothing. Asked first in a wrapper: under dynamo
    ``is_compiling`` folds to a constant and the jit question is never traced."""
    return torch.compiler.is_compiling() or _jit_tracing()


def _compiled() -> None:
    """Under ``torch.compile`` or ``torch.export``: no step and no side effect in the graph
    (no graph break; the compiled model is the untraced one). Tracers hear of it at trace
    time: through dynamo's comptime when dynamo traces (compile, strict export), at once
    when torch.export traces the Python itself (non-strict, real Python)."""
    if torch.compiler.is_dynamo_compiling():
        from torch._dynamo.comptime import comptime

        comptime(_notify_compiled)
    else:
        _notify("export" if torch.compiler.is_exporting() else "compile")


def _notify_compiled(ctx: Any = None) -> None:
    # Runs while dynamo traces, with real objects.
    _notify("export" if torch.compiler.is_exporting() else "compile")


def _notify(kind: str) -> None:
    """Every tracer with a wrapped root is told (a traced frame does not say which root it
    came from); a tracer says it once (Recorder.coverage)."""
    for _ref, steps, _cls in list(_traced.values()):
        for step in steps:
            notify = getattr(step, "compiled", None)
            if notify is not None:
                try:
                    notify(kind)
                except Exception:
                    pass


def _chain(steps: list[StepFn], module: Any, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``forward`` inside every step function, the most recently installed outermost."""
    call = forward
    for step in steps:
        call = _bind(step, module, call)
    return call(*args, **kwargs)


def _bind(step: StepFn, module: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return step(module, inner, args, kwargs)

    return call


def _class_wrapper(cls: type, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Only instances of exactly this class: a subclass instance is traced by its own
        # class's wrapper, which calls this one as its original.
        steps = _steps_of(self) if type(self) is cls else None
        if not steps:
            return original(self, *args, **kwargs)
        if torch.compiler.is_compiling():
            _compiled()
            return original(self, *args, **kwargs)
        if _jit_tracing():
            _notify("jit")
            return original(self, *args, **kwargs)
        return _chain(steps, self, functools.partial(original, self), args, kwargs)

    forward.__spectrace_step_wrapper__ = True  # type: ignore[attr-defined]
    return forward


class _InstanceForward:
    """An instance-level forward wrapper that copies and pickles as what it wraps."""

    def __init__(self, module: Any, original: Callable[..., Any]) -> None:
        self._module = weakref.ref(module)
        self.__wrapped__ = original  # inspect.signature follows it (HF inspects forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module()
        steps = _steps_of(module) if module is not None else None
        if not steps:
            return self.__wrapped__(*args, **kwargs)
        if torch.compiler.is_compiling():
            _compiled()
            return self.__wrapped__(*args, **kwargs)
        if _jit_tracing():
            _notify("jit")
            return self.__wrapped__(*args, **kwargs)
        return _chain(steps, module, self.__wrapped__, args, kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # A copy gets the wrapped forward, copied as it would have been without tracing
        # (a bound method is re-bound to the copy): untraced, its own weights.
        return copy.deepcopy(self.__wrapped__, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


class Handle:
    """Removes one step function from one module (idempotent)."""

    def __init__(self, module: Any, step: StepFn) -> None:
        self._module = weakref.ref(module)
        self._step = step
        self._removed = False

    def remove(self) -> None:
        with _lock:
            if self._removed:
                return
            self._removed = True
            module = self._module()
            entry = _traced.get(id(module)) if module is not None else None
            if entry is None or entry[0]() is not module:
                return
            steps = [s for s in entry[1] if s is not self._step]
            if steps:
                _traced[id(module)] = (entry[0], steps, entry[2])
                return
            del _traced[id(module)]
            _unpatch(module, entry[2])


def install(module: Any, step: StepFn) -> Handle:
    """Run ``step`` around every call of ``module.forward`` until the handle is removed."""
    with _lock:
        entry = _traced.get(id(module))
        if entry is not None and entry[0]() is module:
            _traced[id(module)] = (entry[0], [*entry[1], step], entry[2])
        else:
            key = id(module)
            ref = weakref.ref(module, lambda _r, key=key: _forget(key, _r))
            _traced[key] = (ref, [step], _patch(module))
    return Handle(module, step)


def _forget(key: int, ref: weakref.ref) -> None:
    with _lock:
        entry = _traced.get(key)
        if entry is not None and entry[0] is ref:
            del _traced[key]
            if entry[2] is not None:
                _release_class(entry[2])


def _patch(module: Any) -> type | None:
    """Wrap the forward that ``module`` runs; returns the class patched, or None."""
    own = module.__dict__.get("forward")
    if own is not None:
        if not isinstance(own, _InstanceForward):
            module.__dict__["forward"] = _InstanceForward(module, own)
        return None
    cls = type(module)
    patch = _class_patches.get(cls)
    if patch is not None:
        patch[3] += 1
        return cls
    had = "forward" in cls.__dict__
    wrapper = _class_wrapper(cls, cls.forward)
    _class_patches[cls] = [had, cls.__dict__.get("forward"), wrapper, 1]
    cls.forward = wrapper
    return cls


def _unpatch(module: Any, cls: type | None) -> None:
    own = module.__dict__.get("forward")
    if isinstance(own, _InstanceForward):
        module.__dict__["forward"] = own.__wrapped__
    if cls is not None:
        _release_class(cls)


def _release_class(cls: type) -> None:
    release_patch(_class_patches, cls)


def release_patch(patches: dict[type, list[Any]], cls: type) -> None:
    """One traced instance of ``cls`` fewer in ``patches`` (class -> [had its own forward,
    that forward, our wrapper, traced instances]); the last one restores the forward."""
    patch = patches.get(cls)
    if patch is None:
        return
    patch[3] -= 1
    if patch[3] > 0:
        return
    del patches[cls]
    had, original, wrapper, _ = patch
    if cls.__dict__.get("forward") is not wrapper:
        return  # someone patched on top of ours: ours stays as a pass-through
    if had:
        cls.forward = original
    else:
        delattr(cls, "forward")

"""One call of an engine's draft ``load_weights``, run under spectrace's observer.

Both engines' AROUND hooks on the draft's load hand the weights to
``spectrace.hooks.weights.observe_load``, which runs the engine's load inside. Whose error
is whose decides what happens: an error of the load itself is the engine's and is raised
unchanged; an error of spectrace's own before the load ran is counted, and the engine's
load then runs as if spectrace were not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


# ------------------------------------------------------------------ weights replaced after load
#
# What the draft loaded, fingerprinted once at the end of its load: per parameter its
# object, its storage pointer and a few values at fixed positions. Compared once later
# (the first forward, graph capture), this says which trained tensors an engine step
# replaced after the load: SGLang's ``set_embed_and_head`` swaps in the target's
# Parameter objects, so the object and the storage change; an in-place copy changes only
# the values. A handful of values per tensor keeps this at load-time cost.

LOADED_SAMPLES = 16  # values read per parameter, spread evenly over it


@dataclass(frozen=True)
class LoadedParam:
    """One parameter as the load left it."""

    name: str
    obj_id: int
    data_ptr: int
    shape: tuple[int, ...]
    samples: tuple[float, ...]


@dataclass(frozen=True)
class ChangedParam:
    """A loaded parameter that differs now. ``how``: ``replaced`` (another tensor object or
    storage now), ``changed`` (the same storage, other values); ``shared_with``: the
    other model's parameter whose storage it now is, when known."""

    name: str
    how: str
    shape_then: tuple[int, ...]
    shape_now: tuple[int, ...]
    shared_with: str | None = None


def _positions(numel: int) -> list[int]:
    count = min(LOADED_SAMPLES, numel)
    if count <= 1:
        return [0] * count
    return [round(i * (numel - 1) / (count - 1)) for i in range(count)]


def _sample(tensor: Any) -> tuple[float, ...] | None:
    """The values at the fixed positions, read to the host (None: unreadable). Tensor methods
    only: this package stays free of torch imports (the engine folders bring torch)."""
    t = tensor.detach()
    if t.is_meta or t.numel() == 0 or t.is_complex():
        return None
    try:
        flat = t.reshape(-1)
        # The positions as int64 from the start: new_tensor takes flat's dtype, and a float16
        # (bfloat16) copy rounds positions past 2048 (256) up, out of bounds (a device-side
        # assert on the GPU, which kills the server).
        index = flat.new_zeros(0).long().new_tensor(_positions(flat.numel()))
        return tuple(flat[index].double().tolist())
    except Exception:  # quantized or packed layouts: identity and storage still compare
        return None


def fingerprint_loaded(model: Any, names: Iterable[str]) -> dict[str, LoadedParam]:
    """What the load left in each of ``names`` (the parameters the checkpoint wrote).
    Load time, once: one small host read per parameter."""
    params = dict(model.named_parameters(remove_duplicate=False))
    out: dict[str, LoadedParam] = {}
    for name in names:
        param = params.get(name)
        if param is None:
            continue
        values = _sample(param)
        if values is not None:
            out[name] = LoadedParam(name, id(param), int(param.data_ptr()), tuple(param.shape), values)
    return out


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    # NaN == NaN here: a parameter left uninitialised is not "changed" by being read twice.
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def changed_since_load(model: Any, loaded: dict[str, LoadedParam], others: dict[int, str] | None = None) -> list[ChangedParam]:
    """The loaded parameters that differ now, by object, storage or values.

    ``others`` maps storage pointers of another model's parameters (the target's) to their
    names, so a parameter that now shares one says whose it is. A tensor replaced by one of
    the very same values (a trainer that froze the target's embedding) is not a change."""
    params = dict(model.named_parameters(remove_duplicate=False))
    changed: list[ChangedParam] = []
    for name, then in loaded.items():
        param = params.get(name)
        if param is None:
            continue
        shape = tuple(param.shape)
        values = _sample(param)
        moved = id(param) != then.obj_id or int(param.data_ptr()) != then.data_ptr
        differs = shape != then.shape or (values is not None and not _same(values, then.samples))
        if not differs:
            continue
        shared = (others or {}).get(int(param.data_ptr())) if moved else None
        changed.append(ChangedParam(then.name, "replaced" if moved else "changed", then.shape, shape, shared))
    return changed


class ReplacementWatch:
    """A forward pre-hook that compares what the load wrote with what the draft runs.

    ``moment()`` names the comparison about to happen (``first forward``, ``CUDA-graph
    capture``) or returns None when none may run now (a stream is capturing: no host
    read); ``final(moment)`` says whether the hook is done after it; ``report(changes,
    moment)`` turns what changed into findings (the engine's words). Each parameter is
    said once; a failure is handed to ``on_error`` and removes the hook."""

    def __init__(
        self,
        model: Any,
        loaded: dict[str, LoadedParam],
        *,
        moment: Callable[[bool], str | None],
        final: Callable[[str], bool],
        report: Callable[[list[ChangedParam], str], None],
        others: Callable[[Any], dict[int, str]] | None = None,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        import weakref

        self.model = weakref.ref(model)
        self.loaded = loaded
        self.compared = False  # has one comparison run (the first forward's)
        self.handle: Any = None
        self._moment, self._final, self._report, self._others, self._on_error = moment, final, report, others, on_error

    def attach(self, module: Any) -> ReplacementWatch:
        self.handle = module.register_forward_pre_hook(self)
        return self

    def __call__(self, module: Any, args: Any) -> None:
        try:
            moment = self._moment(self.compared)
            if moment is None:
                return None
            model = self.model()
            if model is None:
                self.remove()
                return None
            self.compare(model, moment)
            self.compared = True
            if self._final(moment):
                self.remove()
        except Exception as exc:
            self.remove()
            self._on_error("draft weights after load", exc)
        return None

    def compare(self, model: Any, moment: str) -> None:
        changed = changed_since_load(model, self.loaded, self._others(model) if self._others else None)
        if changed:
            gone = {c.name for c in changed}
            self.loaded = {k: v for k, v in self.loaded.items() if k not in gone}  # each said once
            self._report(changed, moment)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def watch_replacements(model: Any, module: Any, written: Iterable[str], **hooks: Any) -> ReplacementWatch | None:
    """Fingerprint ``written`` on ``model`` now and compare at ``module``'s forwards (see
    :class:`ReplacementWatch` for ``hooks``). A second load replaces the first's watch."""
    loaded = fingerprint_loaded(model, written)
    old = model.__dict__.get("_spectrace_replacement_watch")
    if old is not None:
        old.remove()
    if not loaded:
        return None
    watch = ReplacementWatch(model, loaded, **hooks).attach(module)
    model.__dict__["_spectrace_replacement_watch"] = watch
    return watch

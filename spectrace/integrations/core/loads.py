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
# the values. A handful of values per tensor keeps this at load-time cost: one gather and
# one host read for all of them.

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


def _positions(numel: int) -> Any:
    import torch

    count = min(LOADED_SAMPLES, numel)
    return torch.linspace(0, numel - 1, steps=count).long() if count else torch.zeros(0, dtype=torch.long)


def _sample(tensor: Any) -> Any | None:
    """The values at the fixed positions, as float64 on the tensor's device (None: unreadable)."""
    import torch

    t = tensor.detach()
    if t.is_meta or t.numel() == 0 or t.is_complex():
        return None
    try:
        return t.reshape(-1)[_positions(t.numel()).to(t.device)].to(dtype=torch.float64)
    except Exception:  # quantized or packed layouts: identity and storage still compare
        return None


def _read(tensors: list[Any]) -> list[tuple[float, ...]]:
    """Every sample to the host in one read (one device sync for the whole model)."""
    import torch

    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1).to("cpu") if t.device.type != "cpu" else t.reshape(-1) for t in tensors]).tolist()
    out: list[tuple[float, ...]] = []
    at = 0
    for t in tensors:
        out.append(tuple(flat[at : at + t.numel()]))
        at += t.numel()
    return out


def fingerprint_loaded(model: Any, names: Iterable[str]) -> dict[str, LoadedParam]:
    """What the load left in each of ``names`` (the parameters the checkpoint wrote)."""
    import torch

    params = dict(model.named_parameters(remove_duplicate=False))
    kept: list[tuple[str, Any, Any]] = []
    with torch.no_grad():
        for name in names:
            param = params.get(name)
            if param is None:
                continue
            sample = _sample(param)
            if sample is not None:
                kept.append((name, param, sample))
        values = _read([s for _, _, s in kept])
    return {
        name: LoadedParam(name, id(param), int(param.data_ptr()), tuple(param.shape), vals) for (name, param, _), vals in zip(kept, values)
    }


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    # NaN == NaN here: a parameter left uninitialised is not "changed" by being read twice.
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def changed_since_load(model: Any, loaded: dict[str, LoadedParam], others: dict[int, str] | None = None) -> list[ChangedParam]:
    """The loaded parameters that differ now, by object, storage or values (one host read).

    ``others`` maps storage pointers of another model's parameters (the target's) to their
    names, so a parameter that now shares one says whose it is. A tensor replaced by one of
    the very same values (a trainer that froze the target's embedding) is not a change."""
    import torch

    params = dict(model.named_parameters(remove_duplicate=False))
    now: list[tuple[LoadedParam, Any, Any]] = []
    with torch.no_grad():
        for name, then in loaded.items():
            param = params.get(name)
            if param is None:
                continue
            now.append((then, param, _sample(param)))
        values = _read([s for _, _, s in now if s is not None])
    changed: list[ChangedParam] = []
    it = iter(values)
    for then, param, sample in now:
        vals = next(it) if sample is not None else None
        shape = tuple(param.shape)
        moved = id(param) != then.obj_id or int(param.data_ptr()) != then.data_ptr
        differs = shape != then.shape or (vals is not None and not _same(vals, then.samples))
        if not differs:
            continue
        shared = (others or {}).get(int(param.data_ptr())) if moved else None
        changed.append(ChangedParam(then.name, "replaced" if moved else "changed", then.shape, shape, shared))
    return changed

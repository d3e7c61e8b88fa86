"""Watch a ``load_weights`` call: which names were offered, which parameters written.

Engines (SGLang, the reference draft) load through ``param.weight_loader`` while
iterating over ``(name, tensor)`` pairs. :func:`observe_load` wraps every parameter's
loader and the iterable itself, so each loader call is attributed to the name being
loaded at that moment. A name during which no loader ran was dropped; a parameter no
loader touched (and whose bits did not change) is missing. The load itself runs
unchanged: same tensors, same order, same loaders.

"Written" is decided by the loader calls first. For loaders that copy straight into
``param.data`` (no ``weight_loader`` call) a change test backs them up: it compares
the parameter's identity, storage pointer, dtype, shape and its BIT PATTERN (the
storage viewed as an integer dtype of the same width), never float values. On a GPU
parameters start as uninitialised memory, often NaN, and ``NaN != NaN``: a float
comparison would call every untouched parameter "changed" and hide a missing one.

    >>> report = observe_load(draft, draft.load_weights, checkpoint.items(), module="draft")
    >>> report.ignored
    ['layers.0.self_attn.q_proj.weight', ...]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..records import Weights

# Names SGLang consumes without a weight_loader call (they set an attribute instead),
# mapped to the attribute that changes.
ATTRIBUTE_LOADS = {"d2t": "hot_token_id"}
# Names an engine skips on purpose (not a dropped trained weight).
SKIPPED_BY_DESIGN = {"t2d"}

# Tensors up to this size keep an exact copy of their bits (within a total budget);
# larger ones keep two integer checksums. Checksums run in chunks, so the scratch
# memory per parameter stays bounded (a few times _CHUNK int64s), whatever its size.
_SMALL_BYTES = 64 * 1024
_COPY_BUDGET_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 22
# 0x9E3779B97F4A7C15 (2^64 / golden ratio) as a signed int64: spreads position weights.
_GOLDEN = -7046029254386353131
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _default_loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """What the engines do for a parameter without a ``weight_loader`` (SGLang's and vLLM's
    ``default_weight_loader``, the same in both): a scalar takes a scalar, anything else must
    match in shape. A plain ``copy_`` would broadcast a misfit the engine refuses, or raise
    another error than the engine's, and so change what the host sees."""
    if param.numel() == 1 and loaded.numel() == 1:
        param.data.copy_(loaded.view(param.shape))
        return
    assert param.size() == loaded.size(), f"Attempted to load weight ({loaded.size()}) into parameter ({param.size()})"
    param.data.copy_(loaded)


@dataclass(frozen=True)
class Fingerprint:
    """What a parameter looked like before the load. ``comparable`` False (meta
    tensors, layouts without a storage): only loader calls can say it was written."""

    obj_id: int
    comparable: bool
    data_ptr: int = 0
    dtype: Any = None
    shape: tuple[int, ...] = ()
    digest: tuple[int, int] | None = None
    bits: torch.Tensor | None = None  # an exact copy of the bits (small tensors)


def _bits(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor's elements as a flat integer tensor of the same width: its bit
    patterns (a view when the tensor is contiguous). None when there are no bits to read."""
    t = tensor.detach()
    if t.is_meta or t.layout != torch.strided or t.is_quantized:
        return None
    flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
    width = flat.element_size()
    target = _INT_OF_WIDTH.get(width, torch.uint8)
    try:
        return flat if flat.dtype == target else flat.view(target)
    except (RuntimeError, TypeError):
        try:
            return flat.view(torch.uint8)
        except (RuntimeError, TypeError):
            return None


def _digest(bits: torch.Tensor) -> tuple[int, int]:
    """Two checksums of integer ``bits``, on their device, with int64 wraparound: the
    plain sum and a sum weighted by odd position-dependent factors. Any change to a
    single element changes the weighted sum (an odd factor times a nonzero difference
    is nonzero mod 2^64); several changes cancelling in both sums is vanishingly rare."""
    n = bits.numel()
    if n == 0:
        return (0, 0)
    plain = torch.zeros((), dtype=torch.int64, device=bits.device)
    weighted = torch.zeros((), dtype=torch.int64, device=bits.device)
    for start in range(0, n, _CHUNK):
        chunk = bits[start : start + _CHUNK].to(torch.int64)  # may alias int64 bits: no in-place ops on it
        weights = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=bits.device)
        weights.mul_(_GOLDEN).bitwise_or_(1)
        plain += chunk.sum()
        weighted += torch.mul(chunk, weights).sum()
    a, b = torch.stack([plain, weighted]).tolist()
    return (int(a), int(b))


def _fingerprint(tensor: torch.Tensor, budget: list[int] | None = None) -> Fingerprint:
    """Identity, storage pointer and bit pattern of ``tensor``; load time only, never per step.

    ``budget`` (bytes left for exact copies, updated in place) lets small tensors keep a
    copy of their bits; without it every tensor gets checksums."""
    with torch.no_grad():
        bits = _bits(tensor)
        if bits is None:
            return Fingerprint(obj_id=id(tensor), comparable=False)
        size = bits.numel() * bits.element_size()
        common = dict(obj_id=id(tensor), comparable=True, data_ptr=tensor.data_ptr(), dtype=tensor.dtype, shape=tuple(tensor.shape))
        if budget is not None and size <= _SMALL_BYTES and size <= budget[0]:
            budget[0] -= size
            return Fingerprint(**common, bits=bits.clone())
        return Fingerprint(**common, digest=_digest(bits))


def changed(before: Fingerprint, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` differs from what ``before`` saw: another object, another
    storage, dtype or shape, or other bits. Exact and NaN-safe (bits, not floats).
    Not comparable (meta) on either side: False unless the object itself was replaced."""
    if id(tensor) != before.obj_id:
        return True  # a re-assigned Parameter
    if not before.comparable:
        return False
    with torch.no_grad():
        bits = _bits(tensor)
        if bits is None:
            return False
        if tensor.data_ptr() != before.data_ptr or tensor.dtype != before.dtype or tuple(tensor.shape) != before.shape:
            return True
        if before.bits is not None:
            same = bits.dtype == before.bits.dtype and bits.shape == before.bits.shape and torch.equal(bits, before.bits)
            return not same
        return _digest(bits) != before.digest


def _last_part(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _loader_slot(param: torch.Tensor) -> str:
    """Where ``param`` keeps its loader: ``weight_loader`` in its ``__dict__`` (SGLang's
    ``set_weight_attrs``, or nothing yet), or ``_weight_loader`` behind SGLang's read-only
    ``BasevLLMParameter.weight_loader`` property."""
    if "weight_loader" not in param.__dict__ and isinstance(getattr(type(param), "weight_loader", None), property):
        if "_weight_loader" in param.__dict__:
            return "_weight_loader"
    return "weight_loader"


def observe_load(
    model: nn.Module,
    load: Callable[[Iterable[tuple[str, torch.Tensor]]], Any],
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    module: str,
    exempt: Iterable[str] = (),
    source: str = "",
) -> tuple[Any, Weights]:
    """Run ``load(weights)`` and report what it did; ``exempt`` params may stay unwritten."""
    params = dict(model.named_parameters())  # keeps the objects alive: their ids stay unique
    budget = [_COPY_BUDGET_BYTES]
    before = {name: _fingerprint(p, budget) for name, p in params.items()}  # one parameter at a time
    attrs_before = {attr: _attr_value(model, attr) for attr in ATTRIBUTE_LOADS.values()}
    offered: list[str] = []
    consumed: set[str] = set()
    written: set[str] = set()
    current: list[str] = [""]

    originals: dict[str, tuple[str, bool, Any]] = {}
    try:
        for name, param in params.items():
            slot = _loader_slot(param)
            had = slot in param.__dict__
            original = param.__dict__.get(slot)
            # What the engine's getattr would find: the instance's loader, a class-level
            # one, else the default copy.
            inner = original if had else getattr(param, slot, _default_loader)

            def make(inner: Callable[..., Any], pname: str) -> Callable[..., Any]:
                @functools.wraps(inner)
                def loader(*args: Any, **kwargs: Any) -> Any:
                    consumed.add(current[0])
                    written.add(pname)
                    return inner(*args, **kwargs)

                return loader

            try:
                setattr(param, slot, make(inner, name))
            except (AttributeError, TypeError):
                continue  # a loader slot we cannot wrap: the change test still sees this parameter
            originals[name] = (slot, had, original)

        def feed() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                current[0] = name
                offered.append(name)
                yield name, tensor
            current[0] = ""

        result = load(feed())
    finally:
        for name, (slot, had, original) in originals.items():
            param = params[name]
            if had:
                setattr(param, slot, original)
            else:
                param.__dict__.pop(slot, None)

    # Loaders that bypass weight_loader (direct copies, re-assigned parameters) still
    # change the bits, the storage or the object.
    for name, param in model.named_parameters():
        if name in before and name not in written and changed(before[name], param):
            written.add(name)
    for key, attr in ATTRIBUTE_LOADS.items():
        if _attr_value(model, attr) is not attrs_before[attr]:
            consumed.update(n for n in offered if _last_part(n) == key)
            written.add(attr)
    ignored = [n for n in offered if n not in consumed and _last_part(n) not in SKIPPED_BY_DESIGN]
    exempt_set = set(exempt)
    missing = [n for n in params if n not in written and n not in exempt_set]
    return result, Weights(module=module, offered=offered, written=sorted(written), ignored=ignored, missing=missing, source=source)


def _attr_value(model: nn.Module, attr: str) -> torch.Tensor | None:
    for module in model.modules():
        value = getattr(module, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    return None

"""Watch a ``load_weights`` call: which names were offered, which parameters written.

Engines (SGLang, the reference draft) load through ``param.weight_loader`` while
iterating over ``(name, tensor)`` pairs. :func:`observe_load` wraps every parameter's
loader and the iterable itself, so each loader call is attributed to the name being
loaded at that moment. A name during which no loader ran was dropped; a parameter no
loader touched (and whose values did not change) is missing. The load itself runs
unchanged: same tensors, same order, same loaders.

    >>> report = observe_load(draft, draft.load_weights, checkpoint.items(), module="draft")
    >>> report.ignored
    ['layers.0.self_attn.q_proj.weight', ...]
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn as nn

from ..records import Weights

# Names SGLang consumes without a weight_loader call (they set an attribute instead),
# mapped to the attribute that changes.
ATTRIBUTE_LOADS = {"d2t": "hot_token_id"}
# Names an engine skips on purpose (not a dropped trained weight).
SKIPPED_BY_DESIGN = {"t2d"}


def _default_loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


def _fingerprint(tensor: torch.Tensor) -> tuple[int, int, float]:
    # Identity plus a cheap checksum; runs at load time only, never per step.
    with torch.no_grad():
        return (id(tensor), tensor.data_ptr(), float(tensor.detach().float().sum().item()) if tensor.numel() else 0.0)


def _last_part(name: str) -> str:
    return name.rsplit(".", 1)[-1]


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
    params = dict(model.named_parameters())
    before = {name: _fingerprint(p) for name, p in params.items()}
    attrs_before = {attr: _attr_id(model, attr) for attr in ATTRIBUTE_LOADS.values()}
    offered: list[str] = []
    consumed: set[str] = set()
    written: set[str] = set()
    current: list[str] = [""]

    originals: dict[str, Any] = {}
    for name, param in params.items():
        had = "weight_loader" in param.__dict__
        originals[name] = param.__dict__.get("weight_loader") if had else None
        inner = param.__dict__.get("weight_loader", _default_loader)

        def make(inner: Callable[..., Any], pname: str) -> Callable[..., Any]:
            @functools.wraps(inner)
            def loader(*args: Any, **kwargs: Any) -> Any:
                consumed.add(current[0])
                written.add(pname)
                return inner(*args, **kwargs)

            return loader

        param.weight_loader = make(inner, name)  # type: ignore[attr-defined]

    def feed() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            current[0] = name
            offered.append(name)
            yield name, tensor
        current[0] = ""

    try:
        result = load(feed())
    finally:
        for name, param in params.items():
            if originals[name] is None:
                param.__dict__.pop("weight_loader", None)
            else:
                param.weight_loader = originals[name]  # type: ignore[attr-defined]

    # Loaders that bypass weight_loader (direct copies) still change the values.
    for name, param in model.named_parameters():
        if name in before and _fingerprint(param) != before[name]:
            written.add(name)
    for key, attr in ATTRIBUTE_LOADS.items():
        if _attr_id(model, attr) != attrs_before[attr]:
            consumed.update(n for n in offered if _last_part(n) == key)
            written.add(attr)
    ignored = [n for n in offered if n not in consumed and _last_part(n) not in SKIPPED_BY_DESIGN]
    exempt_set = set(exempt)
    missing = [n for n in params if n not in written and n not in exempt_set]
    return result, Weights(
        module=module, offered=offered, written=sorted(written), ignored=ignored, missing=missing, source=source
    )


def _attr_id(model: nn.Module, attr: str) -> int | None:
    for module in model.modules():
        value = getattr(module, attr, None)
        if isinstance(value, torch.Tensor):
            return id(value)
    return None

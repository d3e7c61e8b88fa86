"""Find the tensors in whatever a module takes or returns.

Inputs and outputs may be tensors, tuples, lists, dicts, or ModelOutput dataclasses;
each tensor found is named by where it sat (``input[0]``, ``kwarg.hidden_states``,
``output.logits``) so a trace reads like the call did.

    >>> [name for name, _ in iter_tensors((x, {"h": y}), "input")]
    ['input[0]', 'input[1].h']
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import torch

MAX_TENSORS_PER_SIDE = 16  # a module returning a KV cache should not flood the trace
MAX_DEPTH = 4


def iter_tensors(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for each tensor inside ``value``, depth-first, bounded."""
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth >= MAX_DEPTH or value is None or isinstance(value, (str, bytes, int, float, bool)):
        return
    if isinstance(value, dict) or _is_model_output(value):
        items = value.items() if isinstance(value, dict) else _model_output_items(value)
        for key, item in items:
            yield from iter_tensors(item, f"{path}.{key}", depth + 1)
        return
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from iter_tensors(item, f"{path}[{index}]", depth + 1)
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from iter_tensors(getattr(value, f.name, None), f"{path}.{f.name}", depth + 1)


def collect(args: tuple[Any, ...], kwargs: dict[str, Any] | None, output: Any = None, *, side: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one side of a call (``"input"`` or ``"output"``), capped."""
    found: list[tuple[str, torch.Tensor]] = []
    if side == "input":
        sources: Iterator[tuple[str, torch.Tensor]] = _chain(
            iter_tensors(list(args), "input"), iter_tensors(kwargs or {}, "kwarg")
        )
    else:
        sources = iter_tensors(output, "output")
    for item in sources:
        found.append(item)
        if len(found) >= MAX_TENSORS_PER_SIDE:
            break
    return found


def _chain(*iterators: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for iterator in iterators:
        yield from iterator


def _is_model_output(value: Any) -> bool:
    # transformers' ModelOutput is an OrderedDict subclass; avoid importing transformers.
    return type(value).__name__.endswith("Output") and hasattr(value, "items")


def _model_output_items(value: Any) -> Iterator[tuple[str, Any]]:
    try:
        yield from value.items()
    except Exception:
        return

"""Find the tensors in whatever a module takes or returns.

Inputs and outputs may be tensors, tuples, lists, dicts, or ModelOutput dataclasses;
each tensor found is named by where it sat (``input[0]``, ``kwarg.hidden_states``,
``output.logits``) so a trace reads like the call did.

    >>> [name for name, _ in collect((x, {"h": y}), None, side="input")]
    ['input[0]', 'input[1].h']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

MAX_TENSORS_PER_SIDE = 16  # a module returning a KV cache should not flood the trace
MAX_DEPTH = 4


_SKIP = (str, bytes, int, float, bool, type(None))


def collect(args: tuple[Any, ...], kwargs: dict[str, Any] | None, output: Any = None, *, side: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one side of a call (``"input"`` or ``"output"``), capped.

    A plain recursive walk filling one list: this runs twice per hooked call, and a
    generator per level cost a third of the hook's time.
    """
    found: list[tuple[str, torch.Tensor]] = []
    if side == "input":
        for index, item in enumerate(args):
            if len(found) >= MAX_TENSORS_PER_SIDE:
                break
            if item is not None:
                _walk(item, _INPUT_PATHS[index] if index < len(_INPUT_PATHS) else f"input[{index}]", 1, found, MAX_TENSORS_PER_SIDE)
        if kwargs:
            for key, item in kwargs.items():
                if len(found) >= MAX_TENSORS_PER_SIDE:
                    break
                if item is None:
                    continue  # the common unused kwarg: no call for it
                path = _KWARG_PATHS.get(key)
                if path is None:
                    path = _kwarg_path(key)
                _walk(item, path, 1, found, MAX_TENSORS_PER_SIDE)
    elif type(output) is torch.Tensor:
        found.append(("output", output))  # most modules return one tensor
    else:
        _walk(output, "output", 0, found, MAX_TENSORS_PER_SIDE)
    return found


def collect_kwargs(kwargs: dict[str, Any], room: int = MAX_TENSORS_PER_SIDE) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a call's keyword arguments, at most ``room`` of them (what
    :func:`collect` adds after those of the positional arguments)."""
    found: list[tuple[str, torch.Tensor]] = []
    for key, item in kwargs.items():
        if len(found) >= room:
            break
        if item is None:
            continue
        path = _KWARG_PATHS.get(key)
        if path is None:
            path = _kwarg_path(key)
        _walk(item, path, 1, found, room)
    return found


# Argument names repeat on every call: built once.
_INPUT_PATHS = tuple(f"input[{i}]" for i in range(MAX_TENSORS_PER_SIDE))
_KWARG_PATHS: dict[str, str] = {}


def _kwarg_path(key: str) -> str:
    path = f"kwarg.{key}"
    if len(_KWARG_PATHS) < 4096 and isinstance(key, str):  # bounded: names are few, keys are not always
        _KWARG_PATHS[key] = path
    return path


# Types whose objects the walk never enters (an engine's cache or batch object, an enum):
# learnt on first sight, so a kwarg like a KV cache costs one set lookup per call.
_LEAVES: set[type] = set(_SKIP)
_LEAVES_MAX = 1024


def _walk(value: Any, path: str, depth: int, found: list[tuple[str, torch.Tensor]], cap: int) -> None:
    if isinstance(value, torch.Tensor):
        found.append((path, value))
        return
    cls = type(value)
    if cls in _LEAVES or depth >= MAX_DEPTH or isinstance(value, _SKIP):
        return
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            if len(found) >= cap:
                return
            _walk(item, f"{path}[{index}]", depth + 1, found, cap)
        return
    if isinstance(value, dict) or _is_model_output(value):
        items = value.items() if isinstance(value, dict) else _model_output_items(value)
        for key, item in items:
            if len(found) >= cap:
                return
            _walk(item, f"{path}.{key}", depth + 1, found, cap)
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if len(found) >= cap:
                return
            _walk(getattr(value, f.name, None), f"{path}.{f.name}", depth + 1, found, cap)
        return
    # None of the kinds above; whether a type is one depends on the type alone (a name
    # ending in Output may still grow ``items``: those are asked every time).
    if not cls.__name__.endswith("Output") and len(_LEAVES) < _LEAVES_MAX:
        _LEAVES.add(cls)


def _is_model_output(value: Any) -> bool:
    # transformers' ModelOutput is an OrderedDict subclass; avoid importing transformers.
    return type(value).__name__.endswith("Output") and hasattr(value, "items")


def _model_output_items(value: Any) -> Iterator[tuple[str, Any]]:
    try:
        yield from value.items()
    except Exception:
        return

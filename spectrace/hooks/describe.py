"""A tensor's (shape, dtype, device) as a call record writes them, cached where it can be.

The hooks describe every tensor of every traced call: the names of dtypes and devices are
kept once each, and a plain CPU tensor says so without building a ``torch.device``.
"""

from __future__ import annotations

from typing import Any

import torch

_DTYPE_NAMES: dict[Any, str] = {}
_DEVICE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _device_name(device: Any) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def device_of(tensor: torch.Tensor) -> str:
    # A plain CPU tensor says so without building a torch.device (a third of a shape note);
    # a subclass may report a device of its own, so it is asked.
    if type(tensor) is torch.Tensor and tensor.is_cpu:
        return "cpu"
    return _device_name(tensor.device)


def describe(tensor: torch.Tensor, seen: dict[int, Any] | None = None) -> tuple[tuple[int, ...], str, str]:
    """A tensor's (shape, dtype name, device name) as a call record writes them; ``seen``
    keeps them by identity for a pass whose tensors are all held (ids stay unique)."""
    if seen is not None:
        hit = seen.get(id(tensor))
        if hit is not None and hit[0] is tensor:
            return hit[1]
    try:
        shape = tuple(tensor.shape)
    except Exception:  # nested/jagged tensors have no single shape
        shape = ()
    described = (shape, _DTYPE_NAMES.get(tensor.dtype) or dtype_name(tensor.dtype), device_of(tensor))
    if seen is not None:
        seen[id(tensor)] = (tensor, described, None)  # (None: whether it takes statistics, not asked yet)
    return described

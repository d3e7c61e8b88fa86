"""How an integration reads one module's calls: :class:`ModuleView` (the tracer asks its
``views`` callback for one per hooked module, at attach)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

# What a module's output view yields: (arg, tensor, tensor to add or None, column range or None).
# A decoder layer that returns (mlp_out, residual) is seen as their sum, the residual
# stream; a fused input as its chunks.
ViewItem = tuple[str, torch.Tensor, torch.Tensor | None, tuple[int, int] | None]


class ModuleView(NamedTuple):
    """How an integration reads one module's calls (either part None: the generic walk).

    ``inputs(args, kwargs)`` names the input tensors (an engine's batch metadata object is
    not walked field by field on every call); ``outputs(output, args, kwargs)`` the output
    tensors as :data:`ViewItem` (None: the generic walk for that call)."""

    inputs: Callable[[tuple[Any, ...], dict[str, Any]], list[tuple[str, torch.Tensor]]] | None = None
    outputs: Callable[[Any, tuple[Any, ...], dict[str, Any]], list[ViewItem] | None] | None = None

"""Statistics that survive CUDA-graph replay.

Forward hooks run while a graph is captured and never again: a replay only re-runs the
kernels. :class:`GraphStats` makes the *statistics kernels* part of the graph. Each
:meth:`GraphStats.record` call (made during capture, typically from a forward hook)
enqueues one fused reduction that writes into a static device buffer slot; every
replay refreshes the buffer, and :meth:`GraphStats.read` (after the replay) reduces and
copies it once.

    >>> gs = GraphStats.for_modules(model, ["model.layers.*", "lm_head"])
    >>> with torch.cuda.graph(graph):
    ...     out = model(static_ids)          # hooks run once here: kernels are captured
    >>> graph.replay()
    >>> gs.read()["lm_head"].absmax         # refreshed by the replay
    >>> gs.remove()

Inside ``gs.overlapped()`` (entered within the capture, left before it ends) the kernels
run on a side branch of the graph, beside the model's next kernels (:mod:`.graph_branch`).
Only for a model that writes none of the recorded tensors in place later in the step (an
engine's fused add + RMSNorm does: leave those inline):

    >>> with torch.cuda.graph(graph), gs.overlapped():
    ...     out = model(static_ids)

Per tensor, the graph gains one kernel (the fused Triton reduction, ``P`` partial rows
per slot) or, without Triton, a few torch reductions writing row 0 of the slot. No
buffer is allocated during replay and nothing is read back until :meth:`read`.
On the CPU (no graphs) the same object works eagerly, which is how its logic is tested.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from ..records import TensorStats
from .fused_stats import TRITON_DTYPES, launch_partials, prepare, programs_for
from .graph_branch import GraphBranch
from .selection import ModuleFilter, select
from .tensor_stats import INDEX_DTYPES, ROW, cpu_stats, reduce_partials, stats_supported, to_stats, torch_stats


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
        return None
    for attr in ("logits", "last_hidden_state"):
        found = getattr(value, attr, None)
        if isinstance(found, torch.Tensor):
            return found
    return None


class GraphStats:
    """A static ``(capacity, P, 5)`` float64 buffer and the kernels that fill it.

    ``fused``: use the single-pass Triton kernel (None: when available on this device
    and it passed its float64 self-check).
    """

    def __init__(self, capacity: int = 256, device: torch.device | str = "cuda", *, fused: bool | None = None) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if fused is None:
            fused = prepare(self.device)
        self.fused = bool(fused)
        self.programs = programs_for(self.device) if self.fused else 1
        self.capacity = capacity
        # Zeroed once: rows a torch-path slot never writes stay neutral (0 adds, 0 is <= any absmax).
        self.buffer = torch.zeros(capacity, self.programs, ROW, device=self.device, dtype=torch.float64)
        # Leading rows of each slot that may hold values (the rest are zero): a slot fed the
        # same tensor size on every replay then skips zeroing the rows it does not write
        # (at batch 1 that zeroing was most of the kernel's work).
        self._written = [0] * capacity
        self.slots: dict[str, int] = {}
        self.numel: list[int] = []
        self.shapes: list[list[int]] = []
        self._handles: list[Any] = []
        # The side stream for overlapped() blocks, made now: none can be made during a capture.
        self._branch = GraphBranch(self.device, enabled=self.fused)
        self._active: GraphBranch | None = None  # the branch while an overlapped() block runs
        # Slots whose tensor a torch op wrote in place between the fork and the join of an
        # overlapped() block: their statistics may hold the later values, so read() gives None.
        self.written_in_place: set[int] = set()

    # ------------------------------------------------------------------ capture
    @contextmanager
    def overlapped(self) -> Iterator[None]:
        """Within it, fused statistics kernels are captured on a side branch of the graph,
        joined when the block ends. Enter it inside ``torch.cuda.graph(...)`` (or after it
        in the same ``with``), so that the join comes before the capture's end. Outside a
        capture, and on the CPU, launches stay inline."""
        self._active = self._branch
        try:
            yield
        finally:
            self._active = None
            moved = self._branch.join()
            self.written_in_place |= moved
            if moved:
                names = sorted(name for name, index in self.slots.items() if index in moved)
                warnings.warn(
                    f"spectrace GraphStats: {len(names)} slot(s) written in place after their statistics kernel was "
                    f"forked ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): they read None; "
                    "record them outside overlapped()",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def slot(self, name: str) -> int:
        """The slot of ``name``, assigned on first use."""
        index = self.slots.get(name)
        if index is None:
            index = len(self.slots)
            if index >= self.capacity:
                raise IndexError(f"GraphStats is full ({self.capacity} slots); build it with a larger capacity")
            self.slots[name] = index
            self.numel.append(0)
            self.shapes.append([])
        return index

    def record(self, name: str, tensor: torch.Tensor) -> bool:
        """Enqueue the statistics of ``tensor`` into ``name``'s slot (capture-safe).

        Returns False (and records nothing) for tensors statistics do not apply to.
        During capture this only enqueues device work; the host learns nothing until
        :meth:`read`.
        """
        if not isinstance(tensor, torch.Tensor) or not stats_supported(tensor):
            return False
        if str(tensor.dtype).replace("torch.", "") in INDEX_DTYPES:
            return False  # token ids: a mean of ids would leak them (one-token decode steps)
        index = self.slot(name)
        self.written_in_place.discard(index)  # recorded anew: judged again at its block's join
        self.numel[index] = tensor.numel()
        self.shapes[index] = list(tensor.shape)
        x = tensor.detach()
        if x.device != self.device:
            raise ValueError(f"{name}: tensor on {x.device}, GraphStats on {self.device}")
        if self.fused and x.dtype in TRITON_DTYPES and x.is_contiguous():
            branch = self._active
            if branch is None:
                launch_partials(x, self.buffer, index, self._written)
            else:
                branch.run(lambda: launch_partials(x, self.buffer, index, self._written), x, tag=index)
            return True
        if self._written[index] > 1:
            self.buffer[index, 1:].zero_()  # an earlier fused launch filled more rows
        self._written[index] = 1
        if x.device.type == "cpu":
            self.buffer[index, 0].copy_(cpu_stats(x))
        else:
            self.buffer[index, 0].copy_(torch_stats(x))
        return True

    def hook(self, module: nn.Module, name: str) -> None:
        """Record ``module``'s first output tensor under ``name`` on every call that runs Python."""

        def post_hook(_module: nn.Module, _args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is not None:
                self.record(name, tensor)

        self._handles.append(module.register_forward_hook(post_hook))

    @classmethod
    def for_modules(
        cls,
        root: nn.Module,
        modules: ModuleFilter = None,
        *,
        profile: str | None = None,
        capacity: int | None = None,
        device: torch.device | str | None = None,
        fused: bool | None = None,
    ) -> GraphStats:
        """Hook the selected modules of ``root`` (same selection rules as ``spectrace.trace``)."""
        chosen = select(root, modules, profile=profile)
        if device is None:
            param = next(root.parameters(), None)
            device = param.device if param is not None else "cpu"
        stats = cls(capacity or max(1, len(chosen)), device, fused=fused)
        for name, module in chosen:
            stats.slot(name)
            stats.hook(module, name)
        return stats

    def remove(self) -> None:
        """Remove the hooks (the captured kernels stay in any graph already captured)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------- reading
    def reduced(self) -> torch.Tensor:
        """The ``(slots, 5)`` float64 rows on the device, without a host copy."""
        used = len(self.slots)
        if used == 0:
            return torch.zeros(0, ROW, dtype=torch.float64, device=self.device)
        return reduce_partials(self.buffer[:used])

    def read(self, names: Iterable[str] | None = None) -> dict[str, TensorStats | None]:
        """Statistics per slot name after a replay (one reduction and one host copy).

        A slot that was never recorded (its module did not run during capture) is None, and
        so is one whose tensor was written in place inside an ``overlapped()`` block
        (:attr:`written_in_place`).
        """
        rows = self.reduced().cpu().tolist()
        wanted = set(names) if names is not None else None
        out: dict[str, TensorStats | None] = {}
        for name, index in self.slots.items():
            if wanted is not None and name not in wanted:
                continue
            numel = self.numel[index]
            out[name] = to_stats(rows[index], numel) if numel and index not in self.written_in_place else None
        return out

    def __len__(self) -> int:
        return len(self.slots)

"""In-graph statistics kernels on a branch of their own, beside the model's kernels.

Captured inline, each statistics kernel sits between two of the model's kernels, and a
replay waits for it: a few microseconds per recorded tensor, most of it the kernel's
start-up (32 layers at batch 1 cost a replay about 4 %). Captured on a side stream that
forks from the capturing stream after the tensor is written, the kernel becomes a parallel
branch of the graph: it reads its few kilobytes while the next layer runs, and the replay
waits for the branch only once, at the join.

    >>> branch = GraphBranch(device)             # outside any capture (creates the stream)
    >>> with torch.cuda.graph(graph):
    ...     out = layer(x)
    ...     branch.run(launch_stats, out)        # forks, enqueues on the side stream
    ...     branch.join()                        # before the capture ends: required

Only for tensors that no later kernel of the graph writes in place: the branch reads a
tensor while the model runs on, so a kernel that rewrites it (an engine's fused add +
RMSNorm updates the residual stream it is handed, without a version bump) races with the
read. Marking the tensor as used by the side stream keeps its memory from being handed to
a new tensor; it cannot stop an in-place write. Callers opt in. What this module can see, it
reports: a torch op that writes a tensor in place bumps its version, and :meth:`GraphBranch.join`
returns the launches whose tensors moved between the fork and the join (their statistics
may hold the later values). A tensor without a version counter (made in inference mode)
cannot be watched: its launch stays inline.

A forked capture must be joined before it ends, or CUDA fails the capture: callers fork
only where they own the capture's end (:class:`.graph_slots.GraphSlots` joins in
``end_capture``, :class:`.graphsafe.GraphStats` in its ``overlapped()`` block).

Memory: the tensors read on the branch are marked as used by the side stream, so the
caching allocator does not hand their blocks to a later kernel of the same capture (it
defers those frees until no capture is under way). A capture holds at most the tensors it
recorded, until it ends; the graph's pool keeps none of them after that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


def capturing() -> bool:
    """True while this thread's current CUDA stream is capturing a graph (no host read,
    sync or pinned allocation may happen then)."""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # a torch build without CUDA
        return False


class GraphBranch:
    """One side stream of ``device`` for the statistics kernels of a capture.

    ``enabled=False`` (or a device that is not CUDA, or one built during a capture, when
    no stream can be made) runs every launch inline, as before."""

    def __init__(self, device: torch.device, *, enabled: bool = True) -> None:
        self.stream: Any = None
        if enabled and device.type == "cuda" and not capturing():
            try:
                self.stream = torch.cuda.Stream(device)
            except Exception:
                self.stream = None
        self.device = device
        self.forks = 0  # launches captured on the branch (a figure for tests and benches)
        self._owner: int | None = None  # the thread whose capture is forked, until it joins
        self._lock = threading.Lock()
        # (tensor, its version at the fork, the caller's tag) of each launch on the branch
        # since the last join: held for the capture only.
        self._watched: list[tuple[torch.Tensor, int, Any]] = []

    def run(self, launch: Callable[[], None], *read: torch.Tensor | None, tag: Any = None) -> None:
        """``launch()`` on the side stream of the capture under way (inline otherwise).

        ``read``: the tensors the launch reads. They are marked as used by the side stream,
        so their memory is not reused before the branch has read it, and their versions are
        compared at :meth:`join` (``tag`` names the launch there)."""
        side = self.stream
        tensors = [t for t in read if t is not None]
        if side is not None and capturing() and not any(t.is_inference() for t in tensors):
            main = torch.cuda.current_stream(self.device)
            me = threading.get_ident()
            with self._lock:
                if self._owner not in (None, me) or side == main:
                    side = None  # another thread's capture holds the branch
                else:
                    self._owner = me
        else:
            side = None
        if side is None:
            launch()
            return
        side.wait_stream(main)  # the fork: after the kernels that wrote the tensors
        with torch.cuda.stream(side):
            launch()
        for tensor in tensors:
            tensor.record_stream(side)
            self._watched.append((tensor, tensor._version, tag))
        self.forks += 1

    def join(self) -> set[Any]:
        """Make the current (capturing) stream wait for the branch; a no-op unless this
        thread forked it. Call it before the capture ends. Returns the tags of the launches
        whose tensors a torch op wrote in place since the fork."""
        if self.stream is None or self._owner != threading.get_ident():
            return set()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        watched, self._watched = self._watched, []
        with self._lock:
            self._owner = None
        return {tag for tensor, version, tag in watched if tensor._version != version}

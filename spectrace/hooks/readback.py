"""The statistics of one step: launched per tensor on its device, read back in one copy.

:func:`device_stats` computes one tensor's row on its device; a traced step goes through
:class:`StepStats`, which picks the same path per tensor (CPU, the fused kernel of
:mod:`.fused_stats` writing into a reused step buffer, or the torch reductions of
:mod:`.tensor_stats`).

    >>> from spectrace.hooks.tensor_stats import reduce_rows, to_stats
    >>> row = device_stats(torch.randn(4, 8), "basic")
    >>> to_stats(reduce_rows([row])[0].tolist(), 32).std

A tensor seen twice in one step (layer ``i``'s output is layer ``i+1``'s input) is
reduced once: the row is reused while the same tensor object is alive and unmodified.

Read-back: :meth:`StepStats.start_readback` ends a step by enqueueing one reduction
and one non-blocking copy into pinned memory (plus an event) per device; nothing waits
for the device there. A batch of small held tensors (a decode step's) has its rows written
by the kernel straight into pinned memory, and needs only the event
(:data:`HOST_ROWS_NUMEL`). :meth:`Readback.values` blocks until the copy landed, and is
called by the record worker thread, never inside the forward.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import torch

try:  # (not a dependency: transformers and every serving engine bring it)
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

from .fused_stats import (
    BLOCK,
    MIN_BLOCKS_PER_PROGRAM,
    disable_host_rows,
    fused_ok,
    host_rows_ok,
    launch_multi,
    launch_partials,
    programs_for,
    route,
)
from .tensor_stats import (
    ABSMAX,
    ROW,
    ROWS_BATCH_MIN,
    cpu_row,
    cpu_rows,
    cpu_stats,
    reduce_partials,
    reduce_rows,
    rows_batchable,
    torch_stats,
)


# ------------------------------------------------------------------ one tensor
def device_stats(tensor: torch.Tensor, mode: str = "basic") -> torch.Tensor:
    """Statistics of one ``tensor`` on its device, without a host sync on accelerators.

    Returns either a row ``[sum, sumsq, absmax, nan, inf]`` (shape ``(5,)``) or, on the
    fused CUDA path, per-program partial rows (shape ``(P, 5)``) that :func:`reduce_rows`
    combines. A traced step goes through :class:`StepStats` instead, which writes fused
    partials into a reused buffer. ``mode`` ("basic" or "full") gives the same numbers.
    """
    x = tensor.detach()
    if x.device.type == "cpu":
        return cpu_stats(x)
    if fused_ok(x):
        out = torch.empty(programs_for(x.device), ROW, device=x.device, dtype=torch.float64)
        launch_partials(x, out)
        return out
    return torch_stats(x)


# ------------------------------------------------------------------ one step
class SlotBuffer:
    """A ``(capacity, P, 5)`` float64 device buffer: one slot of partial rows per tensor.

    A traced step takes one from the pool, each fused launch writes the next slot, and the
    buffer goes back to the pool once its read-back has landed (so no step overwrites a
    buffer whose reduction has not run yet). Allocating ``(P, 5)`` per tensor instead
    costs a caching-allocator call per hook.
    """

    __slots__ = (
        "device",
        "tensor",
        "used",
        "rows",
        "host",
        "stage",
        "reduced",
        "event",
        "views",
        "direct",
        "direct_used",
        "direct_order",
        "rows_direct",
    )

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device = device  # (a tensor's .device builds a new object on every access)
        self.tensor = torch.empty(capacity, programs_for(device), ROW, device=device, dtype=torch.float64)
        self.used = 0
        self.rows = 0  # leading rows of a slot that hold partials, the most of any launch (the rest are zero)
        # The read-back's pinned host memory and its event, made on first use and kept with
        # the buffer: it is reused only once its last read-back was read (values()).
        self.host: torch.Tensor | None = None
        self.stage: torch.Tensor | None = None  # device rows side by side, for a contiguous host copy
        self.reduced: tuple[torch.Tensor, torch.Tensor] | None = None  # (sums, absmax) rows
        self.event: Any = None
        # (slots, rows) -> (the pinned rows, the device rows, their contiguous device copy or
        # None) of a read-back: a step of the same shape (every decode step) slices nothing
        # (each slice is a torch call).
        self.views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        # Slots the batched kernel writes straight into host memory (see HOST_ROWS_NUMEL):
        # (capacity, RAW_ROWS_MAX, 5) float64, pinned on CUDA, made on first use and kept;
        # the slots used this step, and each one's entry index, in slot order.
        self.direct: torch.Tensor | None = None
        self.direct_used = 0
        self.rows_direct = 0  # leading rows of those slots that hold partials (the rest are zero)
        self.direct_order: list[int] = []


# Free buffers kept per device. A step's buffer comes back when the record worker has read it,
# and the worker lets up to 8 steps wait before it builds them (worker.RecordWorker's
# backlog), so about ten are out at once in a host-bound decode loop. Keeping fewer than that
# made a new buffer every few steps: a pinned host allocation each (cudaHostAlloc, ~35 us to
# 200 us of host time on the H200 host). Kept ones are at most what was out at once anyway
# (about 2.7 MB of device memory each on an H200).
RETAINED = 16


class _BufferPool:
    def __init__(self) -> None:
        self._free: dict[torch.device, list[SlotBuffer]] = {}
        self._capacity: dict[torch.device, int] = {}
        self._lock = threading.Lock()
        self.made = 0  # buffers built (a steady loop builds none)

    def take(self, device: torch.device) -> SlotBuffer:
        with self._lock:
            free = self._free.get(device)
            if free:
                return free.pop()
            capacity = self._capacity.get(device, 64)
            self.made += 1
        return SlotBuffer(device, capacity)

    def give_back(self, buffer: SlotBuffer, wanted: int) -> None:
        device = buffer.device
        with self._lock:
            if wanted > buffer.tensor.shape[0]:
                # The step needed more slots than the buffer had (the rest took the slow
                # path): later buffers are sized for it, this one is dropped.
                self._capacity[device] = max(self._capacity.get(device, 64), 2 * wanted)
                return
            buffer.used = buffer.rows = buffer.direct_used = buffer.rows_direct = 0
            buffer.direct_order = []
            free = self._free.setdefault(device, [])
            if len(free) < RETAINED:
                free.append(buffer)


_pool = _BufferPool()

# Batched launches (StepStats.defer): a tensor up to DEFER_TENSOR_BYTES waits, held, until
# DEFER_BATCH of its dtype are waiting, DEFER_BYTES are held, or the step ends; then one
# launch reads the batch. A launch costs ~26 us of host time on the H200 host whatever it
# reads, so a decode step's 40 to 60 small tensors cost one launch instead of 60. Holding them
# keeps at most DEFER_BYTES alive a little longer per thread; bigger tensors (a prefill's
# logits) launch at once, where the read takes longer than the launch anyway.
DEFER_BATCH = 64  # fused_stats_kernel.MULTI
DEFER_TENSOR_BYTES = 8 << 20
DEFER_BYTES = 64 << 20
_generations = itertools.count()  # next() is atomic: steps of all threads get distinct numbers


def _route(x: torch.Tensor) -> tuple[torch.device, bool, bool] | None:
    """None for a CPU tensor (its row is computed on the host); otherwise
    :func:`.fused_stats.route`: its device, and whether the fused and batched kernels take it."""
    return None if x.is_cpu else route(x)


class StepStats:
    """The statistics of one step on one thread: launched per tensor, read back once.

    :meth:`add` enqueues a tensor's reduction and returns its index in the step (a tensor
    seen twice in one step, layer ``i``'s output being layer ``i+1``'s input, is reduced
    once while the same object is alive and unmodified). :meth:`start_readback` ends the
    step: per device one reduction and one non-blocking copy into pinned memory behind
    an event, returned as a :class:`Readback` that another thread may wait on.
    """

    def __init__(self, defer: bool = False) -> None:
        # defer: batch the fused launches (see DEFER_BATCH). Only for code whose in-place
        # writes bump a tensor's version (torch ops): an engine's custom kernels (SGLang's,
        # vLLM's fused add + RMSNorm) write without it, and a held tensor would be read
        # after the write. A version that moved before the launch skips that tensor.
        self.defer = defer
        self.skipped_modified = 0  # tensors whose statistics were skipped: written in place while held
        # Set by a caller that notes many calls in one pass with no model code in between
        # (the engine's read of kept calls): CPU tensors are then summarised together at
        # its end (take_rows), grouped by size.
        self.batch_rows = False
        self.written_owners: set[str] = set()  # the modules those tensors came from (add's owner)
        self._reset()

    def _reset(self) -> None:
        # A call may start in one step and end in the next (a hooked module around a
        # wrapped root): its rows are found by (generation, index).
        self.generation = next(_generations)
        # entry: ("slot", buffer, slot) for fused partials, ("host", list of floats) for a
        # CPU tensor (computed at once: nothing on the CPU is asynchronous), ("row", tensor)
        # otherwise
        self.entries: list[tuple[Any, ...]] = []
        self._buffers: dict[torch.device, SlotBuffer] = {}
        self._wanted: dict[torch.device, int] = {}
        self._seen: dict[int, tuple[Any, int, int]] = {}
        # dtype -> [(tensor, its version when noted, entry index)], waiting for a batched launch
        self._held: dict[Any, list[tuple[torch.Tensor, int, int, str]]] = {}
        self._held_bytes = 0
        self._rows_held: list[tuple[torch.Tensor, int]] = []  # CPU tensors for take_rows

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, tensor: torch.Tensor, reuse: bool = True, version: int | None = None, owner: str = "", hold: bool = True) -> int:
        """Enqueue ``tensor``'s statistics; returns its index in this step.

        ``reuse``: a tensor already summarised this step (same object, same version) keeps
        its row. A module's outputs pass False: a custom kernel that writes its input in
        place (SGLang's fused add + RMSNorm) does not bump ``_version``, and the output
        would show the input's statistics. ``version``: the one whose values are wanted,
        where it was noted before now (a held tensor written since is skipped).
        ``owner``: the module a held tensor belongs to, named in :attr:`written_owners`
        if it is skipped; ``hold=False``: launch now, never held."""
        key = id(tensor)
        if reuse:
            hit = self._seen.get(key)
            # (only tensors with a version counter are remembered: no inference tensor hits)
            if hit is not None and hit[0]() is tensor and tensor._version == hit[1]:
                return hit[2]
        # An inference tensor (torch.inference_mode) has no version counter: nothing can
        # prove it unmodified, so it is neither reused nor held.
        inference = tensor.is_inference()
        # Read through a detached alias only where autograd would otherwise record the reductions.
        x = tensor.detach() if tensor.requires_grad else tensor
        index = len(self.entries)
        entry: tuple[Any, ...]
        way = _route(x)
        if way is None:
            if self.batch_rows and not inference and rows_batchable(x):
                self.entries.append(("host", None))  # filled by take_rows, at the pass's end
                self._rows_held.append((x, index))
                self._remember(tensor, index)
                return index
            entry = ("host", cpu_row(x))
        else:
            device, fused, multi = way
            if fused and x.is_contiguous():
                if hold and multi and self.defer and not inference:
                    nbytes = x.nbytes
                    if nbytes <= DEFER_TENSOR_BYTES:
                        self.entries.append(("held",))
                        # (the version whose values the row will hold is the one a reuse must match)
                        current = tensor._version if version is None else version
                        self._hold(x, device, index, current, owner, nbytes)
                        self._remember(tensor, index, current)
                        return index
                entry = self._fused(x, device)
            else:
                entry = ("row", torch_stats(x))
        self.entries.append(entry)
        if not inference:
            self._remember(tensor, index)
        return index

    def _remember(self, tensor: torch.Tensor, index: int, version: int | None = None) -> None:
        try:
            self._seen[id(tensor)] = (weakref.ref(tensor), tensor._version if version is None else version, index)
        except TypeError:
            pass

    def _hold(self, x: torch.Tensor, device: torch.device, index: int, version: int, owner: str, nbytes: int) -> None:
        held = self._held.get((device, x.dtype))
        if held is None:
            held = self._held[(device, x.dtype)] = []
        held.append((x, version, index, owner))
        self._held_bytes += nbytes
        if len(held) >= DEFER_BATCH or self._held_bytes > DEFER_BYTES:
            self.launch_held()

    def take_rows(self) -> None:
        """The rows of the CPU tensors held by a batched pass (:attr:`batch_rows`): one
        :func:`cpu_rows` per size. Called at the pass's end, before any model code runs
        again, so every tensor still holds the values its call saw. A tensor whose row
        cannot be taken gets none, and the first such error is raised once the others
        have theirs."""
        if not self._rows_held:
            return  # (every pass ends here: most hold nothing on an accelerator)
        held, self._rows_held = self._rows_held, []
        by_size: dict[int, list[tuple[torch.Tensor, int]]] = {}
        for x, index in held:
            by_size.setdefault(x.numel(), []).append((x, index))
        failed: Exception | None = None
        for items in by_size.values():
            try:
                rows: list[list[float] | None] = list(cpu_rows([x for x, _index in items])) if len(items) >= ROWS_BATCH_MIN else []
            except Exception:  # one odd tensor must not cost the others their rows
                rows = []
            if not rows:
                for x, _index in items:
                    try:
                        rows.append(cpu_row(x))
                    except Exception as exc:
                        rows.append(None)
                        failed = failed or exc
            for (_x, index), row in zip(items, rows):
                self.entries[index] = ("host", row)
        if failed is not None:
            raise failed  # the rows that could be taken are in; the caller reports it once

    def launch_held(self) -> None:
        """Launch the statistics of every held tensor now: one launch per device and dtype
        (a tensor written in place since it was noted is skipped and counted)."""
        held, self._held, self._held_bytes = self._held, {}, 0
        for (device, _dtype), items in held.items():
            live = []
            for x, version, index, owner in items:
                if x._version != version:
                    self.entries[index] = ("skipped",)
                    self.skipped_modified += 1
                    if owner:
                        self.written_owners.add(owner)
                else:
                    live.append((x, index))
            if not live:
                continue
            buffer = self._buffers.get(device)
            if buffer is None:
                buffer = self._buffers[device] = _pool.take(device)
            self._wanted[device] = self._wanted.get(device, 0) + len(live)
            if self._launch_to_host(buffer, device, live):
                continue
            room = max(0, buffer.tensor.shape[0] - buffer.used)
            batch, rest = live[:room], live[room:]
            if batch:
                rows = launch_multi([x for x, _ in batch], buffer.tensor, buffer.used)
                if rows > buffer.rows:
                    buffer.rows = rows
                for n, (_x, index) in enumerate(batch):
                    self.entries[index] = ("slot", buffer, buffer.used + n)
                buffer.used += len(batch)
            for x, index in rest:  # the buffer is full: a launch and rows of their own
                out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float64)
                launch_partials(x, out)
                self.entries[index] = ("row", out)

    def _launch_to_host(self, buffer: SlotBuffer, device: torch.device, live: list[tuple[torch.Tensor, int]]) -> bool:
        """One batched launch whose partial rows land in ``buffer``'s host memory (see
        HOST_ROWS_NUMEL); False where it does not apply (big tensors, no room, a device
        where the check failed): the caller launches into the device slots."""
        if buffer.direct_used + len(live) > buffer.tensor.shape[0] or not host_rows_ok(device):
            return False
        for x, _index in live:
            if x.numel() > HOST_ROWS_NUMEL:
                return False
        direct = buffer.direct
        if direct is None:
            # Once per buffer (the pool keeps it): a pinned allocation may wait for the device.
            direct = buffer.direct = torch.empty(
                buffer.tensor.shape[0], RAW_ROWS_MAX, ROW, dtype=torch.float64, pin_memory=device.type == "cuda"
            )
        slot0 = buffer.direct_used
        try:
            rows = launch_multi([x for x, _ in live], direct, slot0)
        except Exception:
            # (an unforeseen driver or Triton: the device slots from now on, for every step)
            disable_host_rows(device)
            return False
        if rows > buffer.rows_direct:
            buffer.rows_direct = rows
        for n, (_x, index) in enumerate(live):
            self.entries[index] = ("direct", buffer, slot0 + n)
            buffer.direct_order.append(index)
        buffer.direct_used += len(live)
        return True

    def _fused(self, x: torch.Tensor, device: torch.device) -> tuple[Any, ...]:
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = self._buffers[device] = _pool.take(device)
        self._wanted[device] = self._wanted.get(device, 0) + 1
        if buffer.used < buffer.tensor.shape[0]:
            slot = buffer.used
            rows = launch_partials(x, buffer.tensor, slot)
            if rows > buffer.rows:
                buffer.rows = rows
            buffer.used += 1
            return ("slot", buffer, slot)
        out = torch.empty(programs_for(device), ROW, device=device, dtype=torch.float64)
        launch_partials(x, out)
        return ("row", out)

    def start_readback(self) -> Readback | None:
        """End the step: enqueue the reduction and host copy of every row (no sync on CUDA).

        Returns None when the step computed no statistics. A device whose reduction fails
        leaves its entries without values; the error is kept on the read-back.
        """
        if self._held:
            self.launch_held()
        if self._rows_held:
            self.take_rows()
        if not self.entries and not self._buffers:
            return None  # (a step without statistics, an unsampled one: nothing to reset either)
        entries, buffers, wanted, generation = self.entries, self._buffers, self._wanted, self.generation
        self._reset()
        if not entries:
            for device, buffer in buffers.items():
                _pool.give_back(buffer, wanted.get(device, 0))
            return None
        by_device: dict[torch.device, list[int]] = {}
        host: list[int] = []
        for index, entry in enumerate(entries):
            kind = entry[0]
            if kind == "skipped" or kind == "direct":
                continue  # skipped: written in place before its launch, no values (counted); direct: below
            if kind == "host":
                host.append(index)
                continue
            device = entry[1].device  # a slot's buffer, or a row tensor
            by_device.setdefault(device, []).append(index)
        copies: list[_Copy] = []
        error: BaseException | None = None
        if host:
            try:
                copies.append(host_rows([entries[i] for i in host], host))
            except Exception as exc:
                error = exc
        for device, indices in by_device.items():
            try:
                copies.append(copy_rows(device, [entries[i] for i in indices], indices, buffers.get(device)))
            except Exception as exc:
                error = error or exc
        for buffer in buffers.values():
            if buffer.direct_used:
                try:
                    copies.append(_direct_rows(buffer))
                except Exception as exc:
                    error = error or exc
        returns = [(buffer, wanted.get(device, 0)) for device, buffer in buffers.items()]
        return Readback(generation, len(entries), copies, returns, error)


def copy_rows(device: torch.device, entries: list[tuple[Any, ...]], indices: list[int], buffer: SlotBuffer | None) -> _Copy:
    """Reduce one device's entries to ``(T, 5)`` float64 and start their host copy."""
    slots = [e for e in entries if e[0] == "slot"]
    rows = [e[1] for e in entries if e[0] == "row"]
    # Row order: the slots in slot order (a batched launch fills its slots after later
    # entries took theirs), then the other rows in entry order.
    by_slot = [i for _slot, i in sorted((e[2], i) for i, e in zip(indices, entries) if e[0] == "slot")]
    if buffer is not None and slots and not rows and len(slots) == buffer.used and device.type == "cuda":
        return _copy_slots(buffer, by_slot)
    parts = []
    if slots:
        assert buffer is not None
        parts.append(reduce_partials(buffer.tensor[: buffer.used]))  # slots are 0..used-1 in order
    if rows:
        parts.append(reduce_rows(rows))
    reduced = parts[0] if len(parts) == 1 else torch.cat(parts)
    order = by_slot + [i for i, e in zip(indices, entries) if e[0] == "row"]
    if device.type == "cuda":
        host = torch.empty(reduced.shape, dtype=reduced.dtype, pin_memory=True)
        host.copy_(reduced, non_blocking=True)
        # blocking: the worker that waits on it sleeps instead of spinning a core.
        event = torch.cuda.Event(blocking=True)
        event.record()
        return _Copy(order, host, event)
    return _Copy(order, reduced.to("cpu"), None)


# A step's slots whose partials span at most this many rows (a decode step's tensors take
# one to a few dozen programs) are copied as they are and combined by the reader; beyond it
# (prefill: up to P rows a slot, megabytes) they are reduced on the device first.
RAW_ROWS_MAX = 64
# A held batch whose largest tensor has at most HOST_ROWS_NUMEL elements (a decode step's,
# up to batch 64 x 4096) is read by at most RAW_ROWS_MAX programs a tensor, which write their
# partial rows straight into the buffer's pinned host memory (the device reaches it over the
# bus; .fused_stats.host_rows_ok checked that on this device). The step's read-back is then
# an event: no gather on the device and no host copy, two torch calls fewer a step. Bigger
# tensors (a prefill's) keep the device slots, read by as many programs as they need.
HOST_ROWS_NUMEL = RAW_ROWS_MAX * MIN_BLOCKS_PER_PROGRAM * BLOCK


def _copy_slots(buffer: SlotBuffer, order: list[int]) -> _Copy:
    """A step whose rows are all slots of its buffer (the common CUDA step), copied into
    the buffer's own pinned memory behind its own event. Where the slots' partials span
    few rows (:data:`RAW_ROWS_MAX`), those rows as they are: one copy, combined by the
    reader (:meth:`Readback.values`); otherwise two reductions (the sums, the absmax)
    and their two copies."""
    if buffer.event is None:
        # blocking: the worker that waits on it sleeps instead of spinning a core.
        buffer.event = torch.cuda.Event(blocking=True)
    used = buffer.used
    rows = buffer.rows or buffer.tensor.shape[1]
    if rows > RAW_ROWS_MAX:
        if buffer.reduced is None:
            capacity = buffer.tensor.shape[0]
            buffer.reduced = (
                torch.empty(capacity, ROW, dtype=torch.float64, pin_memory=True),
                torch.empty(capacity, dtype=torch.float64, pin_memory=True),
            )
        partials = buffer.tensor[:used, :rows]
        sums, top = buffer.reduced[0][:used], buffer.reduced[1][:used]  # contiguous: the copies stay asynchronous
        sums.copy_(partials.sum(1), non_blocking=True)  # (its absmax column is a sum: replaced on the host)
        top.copy_(partials[..., ABSMAX].amax(1), non_blocking=True)
        buffer.event.record()
        return _Copy(order, (sums, top), buffer.event)
    views = buffer.views.get((used, rows))
    if views is None:
        need = used * rows * ROW
        if buffer.host is None:
            # Once per buffer, at the most it can take (capacity x RAW_ROWS_MAX x 5 float64,
            # 164 KB at the default capacity): a pinned allocation may wait for the device.
            buffer.host = torch.empty(buffer.tensor.shape[0] * RAW_ROWS_MAX * ROW, dtype=torch.float64, pin_memory=True)
        if len(buffer.views) >= 16:
            buffer.views.clear()
        rows_on_device = buffer.tensor[:used, :rows]
        stage = None
        if not rows_on_device.is_contiguous():
            # A slot's leading rows are a strided piece of the buffer. Copied to the host as
            # they are, while the device is still busy, they cost the host 20 us (median) to
            # 98 us on two H200 hosts; gathered on the device first, then copied whole, 16 to
            # 23 us (bench/readback_copy.py; bench/results/readback-copy-h200-2026-12-02.json).
            if buffer.stage is None:
                buffer.stage = torch.empty(buffer.tensor.shape[0] * RAW_ROWS_MAX * ROW, dtype=torch.float64, device=buffer.device)
            stage = buffer.stage[:need].view(used, rows, ROW)
        # (the pinned rows are contiguous: the copy stays asynchronous)
        views = buffer.views[(used, rows)] = (buffer.host[:need].view(used, rows, ROW), rows_on_device, stage)
    host, rows_on_device, stage = views
    if stage is not None:
        stage.copy_(rows_on_device)  # on the device, in stream order before the host copy
        rows_on_device = stage
    host.copy_(rows_on_device, non_blocking=True)
    buffer.event.record()
    return _Copy(order, host, buffer.event, partials=True)


def _direct_rows(buffer: SlotBuffer) -> _Copy:
    """The slots the kernel wrote into ``buffer``'s host memory: nothing to copy, an event
    after the step's launches says when they have landed (every row of a slot is written:
    the programs zero the rows they do not fill)."""
    assert buffer.direct is not None
    rows = buffer.direct[: buffer.direct_used, : buffer.rows_direct]  # (numpy reads the strided view as it is)
    if buffer.device.type != "cuda":
        return _Copy(buffer.direct_order, rows, None, partials=True)
    if buffer.event is None:
        # blocking: the worker that waits on it sleeps instead of spinning a core.
        buffer.event = torch.cuda.Event(blocking=True)
    buffer.event.record()
    return _Copy(buffer.direct_order, rows, buffer.event, partials=True)


def combine_partials(part: torch.Tensor) -> list[list[float]]:
    """``(T, rows, 5)`` partial rows on the host -> one row per tensor: the sums over the
    rows, the absmax column their largest. On the record worker, so through NumPy where it
    is installed: a small array there costs a few microseconds, a torch CPU op ten times that."""
    if part.shape[1] == 1:
        return part[:, 0].tolist()  # type: ignore[no-any-return]
    if _np is not None:
        a = part.numpy()
        sums = a.sum(axis=1)
        sums[:, ABSMAX] = a[:, :, ABSMAX].max(axis=1)
        return sums.tolist()  # type: ignore[no-any-return]
    rows: list[list[float]] = part.sum(1).tolist()
    for row, top in zip(rows, part[..., ABSMAX].amax(1).tolist()):
        row[ABSMAX] = top
    return rows


def host_rows(entries: list[tuple[Any, ...]], indices: list[int]) -> _Copy:
    """The CPU entries of one step: their rows are on the host already."""
    return _Copy(indices, [e[1] for e in entries], None)


class _Copy:
    """One device's rows of one step, copied (or being copied) to host memory."""

    __slots__ = ("indices", "host", "event", "partials")

    def __init__(
        self,
        indices: list[int],
        host: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | list[list[float]],
        event: Any,
        partials: bool = False,
    ) -> None:
        self.indices = indices
        self.host = host
        self.event = event
        self.partials = partials  # host is (tensors, rows, 5) partial rows, combined when read

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class Readback:
    """One step's statistics on their way to the host; :meth:`values` waits for them."""

    def __init__(
        self, generation: int, count: int, copies: list[_Copy], buffers: list[tuple[SlotBuffer, int]], error: BaseException | None
    ) -> None:
        self.generation = generation
        self.count = count
        self.copies = copies
        self.error = error
        self._buffers = buffers

    def ready(self) -> bool:
        """Whether every copy has landed (never blocks)."""
        return all(c.ready() for c in self.copies)

    def busy(self) -> bool:
        return not self.ready()

    def has_events(self) -> bool:
        return any(c.event is not None for c in self.copies)

    def values(self) -> list[list[float] | None]:
        """Row ``[sum, sumsq, absmax, nan, inf]`` per index (None where the device failed).

        Blocks until the copies landed (``event.synchronize`` releases the GIL), then
        hands the step's buffers back to the pool.
        """
        out: list[list[float] | None] = [None] * self.count
        try:
            for copy in self.copies:
                copy.wait()
                if copy.partials:  # _copy_slots: each tensor's partial rows, combined here
                    assert isinstance(copy.host, torch.Tensor)
                    rows = combine_partials(copy.host)
                elif isinstance(copy.host, tuple):  # _copy_slots reduced: the sums, and the absmax apart
                    rows = copy.host[0].tolist()
                    for row, top in zip(rows, copy.host[1].tolist()):
                        row[ABSMAX] = top
                else:
                    rows = copy.host if isinstance(copy.host, list) else copy.host.tolist()
                for i, values in zip(copy.indices, rows):
                    out[i] = values
        finally:
            for buffer, wanted in self._buffers:
                _pool.give_back(buffer, wanted)
            self._buffers = []
        return out

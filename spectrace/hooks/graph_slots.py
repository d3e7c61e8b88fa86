"""Statistics computed inside captured CUDA graphs, padded rows excluded, read back without a sync.

A serving engine captures one graph per padded batch size and replays it for any real
batch size up to that one: the rows past the real batch are padding (stale or garbage
values). :class:`GraphSlots` keeps one :class:`SlotTable` per captured graph. During
capture, :meth:`GraphSlots.record` enqueues one masked reduction per tensor into the
table's static ``(capacity, 5)`` float64 rows (``[sum, sumsq, absmax, nan, inf]``); the
kernels read the number of real rows from a device scalar (``table.real_bs``), so every
replay reduces exactly the rows that are real for it. Around a replay:

    >>> slots.begin_capture(key, capture_bs=8, label="decode bs=8")
    >>> with torch.cuda.graph(graph):
    ...     out = model(static_ids)            # hooks call slots.record(...)
    >>> slots.end_capture()
    >>> slots.before_replay(key, real_bs=5)     # 1 replay in `sample`: writes real_bs
    >>> graph.replay()
    >>> slots.after_replay(key, {"step": 12})   # that one: async copy into a pinned ring entry
    >>> for readout in slots.poll():            # later, never waits
    ...     slots.stats_of(readout, readout.table.slots[0])

With ``overlap=True``, a table begun inside the capture gets its kernels on a side branch
of the graph (:mod:`.graph_branch`), beside the model's next kernels; ``end_capture`` joins
the branch, so it must then be called before the capture ends (as above). Only for graphs
where no later kernel writes a recorded tensor in place: a branch reads the tensor while the
model runs on, and an engine's fused add + RMSNorm rewrites the residual stream it was
handed (a live SGLang server read residual statistics up to 89x off that way). The default
keeps every kernel inline, where it reads the tensor before the next kernel starts.
Nothing here reads the device from the host while a stream is capturing, and nothing
allocates pinned memory then. No engine is imported: an integration calls this API.

Kernel: :mod:`.graph_slots_kernel` (Triton, imported on first use), on CUDA or under
``TRITON_INTERPRET=1``. Without it (or for dtypes it does not read), capture-safe torch
ops give the same numbers.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ..settings import fused_stats_on
from .fused_stats import BLOCK, TRITON_DTYPES, WARPS, programs_for
from .graph_branch import GraphBranch
from .graph_branch import capturing as _capturing
from .tensor_stats import ROW, stats_fields, stats_supported

# The fewest BLOCK-wide pieces of the padded tensor per program (fixed at capture). Two,
# not fused_stats' four: a replay of a Llama-8B-shaped step cost 0.7-1.2 % less at batch
# 1 and 0-0.4 % less at batch 64 on two H200 machines (bench/overhead.py --graph-blocks;
# bench/results/graph-slots-h200-2026-12-02.json); not measured above batch 64, where
# twice the programs add their atomics to one row. bench/overhead.py sweeps this name.
MIN_BLOCKS_PER_PROGRAM = 2
# A tensor of at most SMALL_ELEMENTS padded elements (a decode step's hidden state at a
# small batch) is read in SMALL_LAUNCH pieces: (BLOCK, warps, fewest pieces per program).
# One warp reduces its accumulators with shuffles alone, where four go through shared
# memory and barriers: the replay of the 32-layer step at batch 1 cost 1.014x of bare
# against 1.019x with the wide launch, while at batch 64 one warp cost 1.038x against
# 1.023x (bench/results/graph-slots-h200-2026-12-03.json).
SMALL_ELEMENTS = 16384
SMALL_LAUNCH = (256, 1, 1)
_kernel_state: dict[Any, Any] = {}
_state_lock = threading.Lock()
# Kernel variants compiled so far: (device, x dtype, y dtype or None). The Triton cache is
# process-wide, so this is too. A variant not in it is never compiled during a capture.
_warmed: set[tuple[str, torch.dtype, torch.dtype | None, bool]] = set()  # (..., small launch)


# ------------------------------------------------------------------ the kernel
def load_kernel() -> Any | None:
    """The masked Triton kernel, or None when Triton is missing or ``SPECTRACE_FUSED_STATS=0``."""
    if "kernel" not in _kernel_state:
        kernel = None
        if fused_stats_on():  # parsed once, in settings.py (a bad value: one warning)
            try:
                # Imported on first use only: Triton is optional and slow to import.
                from .graph_slots_kernel import masked_stats as kernel
            except Exception:
                kernel = None
        _kernel_state["kernel"] = kernel
    return _kernel_state["kernel"]


def kernel_available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device`` (CUDA, or the CPU under Triton's interpreter)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return load_kernel() is not None


def launch_shape(padded: int, width: int) -> tuple[int, int, int]:
    """(BLOCK, warps, fewest pieces per program) for a padded ``[rows, width]`` tensor."""
    if padded * width <= SMALL_ELEMENTS:
        return SMALL_LAUNCH
    return (BLOCK, WARPS, MIN_BLOCKS_PER_PROGRAM)


def _launch(
    rows: torch.Tensor,
    real_bs: torch.Tensor,
    slot: int,
    x: torch.Tensor,
    y: torch.Tensor | None,
    col_start: int,
    width: int,
    rows_per_seq: int,
    small: bool | None = None,
) -> None:
    """Enqueue the kernel: rows of ``x`` (2-D, row stride, contiguous columns) -> ``rows[slot]``
    (accumulated). ``small``: force the launch shape of that size class (None: by size)."""
    padded = x.shape[0]
    if small is None:
        block, warps, fewest = launch_shape(padded, width)
    else:
        block, warps, fewest = SMALL_LAUNCH if small else (BLOCK, WARPS, MIN_BLOCKS_PER_PROGRAM)
    col_blocks = -(-width // block)
    # Fixed at capture from the padded size (the graph replays this grid): a few work
    # items per program, at most the programs the device keeps busy.
    grid = max(1, min(programs_for(x.device), -(-(padded * col_blocks) // fewest)))
    kernel = load_kernel()
    assert kernel is not None  # callers check kernel_available first
    kernel[(grid,)](
        x,
        y if y is not None else x,  # a pointer the HAS_Y=False variant never reads
        rows,
        real_bs,
        x.stride(0),
        y.stride(0) if y is not None else 0,
        col_start,
        width,
        col_blocks,
        padded,
        rows_per_seq,
        slot,
        HAS_Y=y is not None,
        BLOCK=block,
        num_warps=warps,
    )


def masked_row(x: torch.Tensor, y: torch.Tensor | None, real_bs: torch.Tensor, rows_per_seq: int) -> torch.Tensor:
    """The torch path: ``[sum, sumsq, absmax, nan, inf]`` of the real rows of ``x (+ y)``, on the device.

    ``x`` and ``y`` are 2-D ``[padded rows, elements]`` (any strides). Capture-safe: the
    row mask is built on the device from ``real_bs`` (no host read). The same arithmetic
    as the kernel (values in float32, sums in float64), so the same numbers.
    """
    wide = torch.float64 if x.dtype == torch.float64 or (y is not None and y.dtype == torch.float64) else torch.float32
    v = x.to(wide)
    if y is not None:
        v = v + y.to(wide)
    keep = (torch.arange(x.shape[0], device=x.device) < real_bs * rows_per_seq).unsqueeze(1)
    v = torch.where(keep, v, 0.0)  # padded rows may hold NaN: select, never multiply
    w = v.to(torch.float64)
    nan = torch.isnan(v)
    absmax = torch.where(nan, 0.0, v.abs()).amax().to(torch.float64)
    return torch.stack([w.sum(), (w * w).sum(), absmax, nan.sum(dtype=torch.float64), torch.isinf(v).sum(dtype=torch.float64)])


def check_kernel(device: torch.device | str) -> bool:
    """Run the kernel once against :func:`masked_row` (syncs; outside any capture; cached).

    Padded rows of NaN, inf and huge values, an added tensor and a column range, per
    dtype. Compiles those variants as a side effect.
    """
    device = torch.device(device)
    key = ("checked", str(device))
    with _state_lock:
        if key in _kernel_state:
            return _kernel_state[key]
        ok = False
        try:
            gen = torch.Generator(device="cpu").manual_seed(11)
            base = torch.randn(6, 3 * 40 + 1, generator=gen, dtype=torch.float64) * 3
            base[1, 7], base[2, 9] = math.nan, -math.inf
            base[4:] = math.nan  # padding: must not count
            base[5, 3] = 1e30
            real_bs = torch.tensor([2], dtype=torch.int64, device=device)
            ok = True
            for dtype in TRITON_DTYPES:
                x = base.to(device=device, dtype=dtype)
                y = base.flip(1).to(device=device, dtype=dtype)
                for (yy, cols), small in itertools.product(((None, (0, x.shape[1])), (y, (40, 80))), (True, False)):
                    rows = torch.zeros(2, ROW, dtype=torch.float64, device=device)
                    _launch(rows, real_bs, 1, x, yy, cols[0], cols[1] - cols[0], 2, small=small)
                    ref = masked_row(x[:, cols[0] : cols[1]], None if yy is None else yy[:, cols[0] : cols[1]], real_bs, 2)
                    got, want = rows[1].cpu(), ref.cpu()
                    ok = ok and bool((rows[0] == 0).all()) and torch.allclose(got.nan_to_num(-1.0), want.nan_to_num(-1.0), rtol=1e-9)
                    _warmed.add((str(device), dtype, None if yy is None else dtype, small))
        except Exception:
            ok = False
        _kernel_state[key] = ok
        return ok


# ------------------------------------------------------------------ tables
@dataclass
class SlotInfo:
    """One recorded tensor of a captured graph (host side, fixed at capture)."""

    index: int
    name: str
    role: str | None
    module_type: str
    arg: str  # "output", "output.chunk[1]", "output.residual_stream", ...
    call_index: int  # order of the record call within the capture (dropped calls count)
    draft_step: int | None
    padded_shape: list[int]
    rows_per_seq: int  # real rows = min(padded rows, real_bs * rows_per_seq)
    row_elems: int  # elements per row of what is reduced (the column range, if any)
    dtype: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def real_rows(self, real_bs: int) -> int:
        padded = self.padded_shape[0] if self.padded_shape else 1
        return min(padded, max(0, real_bs) * self.rows_per_seq)


@dataclass(eq=False)
class SlotTable:
    """The slots of one captured graph and the device buffers its kernels use.

    ``rows`` and ``real_bs`` are static: the graph holds their addresses. When allocated
    during a capture they come from the graph's private memory pool, and only this
    table's reference keeps that memory from being handed to a later tensor of the same
    capture: the table must live as long as the graph (a recapture replaces both).
    """

    key: Any
    label: str
    capture_bs: int
    rows: torch.Tensor  # (capacity, 5) float64: the final rows, zeroed at the start of every replay
    real_bs: torch.Tensor  # (1,) int64: real batch size of the replay, written by before_replay
    meta: dict[str, Any] = field(default_factory=dict)
    slots: list[SlotInfo] = field(default_factory=list)
    replays: int = 0
    calls: int = 0  # record calls during capture, dropped ones included
    zeroed: bool = False  # the capture holds the memset of `rows` (enqueued by the first record)
    armed: int | None = None  # real_bs of a sampled replay whose after_replay is due
    paused: bool = False  # SPECTRACE_CONTROL paused per-step work: real_bs was set to 0 once
    branch: GraphBranch | None = None  # the side branch its kernels are captured on (begun inside the capture)

    def memory_bytes(self) -> int:
        """Device memory held by this table."""
        return self.rows.numel() * self.rows.element_size() + self.real_bs.numel() * self.real_bs.element_size()


@dataclass
class Readout:
    """The rows of one sampled replay, landed in host memory."""

    table: SlotTable
    context: dict[str, Any]
    real_bs: int
    values: list[list[float]]  # one [sum, sumsq, absmax, nan, inf] per slot, in slot order


@dataclass
class _Pending:
    entry: int
    table: SlotTable
    context: dict[str, Any]
    real_bs: int
    count: int
    event: Any


@dataclass
class _Prepared:
    base: torch.Tensor  # 2-D [padded rows, elements] view handed to the kernel
    add: torch.Tensor | None
    col_start: int
    width: int
    shape: list[int]


class GraphSlots:
    """Slot tables of the captured graphs of one device, and the ring their rows come back through.

    ``capacity``: slots per table; ``ring``: read-backs in flight; ``sample``: one replay in
    ``sample`` per key is read back; ``fused``: use the Triton kernel (None: when available
    and its self-check passes; the check syncs, so build this object outside any capture);
    ``overlap``: capture the kernels on a side branch (:mod:`.graph_branch`), joined by
    :meth:`end_capture`: only where nothing writes a recorded tensor in place later in the
    graph (see the module's docstring).
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        capacity: int = 64,
        ring: int = 32,
        sample: int = 1,
        fused: bool | None = None,
        overlap: bool = False,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.capacity = capacity
        self.ring = ring
        self.sample = max(1, sample)
        usable = kernel_available(self.device)
        if fused is None:
            fused = usable and not _capturing() and check_kernel(self.device)
        self.fused = bool(fused and usable)
        self.branch = GraphBranch(self.device, enabled=overlap)
        self.tables: dict[Any, SlotTable] = {}
        self._local = threading.local()
        self._lock = threading.Lock()  # ring bookkeeping: after_replay and poll may run on different threads
        self._host: torch.Tensor | None = None  # (ring, capacity, 5), pinned on CUDA
        self._events: list[Any] = []
        self._free: list[int] = []
        self._busy: list[_Pending] = []
        self.replays = 0
        self.sampled = 0
        self.dropped_ring = 0
        self.dropped_slots = 0
        self.unwarmed = 0  # slots captured on the torch path because their kernel variant was never warmed
        self.written_in_place = 0  # side-branch slots whose tensor a torch op wrote in place before the join

    # ------------------------------------------------------------------ capture
    def begin_capture(self, key: Any, *, capture_bs: int, label: str, meta: dict[str, Any] | None = None) -> None:
        """Start the table of ``key`` (replacing any earlier one); this thread's records go to it.

        Begun inside a capture with ``overlap``, the table's kernels go on a side branch
        that :meth:`end_capture` joins: then call it before the capture ends."""
        capturing = _capturing()
        if capturing:
            # No fill kernels: they would become graph nodes and overwrite, on every
            # replay, the real_bs written just before it. `rows` is zeroed by the first
            # record's memset; an unwritten real_bs only reaches clamped garbage.
            rows = torch.empty(self.capacity, ROW, dtype=torch.float64, device=self.device)
            real_bs = torch.empty(1, dtype=torch.int64, device=self.device)
        else:
            rows = torch.zeros(self.capacity, ROW, dtype=torch.float64, device=self.device)
            real_bs = torch.full((1,), capture_bs, dtype=torch.int64, device=self.device)
        table = SlotTable(key=key, label=label, capture_bs=capture_bs, rows=rows, real_bs=real_bs, meta=dict(meta or {}))
        if capturing and self.branch.stream is not None:
            table.branch = self.branch
        self.tables[key] = table  # the old graph is gone with its recapture: drop its table
        self._local.table = table

    def end_capture(self) -> SlotTable | None:
        """End this thread's capture (joining the statistics' branch); returns its table."""
        table = self.capturing_table()
        if table is not None and table.branch is not None:
            for index in table.branch.join():
                # Written in place after the fork: the branch may have read the later values.
                table.slots[index].meta["written_in_place"] = True
                self.written_in_place += 1
        self._local.table = None
        return table

    def capturing_table(self) -> SlotTable | None:
        """The table this thread is capturing into, if any."""
        return getattr(self._local, "table", None)

    def _prepare(self, tensor: Any, add: Any, cols: tuple[int, int] | None) -> _Prepared | None:
        """The 2-D view the reduction reads, or None when statistics do not apply (host metadata only)."""
        if not isinstance(tensor, torch.Tensor) or not stats_supported(tensor) or not tensor.is_floating_point():
            return None  # ints are ids (INDEX_DTYPES) or packed weights; bool, complex, empty: no row
        if tensor.device != self.device:
            return None
        shape = list(tensor.shape)
        tensors = [tensor.detach()]
        if add is not None:
            if not isinstance(add, torch.Tensor) or not stats_supported(add) or not add.is_floating_point():
                return None
            if list(add.shape) != shape or add.device != self.device:
                return None
            tensors.append(add.detach())
        col_start = 0
        if cols is not None:
            start, stop = int(cols[0]), int(cols[1])
            if tensor.dim() != 2 or not 0 <= start < stop <= shape[1]:
                return None
            col_start = start
        views = []
        for t in tensors:
            rows = shape[0] if shape else 1
            # A 1-D tensor is one element per row; reshape copies only what a view cannot show.
            views.append(t.reshape(rows, -1))
        width = (cols[1] - cols[0]) if cols is not None else views[0].shape[1]
        return _Prepared(views[0], views[1] if add is not None else None, col_start, width, shape)

    def _kernel_ok(self, p: _Prepared) -> bool:
        for t in (p.base, p.add):
            if t is not None and (t.dtype not in TRITON_DTYPES or (t.stride(1) != 1 and t.shape[1] > 1)):
                return False
        return self.fused

    def _variant(self, p: _Prepared, small: bool | None = None) -> tuple[str, torch.dtype, torch.dtype | None, bool]:
        if small is None:
            small = launch_shape(p.base.shape[0], p.width) == SMALL_LAUNCH
        return (str(self.device), p.base.dtype, p.add.dtype if p.add is not None else None, small)

    def _enqueue(
        self, rows: torch.Tensor, real_bs: torch.Tensor, slot: int, p: _Prepared, rows_per_seq: int, branch: GraphBranch | None = None
    ) -> None:
        """The slot's reduction into ``rows[slot]``: the kernel (accumulates; rows zeroed; on
        ``branch`` if given) or the torch path (inline)."""
        if self._kernel_ok(p):
            if not _capturing() or self._variant(p) in _warmed:
                try:
                    if branch is None:
                        _launch(rows, real_bs, slot, p.base, p.add, p.col_start, p.width, rows_per_seq)
                    else:
                        branch.run(
                            lambda: _launch(rows, real_bs, slot, p.base, p.add, p.col_start, p.width, rows_per_seq), p.base, p.add, tag=slot
                        )
                    return
                except Exception:
                    pass  # the torch path below gives the same numbers
            else:
                self.unwarmed += 1  # compiling now would break the capture
        stop = p.col_start + p.width
        x = p.base[:, p.col_start : stop]
        y = p.add[:, p.col_start : stop] if p.add is not None else None
        rows[slot].copy_(masked_row(x, y, real_bs, rows_per_seq))

    def record(
        self,
        tensor: torch.Tensor,
        *,
        name: str,
        role: str | None,
        module_type: str,
        arg: str,
        draft_step: int | None = None,
        add: torch.Tensor | None = None,
        cols: tuple[int, int] | None = None,
        rows_per_seq: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int | None:
        """Enqueue the statistics of ``tensor`` (+ ``add``; only columns ``cols`` of a 2-D one) into the next slot.

        Capture-safe: device work only. ``rows_per_seq`` defaults to ``shape[0] //
        capture_bs`` when the rows are batch-major (else the rows are never masked).
        Returns the slot index, or None (no capture on this thread, unsupported tensor or
        table full; the last two count in ``dropped_slots``). Never raises.
        """
        table = self.capturing_table()
        if table is None:
            return None
        table.calls += 1
        try:
            p = self._prepare(tensor, add, cols)
        except Exception:
            p = None
        if p is None or len(table.slots) >= self.capacity:
            self.dropped_slots += 1
            return None
        padded = p.base.shape[0]
        if rows_per_seq is None:
            bs = table.capture_bs
            rows_per_seq = padded // bs if bs > 0 and padded >= bs and padded % bs == 0 else padded
        rows_per_seq = max(1, int(rows_per_seq))
        if not table.zeroed:
            # Captured once as a memset node: every replay starts its atomics from zero.
            table.rows.zero_()
            table.zeroed = True
        index = len(table.slots)
        try:
            self._enqueue(table.rows, table.real_bs, index, p, rows_per_seq, table.branch)
        except Exception:
            self.dropped_slots += 1
            return None
        table.slots.append(
            SlotInfo(
                index=index,
                name=name,
                role=role,
                module_type=module_type,
                arg=arg,
                call_index=table.calls - 1,
                draft_step=draft_step,
                padded_shape=p.shape,
                rows_per_seq=rows_per_seq,
                row_elems=p.width,
                dtype=str(p.base.dtype).replace("torch.", ""),
                meta=dict(meta or {}),
            )
        )
        return index

    def warm(self, tensor: torch.Tensor, add: torch.Tensor | None = None, cols: tuple[int, int] | None = None) -> None:
        """Compile the kernel variant ``record`` would use for these arguments, now (outside capture).

        Variants differ by dtypes and by the two launch shapes (every size is unspecialised):
        one call per dtype pair compiles both shapes; later calls return at once.
        """
        if _capturing():
            return
        p = self._prepare(tensor, add, cols)
        if p is None or not self._kernel_ok(p):
            return
        rows = torch.zeros(1, ROW, dtype=torch.float64, device=self.device)
        real_bs = torch.ones(1, dtype=torch.int64, device=self.device)
        # Both launch shapes: a capture at another batch size may take the other one.
        for small in (True, False):
            if self._variant(p, small) in _warmed:
                continue
            try:
                _launch(rows, real_bs, 0, p.base, p.add, p.col_start, p.width, 1, small=small)
                _warmed.add(self._variant(p, small))
            except Exception:
                pass  # record takes the torch path for it

    # ------------------------------------------------------------------ replay
    def before_replay(self, key: Any, real_bs: int) -> bool:
        """Whether this replay of ``key`` is read back; if so, write ``real_bs`` for its kernels (no sync)."""
        table = self.tables.get(key)
        if table is None or not self.due(table):
            return False
        return self.arm(table, real_bs)

    def due(self, table: SlotTable) -> bool:
        """Count one replay of ``table``: whether it is the one in ``sample`` read back.

        This runs on every replay of every graph, so it is the whole cost of the replays
        in between (a few attribute updates)."""
        self.replays += 1
        n = table.replays
        table.replays = n + 1
        if n % self.sample:
            table.armed = None
            return False
        return True

    def arm(self, table: SlotTable, real_bs: int) -> bool:
        """Write the replay's real row count for ``table``'s kernels (a fill with a scalar,
        enqueued on the current stream ahead of the replay); :meth:`after_replay` copies."""
        table.paused = False
        table.real_bs.fill_(int(real_bs))
        table.armed = int(real_bs)
        self.sampled += 1
        return True

    def _ensure_ring(self) -> bool:
        if self._host is not None:
            return True
        if _capturing():
            return False  # pinned memory is never allocated while a stream captures
        cuda = self.device.type == "cuda"
        self._host = torch.empty(self.ring, self.capacity, ROW, dtype=torch.float64, pin_memory=cuda)
        self._events = [torch.cuda.Event() if cuda else None for _ in range(self.ring)]
        self._free = list(range(self.ring - 1, -1, -1))
        return True

    def after_replay(self, key: Any, context: dict[str, Any]) -> bool:
        """After a sampled replay: start the copy of its rows into a free ring entry (no sync).

        Call it on the stream the graph replayed on. Returns False when this replay was
        not sampled, or (counted in ``dropped_ring``) no ring entry was free.
        """
        table = self.tables.get(key)
        if table is None or table.armed is None:
            return False
        real_bs, table.armed = table.armed, None
        count = len(table.slots)
        if count == 0:
            return False
        with self._lock:
            if not self._ensure_ring() or not self._free:
                self.dropped_ring += 1
                return False
            entry = self._free.pop()
        assert self._host is not None
        host = self._host[entry, :count]
        event = self._events[entry]
        if event is not None:
            # Ordered after the replay on this stream, and before the next replay's memset.
            host.copy_(table.rows[:count], non_blocking=True)
            event.record()  # the current stream: the one the graph replayed on
        else:
            host.copy_(table.rows[:count])
        # Until the next sampled replay the kernels read no rows: an unsampled replay pays
        # the launches of its statistics nodes, not their reads.
        table.real_bs.fill_(0)
        with self._lock:
            self._busy.append(_Pending(entry, table, context, real_bs, count, event))
        return True

    def pause(self, key: Any) -> None:
        """Per-step work paused (``SPECTRACE_CONTROL``): the kernels of ``key`` read no rows."""
        table = self.tables.get(key)
        if table is not None and not table.paused and not _capturing():
            table.real_bs.fill_(0)
            table.armed = None
            table.paused = True

    def poll(self) -> list[Readout]:
        """The read-backs that have landed (never waits); their ring entries become free."""
        with self._lock:
            busy, self._busy = self._busy, []
        done: list[Readout] = []
        still: list[_Pending] = []
        for p in busy:
            if p.event is None or p.event.query():
                assert self._host is not None
                done.append(Readout(p.table, p.context, p.real_bs, self._host[p.entry, : p.count].tolist()))
                with self._lock:
                    self._free.append(p.entry)
            else:
                still.append(p)
        with self._lock:
            self._busy = still + self._busy
        return done

    def stats_of(self, readout: Readout, slot: SlotInfo | int) -> dict[str, Any]:
        """:class:`~spectrace.records.TensorStats` fields of one slot of a read-back (the real rows only)."""
        info = readout.table.slots[slot] if isinstance(slot, int) else slot
        numel = info.real_rows(readout.real_bs) * info.row_elems
        if numel == 0 or info.meta.get("written_in_place"):
            return {"mean": None, "std": None, "absmax": None, "nan": 0, "inf": 0, "numel": 0}
        return stats_fields(readout.values[info.index], numel)

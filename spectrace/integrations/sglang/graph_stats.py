"""Per-module statistics under CUDA-graph replay: kernels captured into SGLang's graphs.

Every SGLang graph runner (target decode / verify, draft multi-step, draft extend)
captures and replays through its backend (``runner_backend``), in 0.5.17 and 0.5.23:

- ``FullCudaGraphBackend.__init__(cuda_graph_runner)``: which runner a backend serves;
- ``capture_one(shape_key, forward_fn, ...)``: the runner's two eager warm-ups, then the
  capture. The warm-ups compile the statistics kernel and record nothing (dummy
  batches); during the capture every hooked module takes a slot of a statistics table
  owned by that graph (:mod:`spectrace.hooks.graph_slots`), keyed by backend and shape
  key. A recapture replaces the table;
- ``replay(shape_key, forward_batch)`` calls ``self._graphs[shape_key].replay()``: the
  captured graph is put behind a :class:`ReplayGate` there, which knows its table and
  runner from the capture (no lookup, no wrapper on ``replay`` itself). The runner has set
  ``raw_bs`` (and ``raw_num_token``) by then. For 1 in ``SPECTRACE_GRAPH_SAMPLE`` replays
  the real count goes to the table's device scalar before the replay and the table is
  copied to a pinned ring after it, with an event; between sampled replays the count is
  0, so the captured kernels read no rows. The record worker builds records once a
  copy's event has completed, never waiting.

``TcPiecewiseCudaGraphBackend`` (torch.compile) and ``BreakableCudaGraphBackend`` replays
are said once to be untraced per module, and counted.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from ... import control
from ...hooks.identity import ByIdentity
from . import cost, graphs, modules, state

_runners: ByIdentity[Any] = ByIdentity()  # backend -> weakref to its runner
_clock = time.perf_counter
_slots: list[Any] = []  # the process's GraphSlots, once a graph was captured on a device
FEATURE = "graph_stats"
RING = 128  # read-backs in flight: 128 x 64 slots x 40 B of pinned memory (328 KB)


def after_backend_init(result: Any, *args: Any, **kwargs: Any) -> None:
    try:
        backend = args[0]
        runner = args[1] if len(args) > 1 else kwargs.get("cuda_graph_runner")
        if runner is not None:
            _runners[backend] = weakref.ref(runner)
    except Exception as exc:
        state.internal_error("graph backend init", exc)
    return None


def _runner(backend: Any) -> Any:
    ref = _runners.get(backend)
    return ref() if ref is not None else None


def slots_for(tracer: Any, device: Any) -> Any:
    """The process's statistics tables (created at the first capture on a device)."""
    if tracer.graph_slots is None:
        from ... import runtime
        from ...hooks.graph_slots import GraphSlots

        settings = runtime.settings()
        # SPECTRACE_SAMPLE thins the read-back too: 1 in graph_sample x sample replays.
        tracer.graph_slots = GraphSlots(device, sample=settings.graph_sample * settings.sample, ring=RING)
        _slots.append(tracer.graph_slots)
    return tracer.graph_slots


def around_capture_one(original: Any, backend: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``capture_one``: warm-ups compile the kernels, the capture takes the slots,
    and the captured graph gets its :class:`ReplayGate`."""
    captured: list[Any] = []  # the capture's statistics table, once it is taken
    try:
        if args:
            args = (_traced(backend, shape_key, args[0], captured), *args[1:])
        elif "forward_fn" in kwargs:
            kwargs["forward_fn"] = _traced(backend, shape_key, kwargs["forward_fn"], captured)
    except Exception as exc:
        state.internal_error("graph capture", exc)
    state.STATE.in_capture += 1
    try:
        out = original(backend, shape_key, *args, **kwargs)
    finally:
        state.STATE.in_capture -= 1
    try:
        wrap_graph(backend, shape_key, *(captured[-1] if captured else (None, None)))
    except Exception as exc:
        state.internal_error("graph capture", exc)
    return out


def _traced(backend: Any, shape_key: Any, forward_fn: Any, captured: list[Any]) -> Any:
    import torch

    tracer = modules._tracer()
    if tracer.stats_mode == "off" or not torch.cuda.is_available():
        return forward_fn
    runner = _runner(backend)
    size = int(getattr(shape_key, "size", 0) or 0)
    mode = getattr(getattr(runner, "capture_forward_mode", None), "name", None)
    label = f"{type(runner).__name__ if runner is not None else type(backend).__name__}[{size}]"
    key = table_key(backend, shape_key)

    def traced() -> Any:
        thread = tracer._thread()
        if graphs.capturing():
            slots = slots_for(tracer, torch.device("cuda", torch.cuda.current_device()))
            slots.begin_capture(key, capture_bs=max(1, size), label=label, meta={"mode": mode})
            try:
                return forward_fn()
            finally:
                table = slots.end_capture()
                _captured(table)
                if table is not None:
                    captured.append((table, slots))
        thread.warming = True  # an eager warm-up on a dummy batch: compile, record nothing
        if tracer.graph_slots is None:
            slots_for(tracer, torch.device("cuda", torch.cuda.current_device()))
        try:
            return forward_fn()
        finally:
            thread.warming = False

    return traced


def _captured(table: Any) -> None:
    if table is None:
        return
    rec = state.recorder()
    _drain_on(rec)
    rec.count("graph_tables")
    rec.count("graph_table_bytes", table.memory_bytes())


def table_key(backend: Any, shape_key: Any) -> tuple[Any, ...]:
    """The statistics table's key for one graph of ``backend`` (a recapture replaces it)."""
    fields = getattr(shape_key, "__dict__", None)
    return (id(backend), *fields.values()) if fields else (id(backend), shape_key)


def _units(runner: Any, shape_key: Any) -> int | None:
    """The replay's real count, in the unit of the shape key (requests, or tokens)."""
    if runner is None:
        return None
    size = getattr(shape_key, "size", None)
    raw_bs = getattr(runner, "raw_bs", None)
    raw_tokens = getattr(runner, "raw_num_token", None)
    if getattr(runner, "bs", size) != size and isinstance(raw_tokens, int):
        return raw_tokens  # a runner keyed by token count (ragged verify, prefill)
    return int(raw_bs) if isinstance(raw_bs, int) else None


_drains: ByIdentity[bool] = ByIdentity()  # the recorders drained (not by id: a new one may reuse it)
_hand_lock = threading.Lock()
HAND_OVER_EVERY = 256  # replays of a graph whose counts and host time are handed over at once


class ReplaySums:
    """The replay counts and host time of one gate, kept apart from it.

    The process holds these (``_sums``), not the gates: SGLang drops a gate with its graph
    (a recapture, its cleanup), and what the gate counted since its last hand-over must
    still reach the file at the next drain. A drain drops the sums of a gate that is gone
    once they are handed over."""

    __slots__ = ("calls", "seconds", "slow_calls", "slow_seconds", "handed", "traced", "name", "gate")

    def __init__(self, traced: bool, name: str, gate: Any) -> None:
        self.calls = 0
        self.seconds = 0.0
        self.slow_calls = 0
        self.slow_seconds = 0.0
        self.handed = (0, 0.0, 0, 0.0)
        self.traced = traced
        self.name = name
        self.gate = weakref.ref(gate)

    def add(self, spent: float) -> None:
        self.calls += 1
        self.seconds += spent
        if spent > cost.SLOW_S:
            self.slow_calls += 1
            self.slow_seconds += spent


_sums: list[ReplaySums] = []  # every gate's sums, until handed over after the gate is gone


class ReplayGate:
    """Stands in for one captured ``torch.cuda.CUDAGraph`` in its backend's ``_graphs``.

    The backend's ``replay`` calls ``self._graphs[shape_key].replay()`` (0.5.17 and
    0.5.23), so this object sees every replay of its graph and knows, from its capture,
    the graph's statistics table, runner and shape key: a replay needs no lookup. The
    replays between two read-backs only count down and time themselves (their kernels read
    no rows: the count on the device stays 0); one in ``period`` writes the real count
    before the replay and queues the copy after it. Counts and host time (:class:`ReplaySums`)
    reach the recorder every ``HAND_OVER_EVERY`` replays and at every drain.

    A graph without a table (statistics off, a capture spectrace did not see) only counts
    its replays: said once per runner as not traced per module.
    """

    __slots__ = ("graph", "table", "slots", "runner", "shape_key", "mode", "period", "left", "sums", "__weakref__")

    def __init__(self, graph: Any, table: Any, slots: Any, runner: Any, shape_key: Any, backend: Any) -> None:
        self.graph = graph
        self.table = table
        self.slots = slots
        self.runner = weakref.ref(runner) if runner is not None else None
        self.shape_key = shape_key
        self.mode = (table.meta.get("mode") if table is not None else None) or None
        self.period = max(1, int(slots.sample)) if table is not None else HAND_OVER_EVERY
        self.left = 1  # the first replay is read back (or, untraced, said)
        self.sums = ReplaySums(table is not None, type(runner if runner is not None else backend).__name__, self)
        with _hand_lock:
            _sums.append(self.sums)

    def replay(self, *args: Any, **kwargs: Any) -> Any:
        start = _clock()
        left = self.left - 1
        if left > 0:  # the replays between two read-backs: this is all they cost
            self.left = left
            sums = self.sums
            spent = _clock() - start
            # ReplaySums.add, written out: this runs on every replay of every graph.
            sums.calls += 1
            sums.seconds += spent
            if spent > cost.SLOW_S:
                sums.slow_calls += 1
                sums.slow_seconds += spent
            return self.graph.replay(*args, **kwargs)
        self.left = self.period
        if self.table is None:
            self._untraced(start)
            return self.graph.replay(*args, **kwargs)
        armed = self._arm()
        spent = _clock() - start
        out = self.graph.replay(*args, **kwargs)
        if armed:
            start = _clock()
            self._read_back()
            spent += _clock() - start
        sums = self.sums
        sums.add(spent)
        if sums.calls - sums.handed[0] >= HAND_OVER_EVERY:
            hand_over(sums)
        return out

    def _arm(self) -> bool:
        """A replay due for a read-back: its real count for the kernels, unless paused."""
        try:
            slots, table = self.slots, self.table
            if control.paused():  # looked at here only: between read-backs there is nothing to pause
                slots.pause(table.key)
                return False
            units = _units(self.runner() if self.runner is not None else None, self.shape_key)
            return units is not None and slots.arm(table, units)
        except Exception as exc:
            state.internal_error("graph replay", exc)
            return False

    def _read_back(self) -> None:
        try:
            tracer = modules._tracer()
            context = {"step": tracer.next_step(), "mode": self.mode, "t_unix": time.time()}
            if self.slots.after_replay(self.table.key, context):
                tracer.graph_replayed()
        except Exception as exc:
            state.internal_error("graph replay read-back", exc)

    def _untraced(self, start: float) -> None:
        self.sums.calls += 1
        try:
            hand_over(self.sums)  # this replay included: the first one is said at once
        except Exception as exc:
            state.internal_error("graph replay", exc)
        self.sums.seconds += _clock() - start  # handed over with the next ones

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)  # reset(), pool(), ...: the graph's own


def hand_over(sums: ReplaySums) -> None:
    """A gate's counts and host time since the last hand-over, to the recorder.

    The engine's thread adds to the sums and only it; this reads them (from that thread
    or a drain's) and hands over the difference, so nothing is counted twice or lost."""
    with _hand_lock:
        now = (sums.calls, sums.seconds, sums.slow_calls, sums.slow_seconds)
        calls, seconds, slow_calls, slow_seconds = (a - b for a, b in zip(now, sums.handed))
        sums.handed = now
    if not calls and not seconds:
        return
    rec = state.recorder()
    _drain_on(rec)
    feature = FEATURE if sums.traced else "graph_replay"
    rec.account_hook(seconds, feature, calls=calls, slow_calls=slow_calls, slow_seconds=slow_seconds)
    if sums.traced:
        rec.count("graph_replays_traced", calls)
    else:
        graphs._replayed(sums.name, times=calls)  # said once per runner, then counted


def wrap_graph(backend: Any, shape_key: Any, table: Any = None, slots: Any = None) -> ReplayGate | None:
    """Put a :class:`ReplayGate` in front of the graph ``backend`` just captured for ``shape_key``
    (``table``: its statistics table in ``slots``; None: a graph that only counts its replays).

    None (said once) when the backend keeps its graphs some other way: its replays are then
    neither traced nor counted."""
    graphs_of = getattr(backend, "_graphs", None)
    graph = graphs_of.get(shape_key) if isinstance(graphs_of, dict) else None
    if graph is None or not callable(getattr(graph, "replay", None)):
        state.recorder().coverage(
            "graph_replay",
            f"{type(backend).__name__} keeps no graph spectrace can stand in front of: its replays are not traced or counted",
        )
        return None
    if isinstance(graph, ReplayGate):
        graph = graph.graph
    gate = ReplayGate(graph, table if slots is not None else None, slots, _runner(backend), shape_key, backend)
    graphs_of[shape_key] = gate
    return gate


def _drain_on(rec: Any) -> None:
    if rec not in _drains:  # replay costs and read-back counts reach the file at close
        _drains[rec] = True
        rec.add_drain(_flush_cost)


def _flush_cost() -> None:
    try:
        rec = state.recorder()
        _drain_on(rec)
        with _hand_lock:
            every = list(_sums)
        for sums in every:
            hand_over(sums)
        with _hand_lock:  # a gate that is gone has nothing more to hand over
            _sums[:] = [x for x in _sums if x.gate() is not None or (x.calls, x.seconds, x.slow_calls, x.slow_seconds) != x.handed]
        slots = _slots[0] if _slots else None
        if slots is not None:
            readbacks, dropped = slots.sampled, slots.dropped_ring
            rec.count("graph_readbacks", readbacks - _seen_counts[0])
            rec.count("graph_readbacks_dropped", dropped - _seen_counts[1])
            _seen_counts[:] = [readbacks, dropped]
    except Exception as exc:
        state.internal_error("graph replay cost", exc)


_seen_counts = [0, 0]


def after_unsupported_replay(result: Any, *args: Any, **kwargs: Any) -> None:
    try:
        name = type(args[0]).__name__
        state.recorder().coverage(
            "graph_replay",
            f"{name} replays are not traced per module (statistics are captured into full CUDA graphs only; "
            "torch.compile piecewise and breakable graphs run without them)",
        )
    except Exception as exc:
        state.internal_error("graph replay", exc)
    return None

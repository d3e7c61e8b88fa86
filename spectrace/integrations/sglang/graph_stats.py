"""Per-module statistics under CUDA-graph replay: kernels captured into SGLang's graphs.

Every SGLang graph runner (target decode / verify, draft multi-step, draft extend)
captures and replays through its backend (``runner_backend``), in 0.5.17 and 0.5.23:

- ``FullCudaGraphBackend.__init__(cuda_graph_runner)``: which runner a backend serves;
- ``capture_one(shape_key, forward_fn, ...)``: the runner's two eager warm-ups, then the
  capture. The warm-ups compile the statistics kernel and record nothing (dummy
  batches); during the capture every hooked module takes a slot of a statistics table
  owned by that graph (:mod:`spectrace.hooks.graph_slots`), keyed by backend and shape
  key. A recapture replaces the table;
- ``replay(shape_key, forward_batch)``: the runner has set ``raw_bs`` (and
  ``raw_num_token``) by then. For 1 in ``SPECTRACE_GRAPH_SAMPLE`` replays the real
  count goes to the table's device scalar before the replay and the table is copied to a
  pinned ring after it, with an event; between sampled replays the count is 0, so the
  captured kernels read no rows. The record worker builds records once a copy's event
  has completed, never waiting.

``TcPiecewiseCudaGraphBackend`` (torch.compile) and ``BreakableCudaGraphBackend`` replays
are said once to be untraced per module, and counted.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from ... import control
from . import cost, graphs, modules, state

_runners: dict[int, Any] = {}  # id(backend) -> weakref to its runner
_clock = time.perf_counter
_slots: list[Any] = []  # the process's GraphSlots, once a graph was captured on a device
FEATURE = "graph_stats"
RING = 128  # read-backs in flight: 128 x 64 slots x 40 B of pinned memory (328 KB)


def after_backend_init(result: Any, *args: Any, **kwargs: Any) -> None:
    try:
        backend = args[0]
        runner = args[1] if len(args) > 1 else kwargs.get("cuda_graph_runner")
        if runner is not None:
            _runners[id(backend)] = weakref.ref(runner)
    except Exception as exc:
        state.internal_error("graph backend init", exc)
    return None


def _runner(backend: Any) -> Any:
    ref = _runners.get(id(backend))
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
    """AROUND ``capture_one``: warm-ups compile the kernels, the capture takes the slots."""
    try:
        if args:
            args = (_traced(backend, shape_key, args[0]), *args[1:])
        elif "forward_fn" in kwargs:
            kwargs["forward_fn"] = _traced(backend, shape_key, kwargs["forward_fn"])
    except Exception as exc:
        state.internal_error("graph capture", exc)
    state.STATE.in_capture += 1
    try:
        return original(backend, shape_key, *args, **kwargs)
    finally:
        state.STATE.in_capture -= 1


def _traced(backend: Any, shape_key: Any, forward_fn: Any) -> Any:
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
                _captured(slots.end_capture())
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
    if id(rec) not in _drains:  # replay costs and read-back counts reach the file at close
        _drains.add(id(rec))
        rec.add_drain(_flush_cost)
    rec.count("graph_tables")
    rec.count("graph_table_bytes", table.memory_bytes())


def table_key(backend: Any, shape_key: Any) -> tuple[Any, ...]:
    """The statistics table's key for one graph of ``backend``.

    SGLang builds a new ``ShapeKey`` (a frozen dataclass) for every replay, and a dict
    lookup with it runs its generated ``__hash__`` and ``__eq__``, two Python calls per
    replay; its fields as a plain tuple hash and compare in C."""
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


_cost = cost.of(FEATURE)
_drains: set[int] = set()


def around_replay(original: Any, backend: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``replay``: the real count before a sampled replay, the copy after it.

    Every full-graph replay of every runner passes here, so this also counts them: traced
    (its graph holds a statistics table) or not (said once per runner, then counted)."""
    start = _clock()
    slots = _slots[0] if _slots else None
    key = table_key(backend, shape_key)
    table = slots.tables.get(key) if slots is not None else None
    sampled = False
    try:
        if table is None:
            runner = _runner(backend)
            graphs._replayed(type(runner if runner is not None else backend).__name__)
        else:
            _traced_replays[0] += 1
            # The replays between two read-backs do only this count: their kernels read no
            # rows (the count on the device stays 0), so nothing else is needed for them.
            if slots.due(table):  # type: ignore[union-attr]
                sampled = _arm(slots, key, table, backend, shape_key)
    except Exception as exc:
        state.internal_error("graph replay", exc)
    spent = _clock() - start
    out = original(backend, shape_key, *args, **kwargs)
    if sampled:
        start = _clock()
        try:
            batch = args[0] if args else kwargs.get("static_forward_batch")
            mode = getattr(getattr(batch, "forward_mode", None), "name", None)
            tracer = modules._tracer()
            if slots.after_replay(key, {"step": tracer.next_step(), "mode": mode, "t_unix": time.time()}):  # type: ignore[union-attr]
                tracer.graph_replayed()
        except Exception as exc:
            state.internal_error("graph replay read-back", exc)
        spent += _clock() - start
    _cost.add(spent)
    if _cost.calls == 0:  # just handed over: the read-back counts go with it
        _flush_cost()
    return out


def _arm(slots: Any, key: Any, table: Any, backend: Any, shape_key: Any) -> bool:
    """A replay due for a read-back: its real count for the kernels, unless paused."""
    if control.paused():  # looked at here only: between read-backs there is nothing to pause
        slots.pause(key)
        return False
    ref = _runners.get(id(backend))
    units = _units(ref() if ref is not None else None, shape_key)
    return units is not None and slots.arm(table, units)


def _flush_cost() -> None:
    try:
        rec = state.recorder()
        if id(rec) not in _drains:  # the rest reaches the file at close (and before any read)
            _drains.add(id(rec))
            rec.add_drain(_flush_cost)
        slots = _slots[0] if _slots else None
        if slots is not None:
            readbacks, dropped = slots.sampled, slots.dropped_ring
            rec.count("graph_readbacks", readbacks - _seen_counts[0])
            rec.count("graph_readbacks_dropped", dropped - _seen_counts[1])
            _seen_counts[:] = [readbacks, dropped]
        traced, _traced_replays[0] = _traced_replays[0], 0
        if traced:
            rec.count("graph_replays_traced", traced)
        _cost.flush()
    except Exception as exc:
        state.internal_error("graph replay cost", exc)


_seen_counts = [0, 0]
_traced_replays = [0]


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

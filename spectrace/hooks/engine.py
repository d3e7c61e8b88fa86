"""The tracing engine: forward hooks that turn module calls into ``call`` records.

A :class:`Tracer` hooks the selected modules of one or more roots and wraps each
root's ``forward`` (SGLang calls ``.forward()`` directly, so a hook on the root would
never fire). Each outermost root call is a *step*. Hooks stay cheap: inside a step a
hook keeps the call as it came, and the kept calls are noted in one pass (see
:data:`PENDING_CALLS`) as plain tuples (names, shapes, a statistics slot, see
:mod:`.readback`); at the step's end the statistics copy is enqueued and the step goes to
the :class:`.worker.RecordWorker`,
which builds the pydantic records and hands them to the
:class:`~spectrace.recorder.Recorder` off the host's thread.

A hook never raises into the model: every internal failure becomes a counted
``internal_error``. Hooks only read tensors, so outputs are bit-identical.

The tracer is put together here from parts, one job each: attaching to models
(:mod:`.attach`), steps (:mod:`.steps`, sampling in :mod:`.sampling`), the hooks
(:mod:`.hook_makers`), reading kept calls (:mod:`.kept_calls`), noting a call
(:mod:`.noting`) and building records (:mod:`.building`). This module holds the tracer's
state, a thread's step and its end, and the keeping of a call with its limits.

    >>> tracer = Tracer(recorder, stats="basic")
    >>> tracer.attach(model, modules=["model.layers.*"])
    >>> model(ids); tracer.detach()
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from ..recorder import Recorder
from .attach import Attaching
from .building import GRAPH_DRAIN_EVERY, GRAPH_OBSERVE_EVERY, RecordBuilding
from .call_text import StepContext
from .hook_makers import HookMaking
from .identity import ByIdentity
from .kept_calls import KeptCalls
from .module_view import ModuleView, ViewItem
from .noting import Noting
from .privacy import Scope, TokenTensors
from .readback import Readback
from .sampling import LEAD_LAPSE, StepSampler
from .step_state import GRAPH_DRAIN, FinishedStep, ThreadSteps
from .steps import Stepping
from .values import values_capture
from .worker import RecordWorker

if TYPE_CHECKING:
    from . import stepwrap

# The tracer, and what its users import from here: the integrations' module views, and
# the limits below (benchmarks and tests set them on this module).
__all__ = [
    "GRAPH_DRAIN_EVERY",
    "GRAPH_OBSERVE_EVERY",
    "LEAD_LAPSE",
    "PENDING_BYTES",
    "PENDING_CALLS",
    "ModuleView",
    "Tracer",
    "ViewItem",
]

# A call inside a traced forward is kept as it came (its arguments and output, held) and
# read with the others in one pass: at the step's end, or once PENDING_CALLS calls or
# PENDING_BYTES of their outputs are held. The hooks then run a few lines, and the walk,
# the notes and the statistics launches run warm, in a loop, instead of cold between the
# model's kernels (where the same code costs about 2.4x more). Holding keeps at most
# PENDING_BYTES of outputs per thread alive a little longer. Statistics mode keeps a call
# only where the version counters can prove the read sees the call's values: the first
# input a float tensor (its version noted before the call) and the output one tensor
# (noted after); a module seen writing its input or output in place is read at once from
# then on (Tracer._read_at_once).
PENDING_CALLS = 64
PENDING_BYTES = 64 << 20


def _engine_loaded() -> bool:
    """Whether a serving engine is imported here (see Tracer.defer_stats)."""
    import sys

    return "sglang" in sys.modules or "vllm" in sys.modules


def _device_busy(on_device: bool, capturing: bool, readback: Readback | None) -> Callable[[], bool] | None:
    """A probe of whether the work queued so far on the current CUDA stream still runs
    (an event query: never blocks). None off CUDA or while a graph is captured."""
    if not on_device or capturing or not torch.cuda.is_available():
        return None
    if readback is not None and readback.has_events():
        return readback.busy  # its copies were queued last: the same question, no new event
    try:
        event = torch.cuda.Event()
        event.record()
        return event.query
    except Exception:
        return None


def _holds_mutable(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """Whether a call got a list or a dict, which its caller may change after it (a kept
    call's walk would then see the later contents): such a call is read at once."""
    for value in args:
        if type(value) is list or type(value) is dict:
            return True
    if kwargs:
        for value in kwargs.values():
            if type(value) is list or type(value) is dict:
                return True
    return False


def _landed(item: Any) -> bool:
    """Whether a queued step can be built without waiting on the device (a graph drain
    is left to the worker)."""
    return item is not GRAPH_DRAIN and (item.readback is None or item.readback.ready())


class Tracer(Attaching, Stepping, HookMaking, KeptCalls, Noting, RecordBuilding):
    """Hooks modules and produces one list of call records per step."""

    def __init__(self, recorder: Recorder, *, stats: str = "basic", sample: int = 1, budget: float = 0.0) -> None:
        self.recorder = recorder
        self._replay: Any = None  # SPECTRACE_REPLAY's capture of a draft (hooks/replay_capture.py)
        self._target_tap: Any = None  # ... and the target's next-token choices at the same rows
        self.stats_mode = stats
        # SPECTRACE_SAMPLE, SPECTRACE_BUDGET: which steps are left out (sampling.py).
        self._sampler = StepSampler(recorder, sample, budget)
        self.sample = self._sampler.sample
        self.budget = self._sampler.budget
        self.step = -1
        self.auto_step = True
        self._handles: list[Any] = []
        # By the object, not its id (identity.py): a model built after one was freed may reuse its id.
        self._wrapped: ByIdentity[stepwrap.Handle] = ByIdentity()
        self._active = True
        self._local = threading.local()
        self._seq = 0
        self._counter_lock = threading.Lock()
        self._hooked: ByIdentity[str] = ByIdentity()
        self.roles: dict[str, str] = {}  # hooked name -> its role, for those that have one (kept after detach)
        self._adopted: ByIdentity[tuple[Any, ...]] = ByIdentity()
        # Integrations (SGLang) plug in here; the engine itself knows no engine.
        self.context_of: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], StepContext | None] | None = None
        self.views: Callable[[str, nn.Module], ModuleView | None] | None = None  # per hooked module, at attach
        self.graph_slots: Any = None  # a hooks.graph_slots.GraphSlots: statistics inside captured graphs
        # Called with each call record's fields on the thread that builds them (live checks).
        self.observers: list[Callable[[dict[str, Any]], None]] = []
        self._graph_pending = 0
        self._graph_readouts = 0
        # Where records are built: "auto" = a CPU-only step inline; outside a serving engine
        # a device step with nothing to read back inline too, and the others queued for the
        # worker thread, the host building those whose statistics have landed at its later
        # steps' ends (RecordWorker.build_landed_here; the worker keeps what is left); under
        # a serving engine every device step on the worker. "always" = every step on the
        # worker (tests drive it on the CPU).
        self.offload = "auto"
        self._values_lock = threading.Lock()
        self._values: collections.OrderedDict[int, list[list[float] | None]] = collections.OrderedDict()  # worker side
        self._worker = RecordWorker(self._build_step, self._drop_step)
        # Privacy: no statistics of tensors that are a function of one token id (privacy.py).
        self.token_stats = bool(getattr(recorder.settings, "token_stats", False))
        # Batch the statistics launches of small accelerator tensors (readback.StepStats.defer).
        # Off under a serving engine: its custom kernels write in place without bumping a
        # tensor's version, so a held tensor could be read after the write unnoticed.
        self.defer_stats = True
        self._token_tensors = TokenTensors()
        self._token_refs = self._token_tensors.refs  # (the same dict for the tracer's life)
        # Hooked name -> which of its tensors are a function of the token ids alone, from
        # its place in the model (privacy.token_scope: layer 0's input norm and q/k/v, ...).
        self._token_scope: dict[str, Scope] = {}
        # Modules whose calls are read at their hooks (see PENDING_CALLS): seen writing their input
        # or output in place, or a held tensor of theirs written before its batched launch.
        self._read_at_once: set[str] = set()
        # SPECTRACE_CAPTURE_VALUES: the fused draft input's first rows and their ids (values.py).
        self.values = values_capture(recorder)
        self._step = functools.partial(Tracer._step_around, self)
        self._step.compiled = self._compiled  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- steps
    def _thread(self) -> ThreadSteps:
        state = getattr(self._local, "steps", None)
        if state is None:
            state = self._local.steps = ThreadSteps(self.step, defer=self.defer_stats and not _engine_loaded())
        return state

    def finish_step(self, wait: bool = True) -> None:
        """End this thread's step: start its statistics copy and queue it for the worker.

        Nothing here waits for the device. With ``wait=True`` (anything about to read the
        trace) it then waits until the worker has turned every queued step into records.
        """
        state = self._thread()
        if state.pending:
            self._read_pending(state)
        calls, state.calls = state.calls, []
        on_device, state.on_device = state.on_device, False
        if state.seen:
            seen, state.seen = state.seen, 0
            self.recorder.count("calls_seen", seen)
        step, start, end = state.step, state.start_ns or time.time_ns(), time.time_ns()
        readback = None
        try:
            readback = state.stats.start_readback()
        except Exception as exc:
            self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
        if state.stats.written_owners:
            # Their tensors were written while held for a batched launch: read and launched
            # at their calls from now on.
            self._read_at_once |= state.stats.written_owners
            state.stats.written_owners.clear()
        skipped = state.stats.skipped_modified - state.skipped_seen
        if skipped:
            state.skipped_seen += skipped
            self.recorder.count("stats_skipped_modified", skipped)
            self.recorder.coverage(
                "not_covered",
                "statistics skipped for tensors written in place after their call and before their statistics were "
                "taken (counted in stats_skipped_modified; their shapes are recorded; a module seen writing its input "
                "or output in place is read at its call from then on)",
                step=step,
            )
        if calls or readback is not None:
            # A step without calls may still hold the input statistics of a call that ends
            # in the next step: the worker keeps them by generation.
            item = FinishedStep(step, calls, start, end, readback)
            # Outside a serving engine the host builds the steps whose statistics have
            # landed itself (RecordWorker.build_landed_here); the device is never waited for.
            here = self.offload == "auto" and not _engine_loaded()
            if ((not on_device and self.offload != "always") or (here and readback is None)) and self._worker.idle():
                # CPU only, or nothing to read back: built here, in order. (On the CPU the
                # host never waits on a device, so a second thread has no idle time to use
                # and would only contend for the GIL.)
                self._build_step(item, on_worker=False)
            elif here:
                # The worker is not woken for it: the host builds it at a later step's end,
                # or the worker does once the lag has passed.
                self._worker.submit(item, busy=_device_busy(on_device, state.capturing, readback), wake=False)
                self._worker.build_landed_here(_landed)
            else:
                self._worker.submit(item, busy=_device_busy(on_device, state.capturing, readback))
        if wait:
            if self.graph_slots is not None:
                self._drain_graphs(final=True)
            if not self._worker.flush():
                self.recorder.internal_error("record worker: flush timed out (records still queued)")

    # ------------------------------------------------------------ keeping calls
    def _keep(self, state: ThreadSteps, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, version: int | None) -> None:
        """Keep a call for the step's read (see PENDING_CALLS); ``version``: its first input's
        before the call, None in shapes-only mode (no version to prove)."""
        pending = state.pending
        if version is None:
            pending.append((spec, args, kwargs, output, time.time(), None, None, 0))
        elif type(output) is torch.Tensor and not output.is_inference():
            pending.append((spec, args, kwargs, output, time.time(), version, output, output._version))
        else:  # no output tensor whose version proves its values later: read now
            pending.append((spec, args, kwargs, output, time.time(), version, None, 0))
            self._read_pending_counted(state)
            return
        if type(output) is torch.Tensor:
            state.pending_bytes += output.nbytes
        if len(pending) >= PENDING_CALLS or state.pending_bytes > PENDING_BYTES or _holds_mutable(args, kwargs):
            self._read_pending_counted(state)  # (a list or dict argument may change before a later read)

    def _read_pending_counted(self, state: ThreadSteps) -> None:
        """:meth:`_read_pending` from a hook, its time handed to the budget (its floor of a
        traced step's cost)."""
        budget = self.budget
        if budget is None:
            self._read_pending(state)
            return
        began = time.perf_counter()
        try:
            self._read_pending(state)
        finally:
            budget.spent(time.perf_counter() - began)

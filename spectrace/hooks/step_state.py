"""The tracer's per-thread state and the items it hands to the record worker.

:class:`ThreadSteps` is one thread's open step (threads sharing a model never mix their
calls); :class:`FinishedStep` a step handed on to be built into records; the sentinels
mark the hooks' inputs stack (:data:`NO_INPUTS`, :data:`UNTRACED`) and the worker's queue
(:data:`GRAPH_DRAIN`).
"""

from __future__ import annotations

from typing import Any

import torch

from .call_text import RawCall, RawTensor, StepContext
from .readback import Readback, StepStats

# A call kept for a later read: ((name, module_type, root, role), args, kwargs, output,
# t_unix, the first input's version before the call or None, the output tensor with
# statistics and its version after the call, or None). The versions prove at the read
# that the statistics see the values of the call (shapes only: none needed).
Pending = tuple[tuple[str, str, str, "str | None"], Any, Any, Any, float, "int | None", "torch.Tensor | None", int]


class ThreadSteps:
    """One thread's open step: threads sharing a model never mix their calls."""

    def __init__(self, step: int, defer: bool = False) -> None:
        self.step = step
        self.start_ns = 0
        self.capturing = False
        self.warming = False  # an engine's eager warm-up before a capture: compile, record nothing
        # A step that sampling leaves out (SPECTRACE_SAMPLE, SPECTRACE_BUDGET): its calls run
        # the module alone and are counted. Decided once, when the step opens.
        self.untraced = False
        self.context: StepContext | None = None
        self.on_device = False  # any traced tensor of this step lives on an accelerator
        self.calls: list[RawCall] = []
        self.seen = 0  # calls seen this step, added to the calls_seen counter at its end (one lock per step)
        self.stats = StepStats(defer=defer)
        self.skipped_seen = 0  # stats.skipped_modified already counted in the trace
        # Calls kept as they came, read in one pass later (kept_calls.KeptCalls._read_pending),
        # and the bytes of the outputs they keep alive.
        self.pending: list[Pending] = []
        self.pending_bytes = 0


class FinishedStep:
    __slots__ = ("step", "calls", "start_ns", "end_ns", "readback")

    def __init__(self, step: int, calls: list[RawCall], start_ns: int, end_ns: int, readback: Readback | None) -> None:
        self.step, self.calls, self.start_ns, self.end_ns, self.readback = step, calls, start_ns, end_ns, readback


GRAPH_DRAIN: Any = FinishedStep(-1, [], 0, 0, None)  # "read the landed graph copies" (a worker item)

NO_INPUTS: list[RawTensor] = []  # a call whose inputs could not be noted (never appended to)
# A call of a step left out by sampling: its pre-hook's entry on the inputs stack, so its
# post-hook pops one entry per call in every step, and a call that crosses from an untraced
# step into a traced one (a hooked root) is still matched.
UNTRACED: list[RawTensor] = []

# First-input dtypes of a call kept for a later read in statistics mode (engine.PENDING_CALLS):
# those that get statistics, so the guarded tensor is the one summarised.
KEPT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})

"""Steps: each outermost call of a traced root's ``forward`` opens one, unless the host
numbers them itself (:meth:`Stepping.set_step`, a speculative loop marking its steps).

The forward wrapper (:mod:`.stepwrap`) calls :meth:`Stepping._step_around` for every call
of a wrapped root; the depth it keeps per thread tells an outermost call from a root
called inside another. Sampling's decision is taken as a step opens (:mod:`.sampling`);
its end is ``Tracer.finish_step`` (engine.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from .graph_branch import capturing as _capturing
from .tracer_base import TracerBase


class Stepping(TracerBase):
    """Opening, numbering and closing steps around a traced root's forward."""

    def _step_around(self, root: nn.Module, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._active:
            return call(*args, **kwargs)
        depth = self._depth()
        if self._adopted and depth == 0:
            self._attach_adopted(root)
        opened = self._open_step(depth, root)
        if opened and self.context_of is not None:
            state = self._thread()
            try:
                state.context = self.context_of(root, args, kwargs)
            except Exception as exc:
                state.context = None
                self.recorder.internal_error(f"step context: {type(exc).__name__}: {exc}")
        if depth == 0 and self.values is not None:  # an outermost forward, whoever numbers the steps
            self.values.note_root(args, kwargs)
        stack = self._local.__dict__.setdefault("inputs", [])
        pending = len(stack)  # a hooked root's own pre-hook ran before this wrapper
        try:
            return call(*args, **kwargs)
        finally:
            # Back to the depth this call found, whatever happened inside: a root called
            # inside another (an HF LM head around its backbone) must not leave it raised.
            self._local.depth = depth
            if depth == 0 and self.values is not None:
                self.values.end_root()
            if opened:
                # A module that raised inside left its inputs on the stack (no post-hook ran).
                del stack[pending:]
                budget = self.budget
                if budget is None:
                    self.finish_step(wait=False)  # no host sync inside the forward
                else:
                    began = time.perf_counter()
                    self.finish_step(wait=False)
                    budget.spent(time.perf_counter() - began)

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _open_step(self, depth: int, root: nn.Module | None = None) -> bool:
        self._local.depth = depth + 1
        if depth == 0 and self.auto_step:
            with self._counter_lock:
                self.step += 1
                step = self.step
            state = self._thread()
            state.step, state.start_ns = step, time.time_ns()
            # Graphs are captured around whole forwards: one check per step, not per call.
            state.capturing = _capturing()
            sampler = self._sampler
            if sampler.active:
                sampler.decide(state, sampler.iteration_untraced(root))
            return True
        return False

    def set_step(self, step: int) -> None:
        """Take over step numbering (a speculative loop marks its own steps). A step marked
        again (before its target and before its draft) keeps its first decision."""
        budget = self.budget
        began = time.perf_counter()
        self.finish_step(wait=False)
        if budget is not None and self._sampler.marked is not None:
            budget.spent(time.perf_counter() - began)  # (the step decided last: its end is its cost)
        self.auto_step = False
        self.step = step
        state = self._thread()
        state.step, state.start_ns = step, time.time_ns()
        state.capturing = _capturing()
        self._sampler.mark(state, step)

    def next_step(self) -> int:
        """A step number for a graph replay (the same counter as eager steps)."""
        with self._counter_lock:
            self.step += 1
            return self.step

"""Which steps sampling leaves out (``SPECTRACE_SAMPLE``, ``SPECTRACE_BUDGET``).

Steps are sampled by loop iteration: the lead (a target, or the one model of a
``generate``) decides at each of its forwards, and the other models' forwards up to its
next one follow. Counting every model's forwards alike would trace one model only in a
loop that alternates two (a target and its draft) at an even interval. A step marked by
the host (``Tracer.set_step``) decides once, however often it is marked.

A left-out step's calls run the module alone and are counted; the first one is said once
(a ``not_covered`` coverage record), the others counted under it.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch.nn as nn

from .budget import StepBudget
from .step_state import ThreadSteps

# Sampling by loop iteration: a lead that has not run for this many forwards of other models
# (a warm-up before another model's loop) gives way to the model running now.
LEAD_LAPSE = 64


class StepSampler:
    """One tracer's sampling decisions: which iteration (or marked step) is left out."""

    def __init__(self, recorder: Any, sample: int = 1, budget: float = 0.0) -> None:
        self.recorder = recorder
        self.sample = max(1, sample)
        # SPECTRACE_BUDGET: the steps this tracer numbers are traced one in N, N measured
        # (budget.py); SPECTRACE_SAMPLE is then the smallest N.
        self.budget = StepBudget(budget, floor=self.sample) if budget > 0 else None
        self.active = self.sample > 1 or self.budget is not None  # some steps may be left out
        self._lead: weakref.ref[nn.Module] | None = None  # the model whose forwards start an iteration
        self._lead_untraced = False  # the current iteration's decision
        self._iterations = 0  # the lead's forwards so far
        self._since_lead = 0  # other models' forwards since the lead's last one
        self.drafts: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # roots keyed draft or with draft roles
        self.marked: int | None = None  # the marked step (Tracer.set_step) decided last
        # What the first step left out says (once; later ones are counted under it)
        if self.budget is not None:
            self._untraced_detail = (
                f"SPECTRACE_BUDGET={self.budget.fraction:.3g}: loop iterations are traced one in N, N measured to keep tracing "
                "under that share of an iteration; the other steps' calls are counted (calls_seen), not recorded "
                "(counted in steps_untraced)"
            )
        else:
            self._untraced_detail = (
                f"SPECTRACE_SAMPLE={self.sample}: one loop iteration in {self.sample} is traced; the other steps' calls are "
                "counted (calls_seen), not recorded (counted in steps_untraced)"
            )

    def iteration_untraced(self, root: nn.Module | None) -> bool:
        """Whether the step ``root`` opens is left out (see the module's docstring).

        The lead is the first model to run, unless it is a draft (its modules have draft
        roles) and another model runs, or it has not run for :data:`LEAD_LAPSE` forwards of
        other models (a warm-up before another model's loop): then the model running now."""
        if root is None:
            return self._lead_untraced
        lead = self._lead() if self._lead is not None else None
        if lead is None or root is not lead and (self._since_lead >= LEAD_LAPSE or lead in self.drafts and root not in self.drafts):
            lead = root
            self._lead = weakref.ref(root)
        if root is lead:
            self._since_lead = 0
            self._lead_untraced = self.untraced_at(self._iterations)
            self._iterations += 1
        else:
            self._since_lead += 1
        return self._lead_untraced

    def untraced_at(self, count: int) -> bool:
        """Whether the iteration (or marked step) numbered ``count`` is left out: the
        budget's decision, else every SAMPLE-th one is traced. Never raises (traced then)."""
        if self.budget is not None:
            try:
                return not self.budget.decide(time.perf_counter())
            except Exception as exc:
                self.recorder.internal_error(f"budget: {type(exc).__name__}: {exc}")
                return False
        return self.sample > 1 and count >= 0 and count % self.sample != 0

    def mark(self, state: ThreadSteps, step: int) -> None:
        """A step the host marked: decided the first time it is marked only."""
        if step != self.marked:
            self.marked = step
            self.decide(state, self.untraced_at(step))

    def decide(self, state: ThreadSteps, untraced: bool) -> None:
        """Mark the step just opened as left out by sampling or not; say the first one once."""
        state.untraced = untraced
        if not untraced:
            return
        self.recorder.count("steps_untraced", 1)
        self.recorder.coverage("not_covered", self._untraced_detail, step=state.step)

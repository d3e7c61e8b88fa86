"""Which steps to trace so that tracing adds at most a given share to a loop (``SPECTRACE_BUDGET``).

A host-bound decode loop pays a traced step's host time in full: statistics of 40 modules
are a few milliseconds on steps of 20. :class:`StepBudget` times each step's period (its
start to the next step's start, the loop's own work between them included) and traces one
step in N (a step here is what the engine decides at once: a loop iteration, see
``sampling.StepSampler.iteration_untraced``). A traced step's cost is its period and that of the step after it, less two
baseline periods: the baseline is the untraced step just before a traced one (the
furthest from the last traced step). So the cost holds what the traced step pays and what
it leaves to the step after it (records written by a thread, the model's code run cold
again), and no more than two periods' noise (the sum over all N steps of an interval
would hold N). N is the smallest interval with

    median(cost) / (N * median(baseline period))  <=  fraction

over the last :data:`WINDOW` of each. A period is what the loop pays: a step whose extra
host time hides behind the device (a GPU-bound step of a loop that waits for each token)
costs what it delays the next step, nothing more.

The periods of a noisy host can hide a cost (a median difference of 0): spectrace's own
time in a traced step's read of its calls and its end (handed in with :meth:`spent`, two
clock readings a step) is a floor under the cost, measured without that noise.

It starts by alternating untraced and traced steps after the first one (a prefill or a
warm-up: traced, not measured) until it has :data:`BOOTSTRAP` costs. An estimate raises the
interval at most :data:`GROWTH` times (lowers it at once): a step or two run cold at the
start (lazy set-up, caches filled) would otherwise leave thousands of steps untraced until
the medians forget them. Where the budget
allows every step, one step in :data:`REPROBE` is still left untraced, for a fresh
baseline, so the interval follows a loop whose steps change. No torch here: only the
clock's readings, handed in by the engine.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from ..settings import BUDGET_MIN

BOOTSTRAP = 3  # costs measured before the interval is estimated
WINDOW = 16  # the last costs and baseline periods the medians are taken over
REPROBE = 16  # with room for every step, one untraced step in this many (a fresh baseline)
MAX_INTERVAL = 1_000_000
GROWTH = 4  # an estimate raises the interval at most this many times (a cold first step or two)


class StepBudget:
    """The tracing decision of each step, held to ``fraction`` of the step period.

    ``floor``: the smallest interval (``SPECTRACE_SAMPLE``, when both are set). Not
    thread-safe by design: one loop numbers the steps it decides; steps of several threads
    only blur the medians (the deques are appended under the GIL).
    """

    def __init__(self, fraction: float, floor: int = 1) -> None:
        if not (math.isfinite(fraction) and BUDGET_MIN <= fraction <= 1):
            raise ValueError(f"budget fraction {fraction!r} is not in [{BUDGET_MIN:g}, 1]")
        self.fraction = fraction
        self.floor = max(1, floor)
        self.interval = self.floor
        self.traced_steps = 0
        self.untraced_steps = 0
        self._costs: deque[float] = deque(maxlen=WINDOW)  # seconds a traced step added
        self._baseline: deque[float] = deque(maxlen=WINDOW)  # periods of untraced steps just before a traced one
        self._history: list[tuple[bool, float]] = []  # (traced, period) of the last steps, newest last (at most 3)
        self._since = 0  # steps decided since the last traced one
        self._since_untraced = 0  # steps decided since the last untraced one
        self._last: tuple[bool, float] | None = None  # (traced, start) of the step decided last
        self._decided = 0
        self._own: deque[float] = deque(maxlen=WINDOW)  # spectrace's own seconds in traced steps
        self._own_open = 0.0  # in the step decided last, so far

    def spent(self, seconds: float) -> None:
        """spectrace's own host time in the step decided last (its read of kept calls, its end)."""
        self._own_open += seconds

    @property
    def measured(self) -> bool:
        """Whether the interval is estimated (the bootstrap is over)."""
        return len(self._costs) >= BOOTSTRAP

    def decide(self, start: float) -> bool:
        """Whether the step starting at ``start`` (seconds, a monotonic clock) is traced."""
        last = self._last
        self._decided += 1
        if last is not None and self._decided > 2:  # (the first step's period is not a measure)
            if last[0]:
                self._own.append(self._own_open)
            self._period(last[0], start - last[1])
        self._own_open = 0.0
        if last is None:
            traced = True  # the first step: always traced
        elif not self.measured:
            traced = not last[0]  # alternate while measuring
        elif self.interval <= 1:
            traced = self._since_untraced + 1 < REPROBE
        else:
            traced = self._since + 1 >= self.interval
        if traced and last is not None and not last[0] and self._history and self._history[-1][0] is False:
            self._baseline.append(self._history[-1][1])  # the untraced step just before this traced one
        self._since = 0 if traced else self._since + 1
        self._since_untraced = self._since_untraced + 1 if traced else 0
        self._last = (traced, start)
        if traced:
            self.traced_steps += 1
        else:
            self.untraced_steps += 1
        return traced

    def _period(self, traced: bool, period: float) -> None:
        """The last step's period is known: a traced step's cost once the step after it is
        known too (with the step after it when that one was untraced)."""
        history = self._history
        history.append((traced, period))
        if len(history) > 3:
            del history[0]
        if len(history) < 2 or not self._baseline:
            return
        (before, p_before), (now, p_now) = history[-2], history[-1]
        base = statistics.median(self._baseline)
        if before and not now:
            cost = (p_before - base) + (p_now - base)  # a traced step and the untraced one after it
        elif before and now:
            cost = p_before - base  # a traced step followed by another: its own period alone
        else:
            return
        self._costs.append(cost)
        if self.measured:
            self.interval = self._estimate()

    def cost(self) -> float:
        """Seconds a traced step adds to the loop: the median cost, at least the median of
        spectrace's own time in a traced step (0 before measured)."""
        if not self.measured:
            return 0.0
        own = statistics.median(self._own) if self._own else 0.0
        return max(0.0, statistics.median(self._costs), own)

    def period(self) -> float:
        """The baseline: the median period of an untraced step just before a traced one, seconds."""
        return statistics.median(self._baseline) if self._baseline else 0.0

    def _estimate(self) -> int:
        period = self.period()
        if period <= 0:
            return MAX_INTERVAL
        ratio = self.cost() / (self.fraction * period)
        if not ratio < MAX_INTERVAL:  # (also a ratio that is not finite)
            wanted = MAX_INTERVAL
        else:
            wanted = math.ceil(ratio - 1e-9)  # (10.000000001 is 10)
        return min(MAX_INTERVAL, GROWTH * self.interval, max(self.floor, wanted))

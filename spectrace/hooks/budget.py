"""Which steps to trace so that tracing adds at most a given share to a step (``SPECTRACE_BUDGET``).

A host-bound decode loop pays a traced step's host time in full: statistics of 40 modules
are a few milliseconds on steps of 20. :class:`StepBudget` times each step's period (its
start to the next step's start, the loop's own work between them included). A traced
step's cost is its period less that of the untraced step just before it: adjacent steps
share the load of the machine and the state of a warming loop, where two separate medians
would not. It traces one step in N, with N the smallest interval that keeps

    median(cost) / (N * median(untraced period))  <=  fraction

over the last :data:`WINDOW` of each. A period is what the loop pays: a step whose extra
host time hides behind the device (a GPU-bound step of a loop that waits for each token)
costs what it delays the next step, nothing more.

It starts by alternating untraced and traced steps after the first one (a prefill or a
warm-up: traced, not measured) until it has :data:`BOOTSTRAP` costs. Where the budget
allows every step, one step in :data:`REPROBE` is still left untraced, followed by a
traced one: a fresh cost, so the interval follows a loop whose steps change.

Work a traced step leaves to the record thread that runs during later untraced steps
counts as theirs, not as the traced step's cost. No torch here: only the clock's
readings, handed in by the engine.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

BOOTSTRAP = 3  # costs (traced periods beside the untraced one before) before the interval is estimated
WINDOW = 16  # the last costs and untraced periods the medians are taken over
REPROBE = 16  # with room for every step, one untraced step in this many (then a fresh cost)
MAX_INTERVAL = 1_000_000


class StepBudget:
    """The tracing decision of each step, held to ``fraction`` of the step period.

    ``floor``: the smallest interval (``SPECTRACE_SAMPLE``, when both are set). Not
    thread-safe by design: one loop numbers the steps it decides; steps of several threads
    only blur the medians (the deques are appended under the GIL).
    """

    def __init__(self, fraction: float, floor: int = 1) -> None:
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"budget fraction {fraction!r} is not in (0, 1]")
        self.fraction = fraction
        self.floor = max(1, floor)
        self.interval = self.floor
        self.traced_steps = 0
        self.untraced_steps = 0
        self._costs: deque[float] = deque(maxlen=WINDOW)  # traced period - the untraced period before, seconds
        self._untraced: deque[float] = deque(maxlen=WINDOW)  # periods of untraced steps
        self._since = 0  # steps decided since the last traced one
        self._since_untraced = 0  # steps decided since the last untraced one
        self._last: tuple[bool, float] | None = None  # (traced, start) of the step decided last
        self._before: float | None = None  # the period of the untraced step before the last one, if it was
        self._decided = 0

    @property
    def measured(self) -> bool:
        """Whether the interval is estimated (the bootstrap is over)."""
        return len(self._costs) >= BOOTSTRAP

    def decide(self, start: float) -> bool:
        """Whether the step starting at ``start`` (seconds, a monotonic clock) is traced."""
        last = self._last
        self._decided += 1
        if last is not None and self._decided > 2:  # (the first step's period is not a measure)
            period = start - last[1]
            if not last[0]:
                self._untraced.append(period)
                self._before = period
            else:
                if self._before is not None:
                    self._costs.append(period - self._before)
                    if self.measured:
                        self.interval = self._estimate()
                self._before = None
        if last is None:
            traced = True  # the first step: always traced
        elif not self.measured:
            traced = not last[0]  # alternate while measuring
        elif self.interval <= 1:
            traced = self._since_untraced + 1 < REPROBE
        else:
            traced = self._since + 1 >= self.interval
        self._since = 0 if traced else self._since + 1
        self._since_untraced = self._since_untraced + 1 if traced else 0
        self._last = (traced, start)
        if traced:
            self.traced_steps += 1
        else:
            self.untraced_steps += 1
        return traced

    def cost(self) -> float:
        """Seconds a traced step adds to its period: the median cost (0 before measured)."""
        if not self.measured:
            return 0.0
        return max(0.0, statistics.median(self._costs))

    def period(self) -> float:
        """The median period of an untraced step, seconds (0 before measured)."""
        return statistics.median(self._untraced) if self._untraced else 0.0

    def _estimate(self) -> int:
        period = self.period()
        if period <= 0:
            return MAX_INTERVAL
        wanted = math.ceil(self.cost() / (self.fraction * period))
        return min(MAX_INTERVAL, max(self.floor, wanted))

"""``acceptance_collapse`` while the writer still runs: the recent window of verify steps.

The writer says ``acceptance_collapse`` over the whole run when it finishes
(:func:`.calls.check_acceptance`); a server that never exits never says it. This check
judges the most recent :data:`~spectrace.rules.acceptance.COLLAPSE_WINDOW` verify steps as they arrive, with
the same floor (:data:`~spectrace.rules.acceptance.COLLAPSE_MEAN`), so a reader of a growing trace
(``spectrace view --follow``) knows as soon as the window shows it.

A verify step is one step's mean accept length over its requests: an
:class:`~spectrace.records.Acceptance` record, or the step as a reader folded it
(:class:`VerifyStep`). Findings it makes carry ``source="checks.acceptance_live"``: they
come from the records, not from the writer.

    >>> live = LiveAcceptance()
    >>> for i in range(8):
    ...     found = live.observe(Acceptance(step=i, accept_lengths=[1], draft_tokens=4))
    >>> found[0].code, live.now
    ('acceptance_collapse', 1.0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from ..records import Acceptance, Finding
from ..rules.acceptance import COLLAPSE_MEAN, COLLAPSE_WINDOW, batch_emptying, mean_accept_length
from ..rules.catalogue import finding
from .acceptance_sampling import SamplingTally, judge_low_window

SOURCE = "checks.acceptance_live"


class VerifyStep(NamedTuple):
    """One verify step: its number, its mean accept length, and the tokens proposed (k);
    ``sampling`` its requests' accept lengths apart for greedy and sampled, when the
    engine said how they were sampled; ``requests`` how many it verified (0: not known)."""

    step: int
    mean: float
    draft_tokens: int
    sampling: SamplingTally | None = None
    requests: int = 0


def verify_step(record: Acceptance) -> VerifyStep | None:
    """The step an acceptance record shows; None when it names no request (no mean to take)."""
    if not record.accept_lengths:
        return None
    sampling = None
    if record.greedy is not None:
        sampling = SamplingTally()
        sampling.add(record)
    return VerifyStep(record.step, mean_accept_length(record.accept_lengths), record.draft_tokens, sampling, len(record.accept_lengths))


def _window_sampling(steps: Sequence[VerifyStep]) -> SamplingTally:
    total = SamplingTally()
    for s in steps:
        if s.sampling is not None:
            t = s.sampling
            total.greedy_sum += t.greedy_sum
            total.greedy_n += t.greedy_n
            total.sampled_sum += t.sampled_sum
            total.sampled_n += t.sampled_n
            total.unknown_n += t.unknown_n
            if len(total.temperatures) < 8:
                total.temperatures |= t.temperatures
    return total


def check_collapse_window(
    window: Sequence[VerifyStep],
    *,
    run_mean: float | None = None,
    size: int = COLLAPSE_WINDOW,
    floor: float = COLLAPSE_MEAN,
    run_peak: int = 0,
) -> list[Finding]:
    """``acceptance_collapse`` when the last ``size`` steps of ``window`` average at most ``floor``.

    ``run_mean`` is the mean over every step so far, for the message; fewer than ``size``
    steps say nothing (one bad step is no collapse), nor does the window where the running
    batch empties (:func:`~spectrace.rules.acceptance.batch_emptying`; ``run_peak``: the run's
    largest batch so far).
    """
    recent = list(window)[-size:] if size > 0 else []
    if size <= 0 or len(recent) < size:
        return []
    if all(s.requests > 0 for s in recent) and batch_emptying([s.requests for s in recent], run_peak):
        return []
    mean = sum(s.mean for s in recent) / size
    # The same sum check_acceptance compares; the epsilon keeps an exact floor a collapse.
    if mean > floor + 1e-9:
        return []
    first, last = recent[0].step, recent[-1].step
    k = max(s.draft_tokens for s in recent)
    instead = judge_low_window(
        _window_sampling(recent), window_mean=mean, draft_tokens=k, first_step=first, last_step=last, floor=floor, source=SOURCE
    )
    if instead is not None:
        return instead  # sampling explains the window: only greedy requests judge the draft
    overall = f"{run_mean:.2f} over the run so far, " if run_mean is not None else ""
    evidence: dict[str, object] = {"window_mean": round(mean, 3), "window": size, "draft_tokens": k, "first_step": first}
    if run_mean is not None:
        evidence["run_mean"] = round(run_mean, 3)
    return [
        finding(
            "acceptance_collapse",
            f"mean accept length {mean:.2f} over the last {size} verify steps (steps {first}..{last}; {overall}k={k}), "
            "read live from the acceptance records: the target rejects almost every draft token",
            evidence=evidence,
            step=first,
            source=SOURCE,
        )
    ]


class LiveAcceptance:
    """The recent window of verify steps, fed one step at a time as a trace grows.

    :meth:`observe` returns the finding the first time the window collapses, and nothing
    after (a collapse lasts; it is said once). ``now`` is the window's mean accept length
    and ``run_mean`` the whole run's, so a status line can show both. Steps must come in
    order: a step at or below the last one is ignored (counted in ``out_of_order``).
    """

    def __init__(self, size: int = COLLAPSE_WINDOW, floor: float = COLLAPSE_MEAN) -> None:
        self.size = max(1, int(size))
        self.floor = floor
        self.window: deque[VerifyStep] = deque(maxlen=self.size)
        self.steps = 0
        self.last_step: int | None = None
        self.out_of_order = 0
        self.finding: Finding | None = None
        self.peak_batch = 0  # the largest batch of the run (the drain is judged against it)
        self._sum = 0.0

    @property
    def now(self) -> float | None:
        """Mean accept length over the window (the last ``size`` steps, or fewer at the start)."""
        return sum(s.mean for s in self.window) / len(self.window) if self.window else None

    @property
    def run_mean(self) -> float | None:
        """Mean accept length over every step observed (a mean of the steps' means)."""
        return self._sum / self.steps if self.steps else None

    def observe(self, item: Acceptance | VerifyStep) -> list[Finding]:
        """Take one step; the collapse finding the first time the window shows one, else []."""
        step = verify_step(item) if isinstance(item, Acceptance) else item
        if step is None:
            return []
        if self.last_step is not None and step.step <= self.last_step:
            self.out_of_order += 1
            return []
        self.last_step = step.step
        self.window.append(step)
        self.steps += 1
        self._sum += step.mean
        self.peak_batch = max(self.peak_batch, step.requests)
        if self.finding is not None or len(self.window) < self.size:
            return []
        found = check_collapse_window(self.window, run_mean=self.run_mean, size=self.size, floor=self.floor, run_peak=self.peak_batch)
        if found:
            self.finding = found[0]
        return found

"""``later_positions_rejected``: the draft's first position accepted, every later one rejected.

A verify step checks the k draft tokens in order; the target accepts position i only
where it accepted positions 1..i-1. So the rate at which position 2 is accepted among the
requests that accepted position 1 is the draft's own second step judged alone. A healthy
draft keeps it near its first position's rate; one whose later steps run on stale or
wrong inputs (a CUDA graph replaying the draft's later steps with the first step's
buffers, vllm#37639) is accepted at position 1 and almost never after, while the mean
accept length stays above the collapse floor and says nothing.

Both engines' records carry ``accepted_per_position`` (how many requests accepted each
position); :class:`PositionTally` sums them over the run and :func:`check_later_positions`
judges the sum.

    >>> t = PositionTally()
    >>> for i in range(64):
    ...     t.add(Acceptance(step=i, accept_lengths=[2, 1], draft_tokens=3, accepted_per_position=[1, 0, 0]))
    >>> [f.code for f in t.check(engine="vllm")]
    ['later_positions_rejected']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Acceptance, Finding
from ..rules.acceptance import FIRST_HEALTHY, LATER_DEAD, LATER_POSITIONS_CONFIRM, LATER_POSITIONS_EAGER, MIN_FIRST_ACCEPTED
from ..rules.catalogue import finding

SOURCE = "checks.acceptance_positions"


@dataclass
class PositionTally:
    """Requests verified and accepted per draft position, summed over the steps added."""

    requests: int = 0
    accepted: list[int] = field(default_factory=list)  # [i]: requests that accepted position i + 1
    first_step: int | None = None
    last_step: int | None = None
    said: bool = False

    def add_counts(self, step: int, requests: int, per_position: list[int]) -> None:
        """One verify step's request count and its ``accepted_per_position``."""
        if requests <= 0 or not per_position:
            return
        if len(self.accepted) < len(per_position):
            self.accepted += [0] * (len(per_position) - len(self.accepted))
        for i, n in enumerate(per_position):
            self.accepted[i] += n
        self.requests += requests
        self.first_step = step if self.first_step is None else self.first_step
        self.last_step = step

    def add(self, record: Acceptance) -> None:
        self.add_counts(record.step, len(record.accept_lengths), record.accepted_per_position)

    def check(self, *, engine: str | None = None, source: str = SOURCE) -> list[Finding]:
        """The finding the first time the sums show it (said once)."""
        if self.said:
            return []
        found = check_later_positions(self, engine=engine, source=source)
        self.said = bool(found)
        return found


def check_later_positions(t: PositionTally, *, engine: str | None = None, source: str = SOURCE) -> list[Finding]:
    """``later_positions_rejected`` when position 1 is healthy and position 2, among the requests
    that accepted position 1, is accepted at most :data:`~spectrace.rules.acceptance.LATER_DEAD`."""
    if len(t.accepted) < 2 or not t.requests:
        return []
    first, second = t.accepted[0], t.accepted[1]
    first_rate = first / t.requests
    if first < MIN_FIRST_ACCEPTED or first_rate < FIRST_HEALTHY:
        return []
    second_given_first = second / first
    if second_given_first > LATER_DEAD:
        return []
    rates = [round(n / t.requests, 3) for n in t.accepted]
    k = len(t.accepted)
    message = (
        f"draft position 1 is accepted by {first_rate:.0%} of {t.requests} verified requests, position 2 by "
        f"{second_given_first:.1%} of those that accepted position 1 (positions 1..{k}: {rates}; steps "
        f"{t.first_step}..{t.last_step}): the draft's first step is healthy and its later steps are dead, so the "
        "steps after the first run on other inputs than the first"
    )
    confirm = LATER_POSITIONS_CONFIRM.get(engine or "")
    fix = (
        f"{confirm}; {LATER_POSITIONS_EAGER}"
        if confirm
        else "rerun without CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph): if the later positions "
        f"are then accepted, the graph replay of the draft's later steps is at fault; {LATER_POSITIONS_EAGER}"
    )
    evidence: dict[str, object] = {
        "position_rates": rates,
        "second_given_first": round(second_given_first, 4),
        "requests": t.requests,
        "draft_tokens": k,
        "first_step": t.first_step,
    }
    if engine:
        evidence["engine"] = engine
    return [finding("later_positions_rejected", message, evidence=evidence, fix=fix, step=t.first_step, source=source)]

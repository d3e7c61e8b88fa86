"""``acceptance_workload``: acceptance inflated or deflated by what the requests generate.

A draft proposes what it has seen in the context, so output that loops (the same
n-grams again and again, typical of a prompt sent without the model's chat template) is
easy to draft: the run's accept length then measures the text, not the draft, and is no
evidence about the wiring either way. :class:`WorkloadTally` takes each finished
request's repeated n-gram rate (:func:`~spectrace.rules.acceptance.repeated_ngram_rate`)
and its own accepted drafts; :meth:`WorkloadTally.check` says it once, with the
accept rates of the looping requests and the others side by side.

    >>> t = WorkloadTally()
    >>> for i in range(16):
    ...     t.add(0.9 if i % 2 else 0.0, accepted=30 if i % 2 else 10, steps=10, draft_tokens=3)
    >>> [f.code for f in t.check()]
    ['acceptance_workload']
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import Finding
from ..rules.acceptance import LOOP_NGRAM, LOOP_RATE, LOOP_SHARE, MIN_FINISHED
from ..rules.catalogue import finding

SOURCE = "checks.workload"


@dataclass
class WorkloadTally:
    """Finished requests, and the drafts accepted over the verify steps of those that loop and the others."""

    finished: int = 0
    looping: int = 0
    loop_accepted: int = 0
    loop_steps: int = 0
    other_accepted: int = 0
    other_steps: int = 0
    draft_tokens: int = 0
    said: bool = False

    def add(self, rate: float, *, accepted: int, steps: int, draft_tokens: int = 0) -> None:
        """One finished request: its repeated n-gram rate, the drafts it accepted over its verify steps."""
        self.finished += 1
        self.draft_tokens = max(self.draft_tokens, draft_tokens)
        if rate > LOOP_RATE:
            self.looping += 1
            self.loop_accepted += accepted
            self.loop_steps += steps
        else:
            self.other_accepted += accepted
            self.other_steps += steps

    def check(self, *, source: str = SOURCE) -> list[Finding]:
        """The finding the first time the finished requests show it (said once)."""
        if self.said:
            return []
        found = check_workload(self, source=source)
        self.said = bool(found)
        return found


def check_workload(t: WorkloadTally, *, source: str = SOURCE) -> list[Finding]:
    """``acceptance_workload`` when at least LOOP_SHARE of MIN_FINISHED or more finished requests loop."""
    if t.finished < MIN_FINISHED or t.looping < LOOP_SHARE * t.finished:
        return []
    loop = 1 + t.loop_accepted / t.loop_steps if t.loop_steps else None
    other = 1 + t.other_accepted / t.other_steps if t.other_steps else None
    evidence: dict[str, object] = {
        "finished_requests": t.finished,
        "looping_requests": t.looping,
        "loop_rate": LOOP_RATE,
        "ngram": LOOP_NGRAM,
    }
    if loop is not None:
        evidence["looping_accept_length"] = round(loop, 3)
    if other is not None:
        evidence["other_accept_length"] = round(other, 3)
    share = f"{t.looping} of {t.finished} finished requests loop (over {LOOP_RATE:.0%} of their {LOOP_NGRAM}-grams repeat)"
    if loop is not None and other is not None:
        way = "inflated" if loop > other else "deflated"
        message = (
            f"{share}: they accept {loop:.2f} tokens a verify step against {other:.2f} for the others, so the run's "
            f"acceptance is {way} by the workload; it says how easy this text is to draft, not how the draft or its "
            "wiring does"
        )
    else:
        message = (
            f"{share}: every request judged loops, so acceptance is set by the workload (looping text is easy to draft) "
            "and says nothing of the draft or its wiring"
        )
    fix = (
        "judge the draft on requests that do not loop, with the other requests' accept length: send prompts through the "
        "model's chat template (a raw prompt often loops) or with a repetition penalty"
    )
    return [finding("acceptance_workload", message, evidence=evidence, fix=fix, source=source)]

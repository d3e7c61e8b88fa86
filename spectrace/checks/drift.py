"""``acceptance_drift``: the accept length falling over a run, beyond its noise, at a comparable batch.

A draft's weights do not change while it serves, so a draft that accepted well early in
a run and worse later, at the same batch size, the same share of greedy requests and
prompts of a like length, is being fed something else: state carried between requests (prefix- or radix-cache
blocks reused, or committed before their KV was written; KV reused across requests).

The run is cut into windows of verify steps (:class:`DriftWindow`, summed by
:class:`DriftTracker`). The first windows are the baseline; the latest comparable ones
are compared with it. A drop counts when it exceeds both an absolute floor and a
multiple of the baseline's own window-to-window spread, so a noisy run does not drift.

    >>> ws = [DriftWindow(i * 32, i * 32 + 31, 3.5 if i < 6 else 2.0, 256, 8.0) for i in range(12)]
    >>> [f.code for f in check_acceptance_drift(ws)]
    ['acceptance_drift']
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from ..records import Acceptance, Finding
from ..rules.catalogue import finding

SOURCE = "checks.drift"
DRIFT_STEPS = 32  # verify steps per window
MIN_WINDOWS = 6  # windows before anything is said: a baseline and a recent part of two each at least
MIN_DROP = 0.5  # accept-length units a drop must exceed ...
MIN_DROP_FRACTION = 0.15  # ... and this share of the baseline ...
NOISE_SIGMAS = 3.0  # ... and this many of the baseline windows' spread
BATCH_RATIO = 2.0  # comparable: mean batch within this factor of the baseline's
GREEDY_SHARE_DELTA = 0.2  # comparable: greedy share within this of the baseline's
PROMPT_RATIO = 2.0  # comparable: mean prompt length within this factor of the baseline's


class DriftWindow(NamedTuple):
    """Verify steps ``first_step..last_step``: their mean accept length per request, the
    requests verified, the mean batch size, the share of greedy requests and the mean
    prompt length of the requests verified (None: unknown)."""

    first_step: int
    last_step: int
    mean: float
    requests: int
    batch: float
    greedy_share: float | None = None
    prompt_len: float | None = None


def _comparable(w: DriftWindow, batch: float, share: float | None, prompt_len: float | None = None) -> bool:
    if batch > 0 and not (batch / BATCH_RATIO <= w.batch <= batch * BATCH_RATIO):
        return False
    if prompt_len and w.prompt_len and not (prompt_len / PROMPT_RATIO <= w.prompt_len <= prompt_len * PROMPT_RATIO):
        return False  # other prompts (a RAG load after a chat one) accept otherwise, with nothing carried between them
    return share is None or w.greedy_share is None or abs(w.greedy_share - share) <= GREEDY_SHARE_DELTA


def check_acceptance_drift(windows: Sequence[DriftWindow], *, source: str = SOURCE) -> list[Finding]:
    """One warning when the latest comparable windows accept clearly less than the first ones."""
    ws = [w for w in windows if w.requests > 0]
    if len(ws) < MIN_WINDOWS:
        return []
    part = max(2, len(ws) // 3)
    base = ws[:part]
    base_mean = sum(w.mean * w.requests for w in base) / sum(w.requests for w in base)
    base_batch = statistics.fmean(w.batch for w in base)
    shares = [w.greedy_share for w in base if w.greedy_share is not None]
    base_share = statistics.fmean(shares) if shares else None
    spread = statistics.pstdev(w.mean for w in base)
    prompts = [w.prompt_len for w in base if w.prompt_len is not None]
    base_prompt = statistics.fmean(prompts) if prompts else None
    threshold = max(MIN_DROP, MIN_DROP_FRACTION * base_mean, NOISE_SIGMAS * spread)
    later = [w for w in ws[part:] if _comparable(w, base_batch, base_share, base_prompt)]
    recent = later[-part:]
    if len(recent) < 2:
        return []
    recent_mean = sum(w.mean * w.requests for w in recent) / sum(w.requests for w in recent)
    if base_mean - recent_mean <= threshold:
        return []
    # Where it fell: the first comparable window below the line from which the run stays
    # mostly below it (a lone dip that recovered is not where it fell).
    line = base_mean - threshold
    fell = recent[0]
    for i, w in enumerate(later):
        rest = later[i:]
        if w.mean < line and sum(1 for x in rest if x.mean < line) * 2 > len(rest):
            fell = w
            break
    message = (
        f"mean accept length fell from {base_mean:.2f} (steps {base[0].first_step}..{base[-1].last_step}) to {recent_mean:.2f} "
        f"(steps {recent[0].first_step}..{recent[-1].last_step}) at a comparable batch ({base_batch:.1f} vs "
        f"{statistics.fmean(w.batch for w in recent):.1f} requests per step); it fell in steps {fell.first_step}..{fell.last_step}. "
        "The draft's weights do not change: state carried between requests does (prefix/radix cache, KV reuse)"
    )
    evidence: dict[str, object] = {
        "baseline_mean": round(base_mean, 3),
        "recent_mean": round(recent_mean, 3),
        "threshold": round(threshold, 3),
        "baseline_steps": [base[0].first_step, base[-1].last_step],
        "recent_steps": [recent[0].first_step, recent[-1].last_step],
        "fell_in_steps": [fell.first_step, fell.last_step],
        "baseline_batch": round(base_batch, 2),
        "recent_batch": round(statistics.fmean(w.batch for w in recent), 2),
        "windows": len(ws),
    }
    recent_prompts = [w.prompt_len for w in recent if w.prompt_len is not None]
    if base_prompt is not None and recent_prompts:
        evidence["baseline_prompt_len"] = round(base_prompt, 1)
        evidence["recent_prompt_len"] = round(statistics.fmean(recent_prompts), 1)
    return [finding("acceptance_drift", message, evidence=evidence, step=fell.first_step, source=source)]


class DriftTracker:
    """Folds acceptance records into :class:`DriftWindow` s, bounded: the first windows (the
    baseline) are kept, and the most recent ones up to ``keep``."""

    def __init__(self, steps: int = DRIFT_STEPS, keep: int = 192) -> None:
        self.steps = max(1, steps)
        self.head: list[DriftWindow] = []
        self.tail: deque[DriftWindow] = deque(maxlen=max(MIN_WINDOWS, keep))
        self.head_size = max(MIN_WINDOWS, keep // 3)
        self._reset()
        self.said = False

    def _reset(self) -> None:
        self._first: int | None = None
        self._last = 0
        self._n_steps = 0
        self._sum = 0
        self._requests = 0
        self._greedy = 0
        self._known = 0
        self._prompt_sum = 0
        self._prompt_n = 0

    def add(
        self, step: int, accept_lengths: Sequence[int], greedy: Sequence[bool] | None = None, prompt_tokens: Sequence[int] | None = None
    ) -> DriftWindow | None:
        """Take one verify step; the window it completed, if any."""
        if not accept_lengths:
            return None
        known = greedy is not None and len(greedy) == len(accept_lengths)
        prompts = sum(prompt_tokens) if prompt_tokens is not None and len(prompt_tokens) == len(accept_lengths) else None
        return self.add_sums(
            step, sum(accept_lengths), len(accept_lengths), sum(1 for g in greedy if g) if known and greedy else None, prompts
        )

    def add_sums(
        self, step: int, lengths_sum: int, requests: int, greedy: int | None = None, prompt_tokens: int | None = None
    ) -> DriftWindow | None:
        """:meth:`add` from a step's sums (an engine hook has them already): the accept lengths'
        sum, the requests, how many of them were greedy and their prompts' tokens summed
        (None: unknown)."""
        if requests <= 0:
            return None
        if self._first is None:
            self._first = step
        self._last = step
        self._n_steps += 1
        self._sum += lengths_sum
        self._requests += requests
        if greedy is not None:
            self._known += requests
            self._greedy += greedy
        if prompt_tokens is not None:
            self._prompt_n += requests
            self._prompt_sum += prompt_tokens
        if self._n_steps < self.steps:
            return None
        window = DriftWindow(
            self._first,
            self._last,
            self._sum / self._requests,
            self._requests,
            self._requests / self._n_steps,
            self._greedy / self._known if self._known else None,
            self._prompt_sum / self._prompt_n if self._prompt_n else None,
        )
        (self.head if len(self.head) < self.head_size else self.tail).append(window)
        self._reset()
        return window

    def add_record(self, record: Acceptance) -> DriftWindow | None:
        return self.add(record.step, record.accept_lengths, record.greedy, record.prompt_tokens)

    @property
    def windows(self) -> list[DriftWindow]:
        return [*self.head, *self.tail]

    def check(self, *, source: str = SOURCE) -> list[Finding]:
        """The drift finding the first time the windows show one (said once)."""
        if self.said:
            return []
        found = check_acceptance_drift(self.windows, source=source)
        self.said = bool(found)
        return found

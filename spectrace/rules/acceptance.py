"""What an accept length is, and when a run of them is a collapse.

An accept length is the tokens one verify step gives a request: the draft tokens the
target accepted plus its own bonus token, so 1 (nothing accepted) to k + 1. Every place
that shows or judges acceptance (the engine hooks, the checks, the viewers, the demo, the
toy loop) takes the mean the same way, here.

    >>> mean_accept_length([1, 2, 4]), mean_accept_length([])
    (2.3333333333333335, 0.0)
    >>> mean_from_sums(7, 3), mean_from_sums(0, 0) is None
    (2.3333333333333335, True)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

# acceptance_collapse: this many verify steps in a row whose mean accept length is at most
# COLLAPSE_MEAN. A working draft gets well above 1 token a step; one whose input is wrong
# falls to about 1 (the bonus token alone).
COLLAPSE_WINDOW = 8
COLLAPSE_MEAN = 1.2
# The drain: as a load's clients stop, no request arrives and the running batch empties
# over its last verify steps, which verify a few stragglers at the ends of their
# generations rather than the load. A window whose batch only falls, to at most this share
# of the largest batch the run has served, is not judged a collapse; a window at a steady
# or growing batch is (a real collapse lasts into one).
DRAIN_SHARE = 0.5


def mean_accept_length(lengths: Collection[int]) -> float:
    """The mean of the accept lengths (requests of one step, or steps of a run); 0.0 for none,
    which no real step gives (every step yields at least the bonus token)."""
    return sum(lengths) / len(lengths) if lengths else 0.0


def mean_from_sums(total: float, count: int) -> float | None:
    """The same mean from running sums (a viewer or a metric folds records into totals);
    None where nothing was counted."""
    return total / count if count else None


def batch_emptying(batches: Sequence[int], run_peak: int = 0) -> bool:
    """Is this the window where the running batch empties? ``batches``: requests verified per
    step, in order; ``run_peak``: the largest batch of the run so far. True when the batch
    never grows over the window, falls in it, and ends at most :data:`DRAIN_SHARE` of the
    larger of ``run_peak`` and the window's first step. A steady batch, even of one request,
    is judged.

    >>> batch_emptying([4, 4, 3, 3, 2, 2, 1, 1]), batch_emptying([1] * 8), batch_emptying([4, 2, 4, 2])
    (True, False, False)
    >>> batch_emptying([7, 7, 6, 6, 5, 5, 4, 4]), batch_emptying([7, 7, 6, 6, 5, 5, 4, 4], run_peak=8)
    (False, True)
    """
    if len(batches) < 2 or batches[-1] >= batches[0]:
        return False
    peak = max(run_peak, batches[0])
    return batches[-1] <= peak * DRAIN_SHARE and all(b <= a for a, b in zip(batches, batches[1:]))

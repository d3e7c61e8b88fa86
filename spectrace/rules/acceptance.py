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

from collections.abc import Collection

# acceptance_collapse: this many verify steps in a row whose mean accept length is at most
# COLLAPSE_MEAN. A working draft gets well above 1 token a step; one whose input is wrong
# falls to about 1 (the bonus token alone).
COLLAPSE_WINDOW = 8
COLLAPSE_MEAN = 1.2


def mean_accept_length(lengths: Collection[int]) -> float:
    """The mean of the accept lengths (requests of one step, or steps of a run); 0.0 for none,
    which no real step gives (every step yields at least the bonus token)."""
    return sum(lengths) / len(lengths) if lengths else 0.0


def mean_from_sums(total: float, count: int) -> float | None:
    """The same mean from running sums (a viewer or a metric folds records into totals);
    None where nothing was counted."""
    return total / count if count else None

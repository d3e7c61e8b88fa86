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


def chain_accept_length(agreement: float, steps: int) -> float:
    """The accept length a chain of ``steps`` greedy draft tokens gives when each step agrees
    with the target at rate ``agreement`` (the first step's, taken for every step): the
    bonus token plus each draft token kept while all before it were, 1 + a + a^2 + ... + a^k.

    >>> round(chain_accept_length(0.975, 4), 2), chain_accept_length(0.0, 4), chain_accept_length(1.0, 3)
    (4.76, 1.0, 4.0)
    """
    return sum(agreement**i for i in range(steps + 1))


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95 % by default) of a rate of ``hits`` in ``n`` trials;
    (0, 1) for no trials. Unlike the normal interval it stays inside [0, 1] and is not
    of zero width at 0 or n hits.

    >>> tuple(round(x, 3) for x in wilson(93, 100))
    (0.863, 0.966)
    """
    if n <= 0:
        return 0.0, 1.0
    p = hits / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    return max(0.0, centre - half), min(1.0, centre + half)

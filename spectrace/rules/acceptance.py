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


# later_positions_rejected: the first draft position is accepted by at least FIRST_HEALTHY of
# the requests, and of those, at most LATER_DEAD accept the second. A healthy draft accepts
# each later position given the one before at a rate near the first's (0.5-0.9); a draft
# whose later steps get stale or wrong inputs (a graph replayed with the first step's
# buffers) is accepted at its first position alone. MIN_FIRST_ACCEPTED requests must have
# accepted the first position before the second's rate is judged.
FIRST_HEALTHY = 0.3
LATER_DEAD = 0.05
MIN_FIRST_ACCEPTED = 32

# What confirms it on each engine, and the knob that changes how the draft's later steps run.
LATER_POSITIONS_CONFIRM: dict[str, str] = {
    "vllm": (
        "rerun with --enforce-eager (no CUDA graphs, no torch.compile): if positions 2 and later are then accepted, the "
        "graph replay of the draft's later steps is at fault; serve with compilation_config cudagraph_mode PIECEWISE "
        "(or NONE) until the engine is fixed, and report it to vLLM"
    ),
    "sglang": (
        "rerun with --disable-cuda-graph: if positions 2 and later are then accepted, the draft's CUDA graph "
        "(EAGLEDraftCudaGraphRunner) replays its later steps on stale inputs; serve without it until the engine is "
        "fixed, and report it to SGLang"
    ),
}
LATER_POSITIONS_EAGER = (
    "if eager serving shows the same, the draft's own later steps are wrong: the hidden state it feeds back to "
    "itself (the engine's handoff between draft steps), or a draft trained for one step only (SpecForge ttt_length 1)"
)


# acceptance_workload: output that loops is easy to draft (the draft has seen the n-grams
# in the context), so a workload whose requests loop makes acceptance say more about the
# text than about the draft. A request loops when over LOOP_RATE of its LOOP_NGRAM-grams
# repeat one earlier in its output; a workload does when LOOP_SHARE of at least
# MIN_FINISHED finished requests loop. At most LOOP_TOKENS output tokens of a request are
# read (its last ones), and past LOOP_EVERY_AFTER finished requests one in LOOP_EVERY: a
# workload is judged on a sample, at a bounded cost to the engine's scheduler.
LOOP_NGRAM = 4
LOOP_RATE = 0.75  # a loop repeats nearly every n-gram once it has gone round; high, so repetitive code is no loop
LOOP_SHARE = 0.3
MIN_FINISHED = 16
LOOP_TOKENS = 1024
LOOP_EVERY_AFTER = 256
LOOP_EVERY = 16


def repeated_ngram_rate(tokens: Sequence[int], n: int = LOOP_NGRAM) -> float:
    """The share of the n-grams of ``tokens`` that repeat one earlier in them (0.0 for fewer than n + 1 tokens).

    >>> repeated_ngram_rate([1, 2, 3, 4] * 4), repeated_ngram_rate(list(range(16)))
    (0.6923076923076923, 0.0)
    """
    count = len(tokens) - n + 1
    if count < 2:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for i in range(count):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            repeated += 1
        else:
            seen.add(gram)
    return repeated / count

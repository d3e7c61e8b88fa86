"""What the viewer holds at most, and what a record may claim before anything is sized by it.

Memory is bounded whatever the trace's length or the number of files: the bounds below
(:data:`LIMITS`), the record text a set of files may keep parsed (:class:`LoadBudget`),
and :func:`implausible` for a schema-valid record whose sizes or counts cannot be true.
"""

from __future__ import annotations

import math
import re
from typing import Any

from spectrace.records import Acceptance, Call, Capture, Coverage, Fingerprint

MAX_LINE_BYTES = 1 << 20  # a record this long is a writer bug or not a trace; never hold it
MAX_CALLS_PER_FILE = 200_000  # a second bound on calls, below the byte budget's for tiny records
# The record text the viewer keeps parsed, all files of one set together (about 10x that in
# memory: ~170 MB). Each file gets at least its share (the budget over the files found) or
# MIN_FILE_SHARE, so one huge rank cannot crowd out the others.
MAX_KEPT_BYTES = 16 << 20
MIN_FILE_SHARE = 2 << 20
MAX_FINDINGS_PER_CODE = 1_000  # per file: a flood of one code is kept as counts past this
MAX_FOLDED_CODES = 64  # distinct codes folded to counts per file; others share one line
MAX_ACCEPTANCE_STEPS = 100_000  # distinct steps with a per-step acceptance entry, per set
MAX_POSITIONS = 64  # draft positions with an acceptance rate
MAX_COUNTERS = 8  # closing/periodic counters records kept per file (cumulative: the newest count)
# What a record may claim before the viewer sizes anything by it.
MAX_DRAFT_TOKENS = 1024
MAX_INT = 2**63  # any integer in a record beyond +-2^63 is not a count, a size or a step
MAX_NUMEL = 2**62
MAX_DIMS = 64
MAX_NESTING = 32  # lists and objects inside each other: the writer's records nest 6 deep; printing and JSON recurse
MAX_UNIX = 253_402_300_799.0  # 9999-12-31: the last time a date can show

LIMITS = {
    "line_bytes": MAX_LINE_BYTES,
    "kept_record_bytes": MAX_KEPT_BYTES,
    "min_file_share_bytes": MIN_FILE_SHARE,
    "calls_per_file": MAX_CALLS_PER_FILE,
    "findings_per_code_per_file": MAX_FINDINGS_PER_CODE,
    "acceptance_steps": MAX_ACCEPTANCE_STEPS,
    "acceptance_positions": MAX_POSITIONS,
    "draft_tokens": MAX_DRAFT_TOKENS,
    "nesting": MAX_NESTING,
}


class LoadBudget:
    """The record text one set of files may keep parsed (:data:`MAX_KEPT_BYTES`), shared out
    fairly: a file takes from it while the set and its own share (the budget over the files
    found, at least :data:`MIN_FILE_SHARE`) both have room. Also the set's acceptance steps."""

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES, max_steps: int = MAX_ACCEPTANCE_STEPS) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.files = 1
        self.max_steps = max_steps
        self.steps = 0

    def take(self, mine: int, n: int) -> bool:
        share = max(MIN_FILE_SHARE, self.max_bytes // max(1, self.files))
        if self.used + n > self.max_bytes or mine + n > share:
            return False
        self.used += n
        return True

    def release(self, n: int, steps: int) -> None:
        self.used = max(0, self.used - n)
        self.steps = max(0, self.steps - steps)


def time_ok(t: float | None) -> bool:
    """A time stamp the viewer can show as a date: finite, after 1970, before the year 10000."""
    return isinstance(t, (int, float)) and math.isfinite(t) and 0 < t <= MAX_UNIX


def implausible(obj: dict[str, Any], record: Any, raw: bytes | None = None) -> str | None:
    """Why a schema-valid record cannot be true (a size nothing has, an integer no count
    reaches), or None. The viewer sizes lists and sums by these, so they are checked first.

    ``raw``, the record's line: without an escape or a run of 19 digits in it, no lone
    surrogate and no integer past 2^63 can be in ``obj``, and the walk over it is skipped
    (most of the load time of a trace of small records)."""
    odd = _odd_value(obj) if raw is None or _MAYBE_ODD.search(raw) else None
    if odd:
        return odd
    if (raw is None or raw.count(b"[") + raw.count(b"{") > MAX_NESTING) and nested_deeper(obj, MAX_NESTING):
        return f"lists or objects nested more than {MAX_NESTING} deep"
    if isinstance(record, Acceptance):
        if not 0 <= record.draft_tokens <= MAX_DRAFT_TOKENS:
            return f"draft_tokens {record.draft_tokens} (at most {MAX_DRAFT_TOKENS})"
        if any(not 0 <= n <= MAX_DRAFT_TOKENS + 1 for n in record.accept_lengths):
            return f"an accept length outside 0..{MAX_DRAFT_TOKENS + 1}"
        if len(record.accepted_per_position) > MAX_DRAFT_TOKENS or any(n < 0 for n in record.accepted_per_position):
            return "accepted_per_position longer than draft_tokens allows, or negative"
    elif isinstance(record, Call):
        if record.tokens is not None and record.tokens < 0:
            return f"tokens {record.tokens}"
        for m in (*record.inputs, *record.outputs):
            why = _tensor_implausible(m)
            if why:
                return f"{m.arg}: {why}"
    elif isinstance(record, Fingerprint):
        if record.chunk_width < 0:
            return f"chunk_width {record.chunk_width}"
        for st in record.chunks:
            if any(v is not None and v < 0 for v in (st.nan, st.inf, st.numel)):
                return "a negative count in a chunk's statistics"
    elif isinstance(record, Capture):
        if record.hidden_size < 0 or record.num_layers < 0:
            return "a negative hidden_size or num_layers"
    elif isinstance(record, Coverage) and record.count < 0:
        return f"count {record.count}"
    return None


def _tensor_implausible(m: Any) -> str | None:
    if len(m.shape) > MAX_DIMS:
        return f"{len(m.shape)} dimensions"
    numel = 1
    for d in m.shape:
        if d < 0:
            return f"dimension {d}"
        numel *= d
        if numel > MAX_NUMEL:
            return "more elements than any tensor has"
    st = m.stats
    if st is not None and any(v is not None and not 0 <= v <= MAX_NUMEL for v in (st.nan, st.inf, st.numel)):
        return "a count outside 0..2^62 in its statistics"
    return None


def nested_deeper(obj: Any, limit: int) -> bool:
    """Whether lists and dicts in ``obj`` nest more than ``limit`` deep (iterative: a value
    nested past the stack is measured, not recursed into)."""
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


def _odd_value(obj: Any) -> str | None:
    """The first integer beyond +-2^63, or string with a lone surrogate (``"\\ud800"``: no
    UTF-8 output can carry it), anywhere in a parsed record (iterative: no recursion limit)."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
            stack.extend(x.keys())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str):
            if _SURROGATE.search(x):
                return "a string with a lone surrogate"
        elif isinstance(x, int) and not isinstance(x, bool) and not -MAX_INT <= x <= MAX_INT:
            return f"an integer of {len(str(abs(x)))} digits"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")
# What a line needs to hold either: a \u escape (valid UTF-8 carries no surrogate), 19 digits.
_MAYBE_ODD = re.compile(rb"\\[uU]|[0-9]{19}")

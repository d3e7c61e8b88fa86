"""Why records were lost, in words: the view names each drop by the reason its writer
recorded (``Counters.dropped_by_reason``), never by a guess.

    >>> drop_lines({"sink error": 175}, 175)
    ['sink error 175: the file could not be written (disk full, I/O error)']
"""

from __future__ import annotations

# The writer's reasons (recorder.count_dropped's callers) and what each means to a user.
# Short enough to sit on one line of the header at 80 columns.
DROP_WORDS: dict[str, str] = {
    "sink error": "the file could not be written (disk full, I/O error)",
    "file deleted": "the file was deleted or replaced while written",
    "record cap": "more than SPECTRACE_RECORD_CAP waited to be written",
    "file size cap": "per-step records past SPECTRACE_MAX_FILE_MB",
    "memory cap": "a memory-only trace passed its cap: oldest lost",
    "record build": "could not be serialised (an internal error)",
    "record worker stuck": "the record worker was stuck for seconds",
    "step hand-off": "never reached the recorder (an internal error)",
}
UNSAID = "reason not recorded (an older writer)"


def drop_lines(by_reason: dict[str, int], total: int) -> list[str]:
    """One line per recorded reason, largest first; what no reason covers, said as such."""
    lines = [
        f"{reason} {n}: {DROP_WORDS.get(reason, 'as the writer recorded it')}"
        for reason, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
        if n > 0
    ]
    rest = total - sum(n for n in by_reason.values() if n > 0)
    if rest > 0:
        lines.append(f"{rest}: {UNSAID}" if lines else UNSAID)
    return lines


def merge_reasons(parts: list[dict[str, int]]) -> dict[str, int]:
    """Several files' reasons summed."""
    out: dict[str, int] = {}
    for part in parts:
        for reason, n in part.items():
            if isinstance(n, int) and n > 0:
                out[reason] = out.get(reason, 0) + n
    return out

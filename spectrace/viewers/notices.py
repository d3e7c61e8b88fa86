"""Load problems of a followed trace, said without flooding stderr.

A file that gains a bad line every quarter second would print a new warning per poll: its
message carries the count, so it is new each time. Here each problem (a file and a kind)
is said when first seen, then again only when its count grew and :data:`REPEAT_S` passed
since it was last said. The live screen shows the growing count in place instead.

    >>> notes = ProblemNotes()
    >>> notes.due(trace_set.problems)  # the lines to print now
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

REPEAT_S = 60.0  # a growing count is said again at most this often


class _Problem(Protocol):
    path: str
    kind: str
    count: int

    @property
    def message(self) -> str: ...


class ProblemNotes:
    """Which problem was said when, and at which count."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, repeat_s: float = REPEAT_S) -> None:
        self.clock = clock
        self.repeat_s = repeat_s
        self._said: dict[tuple[str, str], tuple[float, int]] = {}

    def due(self, problems: Iterable[_Problem]) -> list[str]:
        """The messages to say now: new problems, and grown ones not said for a minute."""
        now = self.clock()
        out = []
        for p in problems:
            key = (p.path, p.kind)
            last = self._said.get(key)
            if last is not None:
                at, count = last
                if p.count <= count or now - at < self.repeat_s:
                    continue
            self._said[key] = (now, p.count)
            out.append(p.message)
        return out

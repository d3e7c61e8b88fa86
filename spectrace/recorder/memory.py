"""What a recorder keeps in memory for the returned ``Trace``, and its bounds.

Calls are kept in a ring of the record cap (``SPECTRACE_RECORD_CAP``) as their JSON line
(~0.5 KB) rather than as pydantic objects (~7 KB): a full ring of 100k calls stays near
50 MB. Non-call records (findings, capture, weights, ...) are few; they get their own,
larger bound (:data:`IMPORTANT_CAP`) so a flood of calls can never push a finding out.
With a sink the bounds only trim memory (the sink has the record); without one a record
past them is gone, so it is counted (``records_dropped``, reason ``memory cap``).
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from ..records import RECORD_ADAPTER, Call, Finding

# Non-call records in memory (the calls have the record cap).
IMPORTANT_CAP = 50_000


class Memory:
    """The in-memory records of a :class:`~.core.Recorder` and their reading."""

    calls: collections.deque[str]
    important: list[Any]
    _parsed: tuple[int, list[Call]]
    _calls_added: int
    _lock: threading.RLock

    def _keep_important(self, record: Any, elsewhere: bool) -> bool:
        """Keep a non-call record (or its JSON line) in memory if there is room. False when
        it is gone: memory only (``elsewhere`` False) and full, counted as dropped."""
        if len(self.important) < IMPORTANT_CAP:
            self.important.append(record)
        elif not elsewhere:
            self.count_dropped(1, "memory cap")
            return False
        return True

    if TYPE_CHECKING:

        def count_dropped(self, n: int, reason: str) -> None: ...  # (core.Recorder)

        def _drain(self) -> None: ...  # (batching.Batching)

    def call_records(self) -> list[Call]:
        """The kept calls, parsed once per change."""
        with self._lock:
            if self._parsed[0] != self._calls_added:
                self._parsed = (self._calls_added, [Call.model_validate_json(text) for text in self.calls])
            return list(self._parsed[1])

    def records(self) -> list[Any]:
        """Everything kept in memory: non-call records and the (bounded) calls."""
        self._drain()
        with self._lock:
            kept = [RECORD_ADAPTER.validate_json(r) if isinstance(r, str) else r for r in self.important]
            return [*kept, *self.call_records()]

    def findings(self) -> list[Finding]:
        self._drain()
        return [r for r in self.important if isinstance(r, Finding)]

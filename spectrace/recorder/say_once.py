"""Say once, then count: the ledger of records said once and how often each happened since.

The :class:`~.core.Recorder` emits a record the first time its key is seen
(:meth:`~.core.Recorder.once`); a repeat only counts here, and the in-memory copy of the
record follows along (a coverage record's ``count``, a finding's
``evidence["occurrences"]``). At close the counts of keys seen more than once go into the
``counters`` record. Its own lock, never held while calling out: a repeat on a hot path
never waits on a flush.
"""

from __future__ import annotations

import threading
from typing import Any

from ..records import Coverage, Finding


class OnceLedger:
    """Key -> [the record emitted, occurrences]."""

    def __init__(self) -> None:
        self._once: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def repeated(self, key: str, times: int = 1) -> bool:
        """Count ``times`` more occurrences of ``key`` if it was said; False if it was not."""
        with self._lock:
            entry = self._once.get(key)
            if entry is None:
                return False
            entry[1] += times
            _show_repeats(entry[0], entry[1])
            return True

    def claim(self, key: str, record: Any) -> bool:
        """Take ``record`` as what ``key`` says (True: the caller emits it), unless another
        thread said it meanwhile (False: counted as a repeat)."""
        with self._lock:
            entry = self._once.get(key)
            if entry is None:
                record.once_key = key
                self._once[key] = [record, 1]
                return True
            entry[1] += 1
            _show_repeats(entry[0], entry[1])
            return False

    def said(self, key: str) -> bool:
        return key in self._once

    def repeats(self) -> dict[str, int]:
        """The keys seen more than once and their occurrences."""
        with self._lock:
            return {key: entry[1] for key, entry in self._once.items() if entry[1] > 1}


def _show_repeats(record: Any, occurrences: int) -> None:
    """The in-memory copy of a record said once shows how often it happened."""
    if isinstance(record, Coverage):
        record.__dict__["count"] = occurrences
    elif isinstance(record, Finding):
        record.evidence["occurrences"] = occurrences

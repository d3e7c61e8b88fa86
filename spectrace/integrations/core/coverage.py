"""What spectrace could not patch, said loudly and once.

A feature with no patch point in the installed engine (a method renamed, a module gone,
a feature the user turned off) is a ``not_covered`` coverage record: the recorder prints
it once and the count reaches the file. Said once per feature, whichever point of it
failed first: an engine release lacks many points that another release has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class CoverageNotes:
    def __init__(self, recorder: Callable[[], Any]) -> None:
        self._recorder = recorder
        self.said: set[str] = set()  # features said so far (tests may forget one to hear it again)
        self._lock = threading.Lock()

    def say_once(self, feature: str, detail: str) -> None:
        with self._lock:
            if feature in self.said:
                return
            self.said.add(feature)
        try:
            self._recorder().coverage("not_covered", detail)
        except Exception:  # saying it must not break the engine's start-up either
            pass

    def is_said(self, feature: str) -> bool:
        return feature in self.said

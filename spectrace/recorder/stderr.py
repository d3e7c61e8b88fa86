"""What the recorder says on stderr: each kind of warning once, and each error finding's
announcement once (it stands out in a server log). ``SPECTRACE_QUIET`` silences both.
"""

from __future__ import annotations

import re
import sys
import threading

from ..records import Finding
from ..settings import Settings, warn
from ..sinks.base import safe_text


def kind_of(message: str) -> str:
    """What a warning is about, without the parts that vary (counts, sizes, offsets)."""
    return re.sub(r"\d+", "#", message.split(":")[0].split(" (")[0])[:60]


class StderrVoice:
    """Warnings said once per key, and error findings announced once per code."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._printed_codes: set[str] = set()

    def warn_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        if not self.settings.quiet:
            warn(safe_text(message))  # a name that is not UTF-8 shows as \xNN, as in the trace

    def announce(self, record: Finding) -> None:
        """The first error finding of each code, as a block on stderr (repeats are counted in the trace)."""
        if record.code in self._printed_codes or self.settings.quiet:
            return
        self._printed_codes.add(record.code)
        try:
            # (imported here: a finding's words are wanted only once an error is found)
            from ..present import announcement

            sys.stderr.write(announcement(record))
            sys.stderr.flush()
        except Exception:
            pass

"""The recorder: where records go after capture, bounded, counted, never raising.

One module per job: :mod:`.core` (the :class:`Recorder`: intake, sinks, counters, close),
:mod:`.memory` (what is kept in memory and its bounds), :mod:`.batching` (the queue and
the flush thread), :mod:`.say_once` (say once, then count), :mod:`.stderr` (warnings and
the announcement of error findings), :mod:`.trace_file` (the JSONL file and its header),
:mod:`.header` (the command line and versions the header holds).
"""

from .core import Recorder
from .header import safe_argv
from .memory import IMPORTANT_CAP
from .trace_file import record_json

__all__ = ["IMPORTANT_CAP", "Recorder", "record_json", "safe_argv"]

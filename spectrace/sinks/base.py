"""The sink protocol: what the recorder hands records to (the JSONL file, an OTLP collector, ...).

Shaped like OpenTelemetry's ``SpanExporter``: a sink *exports* what it is handed and
does no policy of its own. The recorder is the processor: it decides when records go
out, keeps the header first, bounds and counts, and catches every exception a sink
raises (a sink error, counted and warned about once). A sink declares one thing,
``needs_objects``, and the recorder delivers accordingly:

- **line sinks** (``needs_objects = False``, e.g. :class:`~spectrace.sinks.jsonl.JsonlSink`)
  get JSON lines (``str``, no newline), in batches from the recorder's pending queue. A
  batch is handed over before ``emit`` returns for every record but the per-step ones
  (header, weights, capture, findings, coverage: on disk before the engine's next
  action), and at the flush interval for the per-step ones (calls, acceptance). The
  queue is bounded by the record cap; what it drops, and a batch a line sink refuses,
  is counted in ``records_dropped``. ``write`` must write whole lines.
- **object sinks** (``needs_objects = True``, e.g. :class:`~spectrace.sinks.otel.OtelSink`)
  get the record objects (pydantic) as they are emitted, on the emitting thread, and a
  :class:`Step` per traced step with its :class:`~spectrace.records.Call` objects (built
  only while such a sink is attached: ``Recorder.needs_call_objects``). They batch
  themselves (the OTLP SDK's ``BatchSpanProcessor`` does): holding objects in the
  recorder's queue would cost ~7 KB a call where a line costs ~0.5 KB, and would move
  the span building from the record worker to whichever thread flushes.

Every sink gets the :class:`~spectrace.records.Header` first, the run's ``stats`` record
last, then ``shutdown`` once. ``flush`` and ``shutdown`` are bounded by ``timeout_s``
(each sink's default is its own bound; the recorder's close calls ``shutdown()`` with it)
and return whether they finished in time.

    >>> class ListSink:
    ...     needs_objects = True
    ...     def __init__(self): self.records = []
    ...     def write(self, records): self.records.extend(records)
    ...     def flush(self, timeout_s=1.0): return True
    ...     def shutdown(self, timeout_s=1.0): return True
    >>> isinstance(ListSink(), Sink)
    True
    >>> recorder = Recorder(settings, sinks=[ListSink()])
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

DEFAULT_TIMEOUT_S = 3.0

# A lone surrogate: what Python holds for a byte that is not UTF-8 in a name it decoded
# with surrogateescape (argv, the environment, a path: U+DC80..U+DCFF), or a stray one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def safe_text(text: str) -> str:
    """``text`` as every record and message carries it: valid UTF-8.

    The one convention, as ``spectrace view`` shows such a path: a byte that was not UTF-8
    (held as U+DCxx) is written ``\\xNN``, any other lone surrogate ``\\uXXXX``; all else
    is kept. A JSON encoder refuses a lone surrogate, and one refused header used to cost
    the whole trace file.

        >>> safe_text("scr\\udcffipt.py")
        'scr\\\\xffipt.py'
    """
    if text.isascii():
        return text
    return _SURROGATE.sub(_escape_surrogate, text)


def _escape_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def safe_value(value: Any) -> Any:
    """:func:`safe_text` through dicts (keys too), lists and tuples; other values as they are."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_value(k): safe_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(safe_value(v) for v in value)
    return value


@runtime_checkable
class Sink(Protocol):
    """Where the recorder's records go. Any method may raise: the recorder counts it."""

    #: True: ``write`` gets record objects and :class:`Step` batches; False: JSON lines.
    needs_objects: bool

    def write(self, records: Sequence[Any]) -> None:
        """Export ``records`` (in order; the first ever is the header). Must not block long."""
        ...

    def flush(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Push out everything written so far, in at most ``timeout_s``; True when done."""
        ...

    def shutdown(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Flush and release, in at most ``timeout_s``; called once. True when done."""
        ...


@dataclass(frozen=True)
class Step:
    """One traced step's call records, as an object sink receives them (one step span)."""

    type: ClassVar[str] = "step"
    step: int
    calls: Sequence[Any]
    start_ns: int
    end_ns: int


def sink_name(sink: Any) -> str:
    """How warnings name a sink: its ``name`` attribute, else its class."""
    return str(getattr(sink, "name", None) or type(sink).__name__)

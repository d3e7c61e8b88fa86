"""The OpenTelemetry sink: the same records as spans, sent to an OTLP collector.

One span per traced step (``spectrace.step``) with a child span per module call; other
records (findings, acceptance, capture, weights, coverage) become spans of their own.
Each span carries flat attributes for querying plus ``spectrace.record``, the record's
JSON, so the OTLP and JSONL sinks hold the same content. Export runs on the SDK's
``BatchSpanProcessor`` thread; shutdown is bounded by :data:`SHUTDOWN_TIMEOUT_S` whatever
the collector does (down, hanging, slow).

The SDK and the OTLP exporter log every failed batch and every retry through
``logging``; in a server log that is a warning per batch. While spectrace's own spans
are exported (or queued), those log records are caught instead: the failure is counted
and the recorder warns once, with the cause the SDK gave. The host's own OpenTelemetry
logging is untouched.

    >>> sink = OtelSink.from_endpoint("http://127.0.0.1:4318")
    >>> sink.export_step(0, records, start_ns, end_ns)
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, Callable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..records import Call

EXPORT_TIMEOUT_S = 2.0
# Flush plus shutdown at close never take longer than this; unsent spans are then dropped
# (and counted) rather than holding the host's exit.
SHUTDOWN_TIMEOUT_S = 3.0
MAX_ATTR_STRING = 8192
# Loggers through which the SDK reports export trouble (retries, failures, full queue).
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
_local = threading.local()


class _CatchOwnLogs(logging.Filter):
    """Drops SDK log records raised while spectrace's spans are handled on this thread.

    Only records emitted inside :func:`_own` (our export, our ``span.end()``) are caught;
    they are handed to that sink's error callback instead of the host's log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        sink = getattr(_local, "sink", None)
        if sink is None:
            return True
        try:
            sink._sdk_said(record.getMessage())
        except Exception:
            pass
        return False


_FILTER = _CatchOwnLogs()
_filter_lock = threading.Lock()


def _install_filter() -> None:
    with _filter_lock:
        for name in _SDK_LOGGERS:
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


class _own:
    """Marks this thread as handling ``sink``'s spans (see :class:`_CatchOwnLogs`)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def __enter__(self) -> None:
        self.previous = getattr(_local, "sink", None)
        _local.sink = self.sink

    def __exit__(self, *exc: Any) -> None:
        _local.sink = self.previous


def flat_attributes(record: Any) -> dict[str, Any]:
    """Primitive attributes for one record (OpenTelemetry takes no nested values)."""
    data = record.model_dump(mode="json")
    attrs: dict[str, Any] = {"spectrace.type": data.get("type", "")}
    for key in ("step", "module", "module_type", "seq", "code", "severity", "message", "fix", "kind", "detail"):
        value = data.get(key)
        if isinstance(value, (str, int, float, bool)):
            attrs[f"spectrace.{key}"] = value
    if isinstance(record, Call):
        for side, metas in (("input", record.inputs), ("output", record.outputs)):
            attrs[f"spectrace.{side}.shapes"] = [json.dumps(m.shape) for m in metas]
            attrs[f"spectrace.{side}.dtypes"] = [m.dtype for m in metas]
    text = record.model_dump_json()
    attrs["spectrace.record"] = text if len(text) <= MAX_ATTR_STRING else text[:MAX_ATTR_STRING]
    attrs["spectrace.record_truncated"] = len(text) > MAX_ATTR_STRING
    return attrs


class _CountingExporter(SpanExporter):
    """Wraps the real exporter so failures are counted instead of lost in a log."""

    def __init__(self, inner: SpanExporter, on_error: Callable[[str], None]) -> None:
        self.inner = inner
        self.on_error = on_error
        self.spans_failed = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        reason: list[str] = []
        try:
            with _own(_Collect(reason)):
                result = self.inner.export(spans)
        except Exception as exc:  # an exporter must not take the batch thread down
            self.spans_failed += len(spans)
            self.on_error(f"OTLP export raised {type(exc).__name__}: {str(exc)[:200]}")
            return SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self.spans_failed += len(spans)
            why = f" ({reason[0][:200]})" if reason else ""
            self.on_error(f"OTLP export failed for {len(spans)} spans{why}")
        return result

    def shutdown(self) -> None:
        try:
            with _own(_Collect([])):
                self.inner.shutdown()
        except Exception as exc:
            self.on_error(f"OTLP exporter shutdown raised {type(exc).__name__}: {exc}")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self.inner.force_flush(timeout_millis))
        except Exception:
            return False


class _Collect:
    """Keeps the first SDK log line seen during one export (the cause, e.g. connection refused)."""

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def _sdk_said(self, message: str) -> None:
        if not self.into:
            # The SDK's text nests the cause deep in a urllib3 repr; the errno part says it.
            errno_part = re.findall(r"\[Errno -?\d+\] [^'\")]+", message)
            self.into.append(errno_part[-1] if errno_part else " ".join(message.split()))


class OtelSink:
    """Turns records into spans on a private ``TracerProvider`` (never the global one)."""

    def __init__(self, exporter: SpanExporter, resource: dict[str, Any], on_error: Callable[[str], None]) -> None:
        _install_filter()
        self.on_error = on_error
        # No atexit hook of the SDK's own: its shutdown joins the export thread for up to
        # 30 s; ours (called from the recorder's close) is bounded.
        self.provider = TracerProvider(resource=Resource.create(resource), shutdown_on_exit=False)
        self.exporter = _CountingExporter(exporter, on_error)
        self.processor = BatchSpanProcessor(self.exporter, export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("spectrace")
        self.spans_dropped = 0
        self._closed = False

    def _sdk_said(self, message: str) -> None:
        # Caught while queueing our spans: the SDK's queue is full and drops them.
        if "queue full" in message.lower() or "dropping" in message.lower():
            self.spans_dropped += 1
        self.on_error(f"OpenTelemetry SDK: {message[:200]}")

    @classmethod
    def from_endpoint(cls, endpoint: str, resource: dict[str, Any], on_error: Callable[[str], None]) -> "OtelSink":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
        return cls(OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S), resource, on_error)

    def export_step(self, step: int, records: Sequence[Any], start_ns: int, end_ns: int) -> None:
        """One step span with a child span per call record."""
        from opentelemetry import trace as otel_trace

        if self._closed:
            return
        with _own(self):
            parent = self.tracer.start_span("spectrace.step", start_time=start_ns, attributes={"spectrace.step": step})
            context = otel_trace.set_span_in_context(parent)
            for record in records:
                name = f"module {record.module}" if isinstance(record, Call) else f"spectrace.{record.type}"
                span = self.tracer.start_span(name, context=context, start_time=start_ns, attributes=flat_attributes(record))
                span.end(end_time=end_ns)
            parent.end(end_time=end_ns)

    def export_record(self, record: Any, time_ns: int) -> None:
        if self._closed:
            return
        with _own(self):
            span = self.tracer.start_span(f"spectrace.{record.type}", start_time=time_ns, attributes=flat_attributes(record))
            span.end(end_time=time_ns)

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
        """Send what is queued and stop, in at most ``timeout_s``; True when it finished.

        The SDK's ``force_flush`` ignores its timeout and exports batch after batch, each
        up to the export timeout, so the whole flush runs on a daemon thread that is
        abandoned at the deadline (a hanging collector then costs ``timeout_s``, once).
        """
        if self._closed:
            return True
        self._closed = True
        done = threading.Event()

        def run() -> None:
            try:
                self.processor.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
                self.provider.shutdown()
            except Exception as exc:
                self.on_error(f"OTLP shutdown raised {type(exc).__name__}: {exc}")
            finally:
                done.set()

        threading.Thread(target=run, name="spectrace-otel-shutdown", daemon=True).start()
        if done.wait(timeout_s):
            return True
        # Abort the exporter's retries so its thread ends soon; what is still queued is lost.
        try:
            with _own(_Collect([])):
                self.exporter.inner.shutdown()
        except Exception:
            pass
        self.on_error(f"OTLP shutdown did not finish in {timeout_s:g} s (collector down or hanging); unsent spans dropped")
        return False

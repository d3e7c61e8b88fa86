"""The OpenTelemetry sink: the same records as spans, sent to an OTLP collector.

One span per traced step (``spectrace.step``) with a child span per module call; other
records (findings, acceptance, capture, weights, coverage) become spans of their own.
Each span carries flat attributes for querying plus ``spectrace.record``, the record's
JSON, so the OTLP and JSONL sinks hold the same content. Export runs on the SDK's
``BatchSpanProcessor`` thread; shutdown is bounded by a timeout.

    >>> sink = OtelSink.from_endpoint("http://127.0.0.1:4318")
    >>> sink.export_step(0, records, start_ns, end_ns)
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..records import Call

EXPORT_TIMEOUT_S = 2.0
MAX_ATTR_STRING = 8192


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

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter must not take the batch thread down
            self.on_error(f"OTLP export raised {type(exc).__name__}: {exc}")
            return SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self.on_error(f"OTLP export failed for {len(spans)} spans")
        return result

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        except Exception as exc:
            self.on_error(f"OTLP exporter shutdown raised {type(exc).__name__}: {exc}")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self.inner.force_flush(timeout_millis))
        except Exception:
            return False


class OtelSink:
    """Turns records into spans on a private ``TracerProvider`` (never the global one)."""

    def __init__(self, exporter: SpanExporter, resource: dict[str, Any], on_error: Callable[[str], None]) -> None:
        self.provider = TracerProvider(resource=Resource.create(resource))
        self.processor = BatchSpanProcessor(
            _CountingExporter(exporter, on_error), export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000)
        )
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("spectrace")

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

        parent = self.tracer.start_span("spectrace.step", start_time=start_ns, attributes={"spectrace.step": step})
        context = otel_trace.set_span_in_context(parent)
        for record in records:
            name = f"module {record.module}" if isinstance(record, Call) else f"spectrace.{record.type}"
            span = self.tracer.start_span(name, context=context, start_time=start_ns, attributes=flat_attributes(record))
            span.end(end_time=end_ns)
        parent.end(end_time=end_ns)

    def export_record(self, record: Any, time_ns: int) -> None:
        span = self.tracer.start_span(f"spectrace.{record.type}", start_time=time_ns, attributes=flat_attributes(record))
        span.end(end_time=time_ns)

    def shutdown(self) -> None:
        # Bounded: the processor's flush waits at most its export timeout.
        self.processor.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
        self.provider.shutdown()

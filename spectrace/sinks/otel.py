"""The OpenTelemetry sink: the same records as spans, sent to an OTLP collector.

One span per traced step (``spectrace.step``) with a child span per module call; other
records (findings, acceptance, capture, weights, coverage) become spans of their own.
Each span carries flat attributes for querying plus ``spectrace.record``, the record's
JSON, so the OTLP and JSONL sinks hold the same content. Export runs on the SDK's
``BatchSpanProcessor`` thread; shutdown is bounded by :data:`SHUTDOWN_TIMEOUT_S` whatever
the collector does (down, hanging, slow).

The exporter reads its own settings from the environment, as the OpenTelemetry spec has
them: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as-is) before ``OTEL_EXPORTER_OTLP_ENDPOINT``
(``/v1/traces`` appended), ``..._HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``,
``..._CERTIFICATE`` and their ``TRACES_`` variants; the resource takes ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES``. spectrace reads only what picks the exporter
(``OTEL_EXPORTER_OTLP(_TRACES)_PROTOCOL``) and ``OTEL_SDK_DISABLED``; see :func:`sink_from_env`.

The SDK and the OTLP exporter log every failed batch and every retry through
``logging``; in a server log that is a warning per batch. While spectrace's own spans
are exported (or queued), those log records are caught instead: the failure is counted
and the recorder warns once, with the cause the SDK gave. The host's own OpenTelemetry
logging is untouched.

An object sink of the :class:`~spectrace.sinks.base.Sink` protocol: ``write`` takes
record objects (the header first) and :class:`~spectrace.sinks.base.Step` batches.

    >>> sink = sink_from_env(Settings.from_env(), print)  # None unless an endpoint is set
    >>> sink.write([header, Step(0, calls, start_ns, end_ns), finding])
    >>> sink.shutdown()  # bounded by SHUTDOWN_TIMEOUT_S
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..records import Call
from ..settings import Settings, warn
from .base import Step

# Per-request export timeout, used only when OTEL_EXPORTER_OTLP(_TRACES)_TIMEOUT is unset.
EXPORT_TIMEOUT_S = 2.0
# Flush plus shutdown at close never take longer than this; unsent spans are then dropped
# (and counted) rather than holding the host's exit.
SHUTDOWN_TIMEOUT_S = 3.0
MAX_ATTR_STRING = 8192
# Loggers through which the SDK reports export trouble (retries, failures, full queue).
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",  # bad env values, at construction
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
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
        self.spans_sent = 0  # confirmed by the collector (SUCCESS)

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
        else:
            self.spans_sent += len(spans)
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

    needs_objects = True  # the Sink protocol: write() gets record objects and Step batches
    name = "OpenTelemetry"  # how the recorder's sink-error warnings name it

    def __init__(
        self,
        exporter: SpanExporter,
        resource: Resource | dict[str, Any],
        on_error: Callable[[str], None],
        remake: Callable[[], SpanExporter] | None = None,
    ) -> None:
        _install_filter()
        self.on_error = on_error
        self.remake = remake  # builds a fresh exporter in a forked child (its HTTP pool is the parent's)
        if not isinstance(resource, Resource):
            resource = Resource.create(resource)
        self._start(exporter, resource)
        self._closed = False

    def _start(self, exporter: SpanExporter, resource: Resource) -> None:
        # No atexit hook of the SDK's own: its shutdown joins the export thread for up to
        # 30 s; ours (called from the recorder's close) is bounded.
        self.resource = resource
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.exporter = _CountingExporter(exporter, self.on_error)
        self.processor = BatchSpanProcessor(self.exporter, export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("spectrace")
        self.spans_dropped = 0
        self.spans_queued = 0  # spans ended here, i.e. handed to the SDK's batch queue

    def after_fork(self) -> None:
        """In a forked child: a provider of its own (``process.pid`` is the child's) and,
        when it can be rebuilt, a fresh exporter. The SDK empties the parent's queue in
        the child, so no span of the parent is sent twice."""
        exporter = self.remake() if self.remake is not None else self.exporter.inner
        self._start(exporter, self.resource.merge(Resource({"process.pid": os.getpid()})))

    def undelivered(self) -> tuple[int, int]:
        """(spans the collector never confirmed, spans it did), once shut down: what was
        queued and not exported with success, whatever the reason (failed, dropped from
        a full queue, still queued at the shutdown deadline)."""
        sent = self.exporter.spans_sent
        return max(0, self.spans_queued - sent), sent

    def _sdk_said(self, message: str) -> None:
        # Caught while queueing our spans: the SDK's queue is full and drops them.
        if "queue full" in message.lower() or "dropping" in message.lower():
            self.spans_dropped += 1
        self.on_error(f"OpenTelemetry SDK: {message[:200]}")

    def write(self, records: Sequence[Any]) -> None:
        """Queue spans for ``records`` (a :class:`Step` becomes a step span with its calls);
        the SDK's batch thread sends them."""
        for record in records:
            # By its type tag, not its class: a reloaded module (a notebook's autoreload,
            # an in-process test run) makes a second Step class.
            if getattr(record, "type", None) == Step.type:
                self.export_step(record.step, record.calls, record.start_ns, record.end_ns)
            else:
                t_unix = getattr(record, "t_unix", None)
                self.export_record(record, int(t_unix * 1e9) if t_unix else time.time_ns())

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
                self.spans_queued += 1
            parent.end(end_time=end_ns)
            self.spans_queued += 1

    def export_record(self, record: Any, time_ns: int) -> None:
        if self._closed:
            return
        with _own(self):
            span = self.tracer.start_span(f"spectrace.{record.type}", start_time=time_ns, attributes=flat_attributes(record))
            span.end(end_time=time_ns)
            self.spans_queued += 1

    def flush(self, timeout_s: float = EXPORT_TIMEOUT_S) -> bool:
        """Send what is queued, waiting at most ``timeout_s``; True when it was sent."""
        if self._closed:
            return True
        return self._bounded(lambda: self.processor.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000)), timeout_s, "flush")

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
        """Send what is queued and stop, in at most ``timeout_s``; True when it finished.

        The SDK's ``force_flush`` ignores its timeout and exports batch after batch, each
        up to the export timeout, so the whole flush runs on a daemon thread that is
        abandoned at the deadline (a hanging collector then costs ``timeout_s``, once).
        """
        if self._closed:
            return True
        self._closed = True

        def run() -> None:
            self.processor.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
            self.provider.shutdown()

        if self._bounded(run, timeout_s, "shutdown"):
            return True
        # Abort the exporter's retries so its thread ends soon; what is still queued is lost.
        try:
            with _own(_Collect([])):
                self.exporter.inner.shutdown()
        except Exception:
            pass
        self.on_error(f"OTLP shutdown did not finish in {timeout_s:g} s (collector down or hanging); unsent spans dropped")
        return False

    def _bounded(self, action: Callable[[], Any], timeout_s: float, what: str) -> bool:
        """Run ``action`` on a daemon thread; False when it is still running at ``timeout_s``."""
        done = threading.Event()

        def run() -> None:
            try:
                action()
            except Exception as exc:
                self.on_error(f"OTLP {what} raised {type(exc).__name__}: {exc}")
            finally:
                done.set()

        threading.Thread(target=run, name=f"spectrace-otel-{what}", daemon=True).start()
        return done.wait(timeout_s)


# ------------------------------------------------------------------ from the environment
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# protocol -> (exporter module, its package, the spectrace extra that installs it)
_EXPORTERS = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
        "otlp",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
        "otlp-grpc",
    ),
}


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def resource_from_env(rank: int | None = None) -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, detectors)
    plus spectrace's own: ``process.pid``, ``spectrace.rank`` and, when the environment
    names no service, ``service.name`` "spectrace"."""
    own: dict[str, Any] = {"process.pid": os.getpid()}
    if rank is not None:
        own["spectrace.rank"] = rank
    resource = Resource.create(own)
    named = str(resource.attributes.get(SERVICE_NAME, ""))
    # The SDK falls back to "unknown_service:<executable>" when nothing named the service.
    if named.startswith("unknown_service") and SERVICE_NAME not in OTELResourceDetector().detect().attributes:
        resource = resource.merge(Resource({SERVICE_NAME: "spectrace"}))
    return resource


def sink_from_env(settings: Settings, error: Callable[[str], None], rank: int | None = None) -> OtelSink | None:
    """An :class:`OtelSink` whose exporter reads the ``OTEL_*`` environment itself, or None.

    On only when an endpoint variable is set (``settings.otlp_endpoint`` says whether one
    was); the URL, headers, timeout, compression and certificates are left to the SDK.
    Every way of ending with no sink says so in one line: ``OTEL_SDK_DISABLED=true`` as a
    warning, the rest (unknown protocol, exporter package missing, exporter refusing its
    settings) through ``error``, the recorder's counted sink error.
    """
    if not settings.otlp_endpoint:
        return None
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        if not settings.quiet:
            warn("OTEL_SDK_DISABLED=true: OpenTelemetry is off, no spans are sent (the trace itself is kept)")
        return None
    variable = next((v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if _env(v)), "")
    protocol = _env(variable).lower() if variable else "http/protobuf"
    if protocol not in _EXPORTERS:
        error(f"{variable}={_env(variable)!r} is not supported (use http/protobuf or grpc); spans are not sent")
        return None
    module_name, package, extra = _EXPORTERS[protocol]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        error(f"OTLP protocol {protocol} needs {package}, which is not installed (pip install 'spectrace[{extra}]'); spans are not sent")
        return None
    # No endpoint or headers here: the exporter reads those (and the rest) from the
    # environment. The timeout too, when the user set one; else spectrace's short one.
    kwargs: dict[str, Any] = {}
    if not (_env(TRACES_ENDPOINT) or _env(ENDPOINT)):
        # A Settings built in code names the endpoint itself; it reads as the generic
        # variable would (the exporter alone would fall back to localhost:4318).
        base = settings.otlp_endpoint
        kwargs["endpoint"] = base if protocol == "grpc" else base.rstrip("/") + "/v1/traces"
    if not (_env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or _env("OTEL_EXPORTER_OTLP_TIMEOUT")):
        kwargs["timeout"] = EXPORT_TIMEOUT_S
    _install_filter()
    said: list[str] = []
    try:
        with _own(_Collect(said)):  # e.g. "Unsupported compression type" becomes our one line
            exporter = module.OTLPSpanExporter(**kwargs)
        resource = resource_from_env(rank)
    except Exception as exc:
        error(f"cannot start the OTLP exporter: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    if said:
        error(f"OTLP exporter settings: {said[0][:200]}")

    def remake() -> SpanExporter:
        with _own(_Collect([])):
            return module.OTLPSpanExporter(**kwargs)  # type: ignore[no-any-return]

    return OtelSink(exporter, resource, error, remake=remake)

"""A real OTLP/HTTP receiver on 127.0.0.1 that decodes the protobuf payload.

Besides the spans it keeps what each request looked like (path, headers, encoding) and
the resources, so tests can check what the exporter made of the ``OTEL_*`` environment.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[Any] = []
        self.requests = 0
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []  # names lower-cased, one dict per request
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    receiver.resources.append(resource_spans.resource)
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend(scope_spans.spans)
                receiver.paths.append(self.path)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                receiver.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    """A span's (or a resource's) attributes as a plain dict."""
    found: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            found[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            found[kv.key] = getattr(value, kind) if kind else None
    return found

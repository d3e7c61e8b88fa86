"""The OTLP exporter takes its settings from the ``OTEL_*`` environment, as the spec has them.

Each test sets the environment, drives a tiny real Llama through ``spectrace.trace`` and
looks at what the real OTLP/HTTP receiver (tests/otlp_receiver.py) got: the request path,
the headers, the encoding, the resource. Nothing of the SDK or of torch is mocked.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from typing import Any

import pytest
import torch

import spectrace
from spectrace.settings import Settings
from spectrace.sinks import otel as otel_mod
from spectrace.sinks.otel import resource_from_env, sink_from_env
from tests.helpers.models import tiny_llama
from tests.helpers.otlp_receiver import OtlpReceiver, attributes

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(layers=2, hidden=32)


IDS = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))


def _traced(model: Any, settings: Settings | None = None) -> Any:
    with torch.no_grad(), spectrace.trace(model, settings=settings) as t:
        model(IDS)
        model(IDS)
    return t


def _traced_with_env(model: Any, monkeypatch: Any, env: dict[str, str]) -> OtlpReceiver:
    """Trace two forwards with ``env`` set and the generic endpoint on a fresh receiver."""
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        _traced(model)
        _wait(receiver)
    return receiver


def _wait(receiver: OtlpReceiver, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and receiver.requests == 0:
        time.sleep(0.05)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _lines(err: str, what: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("spectrace:") and what in line]


# ------------------------------------------------------------------------- endpoint
def test_traces_endpoint_wins_and_is_used_verbatim(model, monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint + "/custom/path")
        # The generic one points nowhere: were it used, the export would fail.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
        t = _traced(model)
        _wait(receiver)
    assert receiver.spans and set(receiver.paths) == {"/custom/path"}
    assert t.recorder.counters.sink_errors == 0


def test_generic_endpoint_gets_v1_traces(model, monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint + "/base/")
        t = _traced(model)
        _wait(receiver)
    assert receiver.spans and set(receiver.paths) == {"/base/v1/traces"}
    assert t.recorder.counters.sink_errors == 0


def test_settings_endpoint_given_in_code_reads_as_the_generic_variable(model):
    """A Settings built in code, no OTEL_* variable set: its endpoint gets /v1/traces."""
    with OtlpReceiver() as receiver:
        t = _traced(model, Settings(otlp_endpoint=receiver.endpoint + "/base"))
        _wait(receiver)
    assert receiver.spans and set(receiver.paths) == {"/base/v1/traces"}
    assert t.recorder.counters.sink_errors == 0


# ----------------------------------------------------------- headers, compression, timeout
@pytest.mark.parametrize(
    "env,expected",
    [
        (
            {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,x-team=spec%20trace"},
            {"api-key": "s3cret", "x-team": "spec trace"},
        ),
        (
            {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=generic", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=traces"},
            {"api-key": "traces"},
        ),
    ],
    ids=["generic", "traces-wins"],
)
def test_headers_arrive_at_the_receiver(model, monkeypatch, env, expected):
    receiver = _traced_with_env(model, monkeypatch, env)
    assert receiver.headers
    for headers in receiver.headers:
        assert {k: headers.get(k) for k in expected} == expected


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"])
def test_gzip_compression_arrives_compressed(model, monkeypatch, variable):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv(variable, "gzip")
        t = _traced(model)
        _wait(receiver)
    assert receiver.headers and all(h.get("content-encoding") == "gzip" for h in receiver.headers)
    # The receiver gunzipped the body and decoded every call as a span.
    modules = {attributes(s).get("spectrace.module") for s in receiver.spans if s.name.startswith("module ")}
    assert modules == {c.module for c in t.calls()}


def test_bad_compression_value_is_one_spectrace_line_not_an_sdk_log(monkeypatch, capfd):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli")
    errors: list[str] = []
    sink = sink_from_env(Settings.from_env(), errors.append)
    assert sink is not None  # the SDK falls back to no compression
    sink.shutdown()
    assert len(errors) == 1 and "brotli" in errors[0], errors
    assert "Unsupported compression" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "env,timeout",
    [
        ({}, otel_mod.EXPORT_TIMEOUT_S),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "7"}, 7.0),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "7", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5"}, 5.0),
    ],
    ids=["spectrace-default", "generic", "traces-wins"],
)
def test_timeout_is_the_users_when_set(monkeypatch, env, timeout):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    errors: list[str] = []
    sink = sink_from_env(Settings.from_env(), errors.append)
    try:
        # The installed SDK keeps the per-request timeout on its HTTP client (private).
        assert sink.exporter.inner._client._timeout == timeout
    finally:
        sink.shutdown()
    assert errors == []


def test_certificate_is_passed_to_the_exporter(model, monkeypatch, capfd):
    """A CA bundle that does not exist: the SDK's own TLS error, counted, one line, no crash."""
    # requests lets these two override the session's CA bundle, so the exporter's
    # certificate setting only counts where they are unset (some machines set them).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with OtlpReceiver() as receiver:  # listening, so the failure is the TLS set-up, not the connect
        https = receiver.endpoint.replace("http://", "https://")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", https + "/v1/traces")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/spectrace-ca.pem")
        t = _traced(model)
    assert receiver.requests == 0
    assert t.recorder.counters.sink_errors >= 1
    err = capfd.readouterr().err
    lines = _lines(err, "OTLP export failed")
    assert len(lines) == 1 and "TLS CA certificate bundle" in lines[0], err
    assert "Traceback" not in err


# ------------------------------------------------------------------------- resource
@pytest.mark.parametrize(
    "env,service",
    [
        ({}, "spectrace"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=staging"}, "from-attrs"),
        (
            {
                "OTEL_SERVICE_NAME": "eagle-server",
                "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,deployment.environment=staging",
            },
            "eagle-server",
        ),
    ],
    ids=["spectrace-default", "resource-attributes", "service-name-wins"],
)
def test_service_name_and_resource_attributes_reach_the_resource(model, monkeypatch, env, service):
    receiver = _traced_with_env(model, monkeypatch, env)
    assert receiver.resources
    for resource in receiver.resources:
        attrs = attributes(resource)
        assert attrs["service.name"] == service
        assert attrs["process.pid"] == os.getpid()
        if "OTEL_RESOURCE_ATTRIBUTES" in env:
            assert attrs["deployment.environment"] == "staging"


def test_rank_is_on_the_resource(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=spec")
    attrs = resource_from_env(rank=3).attributes
    assert attrs["spectrace.rank"] == 3 and attrs["team"] == "spec" and attrs["service.name"] == "spectrace"


# ------------------------------------------------------------------ off, and protocol
@pytest.mark.parametrize("value", ["true", "TRUE"])
def test_sdk_disabled_sends_nothing_and_says_so(model, monkeypatch, capfd, value):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_SDK_DISABLED", value)
        t = _traced(model)
        time.sleep(0.3)
    assert not t.recorder.sinks and receiver.requests == 0
    assert t.calls()  # the trace itself is kept
    err = capfd.readouterr().err
    assert len(_lines(err, "OTEL_SDK_DISABLED")) == 1, err
    assert t.recorder.counters.sink_errors == 0


def _grpc_exporter_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc.trace_exporter") is not None
    except ImportError:
        return False


@pytest.mark.skipif(_grpc_exporter_installed(), reason="the grpc exporter is installed here: no missing-package path")
def test_grpc_without_the_grpc_exporter_is_one_line_and_no_sink(model, monkeypatch, capfd):
    with pytest.raises(ImportError):
        importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        t = _traced(model)
    assert not t.recorder.sinks and receiver.requests == 0
    err = capfd.readouterr().err
    lines = _lines(err, "grpc")
    assert len(lines) == 1 and "pip install 'spectrace[otlp-grpc]'" in lines[0], err
    assert "Traceback" not in err


def test_traces_protocol_wins_over_the_generic_one(model, monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        t = _traced(model)
        _wait(receiver)
    assert receiver.spans and t.recorder.counters.sink_errors == 0


def test_unknown_protocol_is_one_line_and_no_sink(model, monkeypatch, capfd):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
        t = _traced(model)
    assert not t.recorder.sinks and receiver.requests == 0
    err = capfd.readouterr().err
    lines = _lines(err, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    assert len(lines) == 1 and "'http/json'" in lines[0], err


def test_no_endpoint_no_spans(model, monkeypatch):
    """Other OTLP settings alone do not turn spans on: only an endpoint does."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "eagle-server")
    t = _traced(model)
    assert not t.recorder.sinks and t.recorder.counters.sink_errors == 0

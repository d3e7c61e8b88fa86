"""The ``SPECTRACE_METRICS_PORT`` endpoint against idle clients, and findings made while the
metrics are paused.

Real sockets on 127.0.0.1 against the endpoint a traced process serves (``serve``, as
``SPECTRACE_METRICS_PORT`` starts it), real scrapes over HTTP, a real recorder with the
metrics sink and a real control file. RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from spectrace.recorder import Recorder  # noqa: E402
from spectrace.rules.catalogue import finding  # noqa: E402
from spectrace.settings import Settings  # noqa: E402
from spectrace.sinks import metrics_server  # noqa: E402
from spectrace.sinks.prometheus import CONTROL_EVERY_S, MetricsSink, serve  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
        return r.read().decode()


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_idle_connections_add_no_threads_and_a_scrape_still_answers() -> None:
    port = _port()
    before = threading.active_count()
    assert serve(port)
    _scrape(port)
    started = threading.active_count()
    assert started - before <= 1 + metrics_server.WORKERS
    held: list[socket.socket] = []
    try:
        for _ in range(60):  # connections that open and never send a byte
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        assert threading.active_count() == started, threading.active_count() - started  # was one thread each
        for _ in range(90):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for sock in held[:4]:  # and a few that send half a request, holding workers until their timeout
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        time.sleep(0.3)
        t0 = time.monotonic()
        text = _scrape(port)  # with 150 held, a normal scrape is answered
        assert "spectrace_info" in text or "python_info" in text or text.startswith("#")
        assert time.monotonic() - t0 < metrics_server.SOCKET_TIMEOUT_S + 2
        assert threading.active_count() == started
    finally:
        for sock in held:
            sock.close()


def test_an_idle_connection_is_closed_after_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry

    monkeypatch.setattr(metrics_server, "IDLE_S", 0.3)
    server = metrics_server.MetricsServer(0, "127.0.0.1", CollectorRegistry())
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.settimeout(3)
        t0 = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server, not left open forever
        assert time.monotonic() - t0 < 2.5 and server.refused == 1
        sock.close()
    finally:
        server.close()


def test_findings_made_while_paused_reach_the_metrics_once_on(tmp_path: Path) -> None:
    port = _port()
    control = tmp_path / "control"
    control.write_text("on metrics-off\n")
    rec = Recorder(Settings(quiet=True, control=str(control), metrics_port=port), directory=str(tmp_path / "t"), rank=91)
    sink = MetricsSink(lambda: rec.counters, control=str(control))
    rec.add_sink(sink)
    assert serve(port)
    rec.emit(finding("fc_bypass", "64-wide hidden states", evidence={"seen_width": 64}))
    rec.flush()
    labels = {"code": "fc_bypass", "rank": "91"}
    assert _value(_scrape(port), "spectrace_findings_total", **labels) == 0  # paused: not counted yet
    control.write_text("on\n")
    time.sleep(CONTROL_EVERY_S + 0.1)
    rec.emit(finding("aux_capture_disabled", "off", evidence={"enabled": False}))
    rec.flush()
    text = _scrape(port)
    assert _value(text, "spectrace_findings_total", **labels) == 1, text  # the paused one counts now
    assert _value(text, "spectrace_root_cause", code="aux_capture_disabled", rank="91") == 1
    rec.close()
    trace = "".join(p.read_text() for p in (tmp_path / "t").glob("*.jsonl"))
    assert trace.count('"type":"finding"') == 2


def test_a_client_that_trickles_its_request_is_cut_at_the_request_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry

    monkeypatch.setattr(metrics_server, "REQUEST_S", 1.0)
    server = metrics_server.MetricsServer(0, "127.0.0.1", CollectorRegistry())
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        t0 = time.monotonic()
        cut = False
        for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 40:  # a byte each 0.2 s: inside every socket timeout
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            time.sleep(0.2)
            if time.monotonic() - t0 > 4:
                break
        sock.settimeout(3)
        try:
            cut = cut or sock.recv(1) == b""
        except TimeoutError:  # still open: not cut
            pass
        except OSError:  # reset by the server
            cut = True
        assert cut and time.monotonic() - t0 < 4.5 and server.refused >= 1
        sock.close()
    finally:
        server.close()

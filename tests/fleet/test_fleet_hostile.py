"""``spectrace fleet`` against a Prometheus that answers badly: one line and exit 2, one
deadline, one size cap, escaped and bounded output, credentials never printed.

A real HTTP server on 127.0.0.1 (``http.server``) answers the query API as the case says;
the command runs in-process, or as a real ``python -m spectrace`` child where its time or
memory is measured. RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spectrace.cli.fleet import main as fleet_main
from tests.helpers import paths

RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")
Answer = Callable[[BaseHTTPRequestHandler, str], None]


def _json(handler: BaseHTTPRequestHandler, body: Any, raw: bytes | None = None, length: int | None = None) -> None:
    data = raw if raw is not None else json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(length if length is not None else len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _vector(series: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in series]}}


@contextlib.contextmanager
def serve(answer: Answer) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A local server answering every query with ``answer(handler, promql)``; yields its URL
    and the requests it got (path and Authorization header)."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
            promql = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query)).get("query", "")
            with contextlib.suppress(OSError):
                answer(self, promql)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fleet_main(argv)
    return code, out.getvalue(), err.getvalue()


def _one_line(code: int, err: str) -> None:
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and "internal error" not in err and "Traceback" not in err, err


BROKEN: dict[str, Answer] = {
    "array": lambda h, q: _json(h, [1, 2, 3]),
    "data_list": lambda h, q: _json(h, {"status": "success", "data": []}),
    "metric_string": lambda h, q: _json(
        h, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": "up", "value": [0, "1"]}]}}
    ),
    "cut_body": lambda h, q: _json(h, None, raw=b'{"status": "success", "data": {"resu', length=36),
    "bomb": lambda h, q: _json(h, None, raw=b"[" * 100_000),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_an_answer_of_another_shape_is_one_line_and_exit_2(case: str) -> None:
    with serve(BROKEN[case]) as (url, _):
        code, out, err = _run(["--prometheus", url, "--fail-on", "error"])  # exit 1 would be the alert
    _one_line(code, err)
    assert out == ""


def _trickle(handler: BaseHTTPRequestHandler, promql: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(200):  # one byte each 0.2 s: every read is well inside a socket timeout
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.2)


def test_a_server_that_trickles_bytes_is_cut_at_the_one_deadline() -> None:
    with serve(_trickle) as (url, _):
        start = time.monotonic()
        code, _out, err = _run(["--prometheus", url, "--timeout", "2"])
        took = time.monotonic() - start
    _one_line(code, err)
    assert "within 2 s" in err and took < 4, (took, err)


def _huge(handler: BaseHTTPRequestHandler, promql: str) -> None:
    handler.send_response(200)
    handler.end_headers()  # no length: read to the end
    handler.wfile.write(b'{"status": "success", "data": {"resultType": "vector", "result": [')
    item = b'{"metric": {"instance": "' + b"x" * 1000 + b'"}, "value": [0, "1"]},'
    block = item * 1000
    for _ in range(1000):  # 1 GB if read whole
        handler.wfile.write(block)


# The child's own peak: VmHWM (ru_maxrss would carry the parent's from before the exec).
PEAK = "import re, sys; sys.path.insert(0, sys.argv[1]); from spectrace.cli.fleet import main; code = main(sys.argv[2:]); print(code, int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024)"


def test_a_huge_answer_is_cut_at_the_size_cap() -> None:
    with serve(_huge) as (url, _):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}  # no bootstrap: the command's own memory
        run = subprocess.run(
            [sys.executable, "-c", PEAK, str(paths.ROOT), "--prometheus", url], capture_output=True, text=True, timeout=60, env=env
        )
    code, peak = run.stdout.split()
    _one_line(int(code), run.stderr)
    assert "32 MiB" in run.stderr and int(peak) < 150, (peak, run.stderr)  # read whole, the answer is 1 GB


CONTROL = "a\x1b[2J\x07\x9b31m\u202eb"


def _many(n: int, hostile: bool) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, promql: str) -> None:
        name = (lambda i: f"{CONTROL}{'w' * 300}-{i}") if hostile else (lambda i: f"10.0.{i // 250}.{i % 250}:30000")
        if promql.startswith("up"):
            _json(handler, _vector([({"instance": name(i), "job": CONTROL}, 1) for i in range(n)]))
        elif "spectrace_info" in promql:
            _json(handler, _vector([({"instance": name(i), "job": CONTROL, "rank": CONTROL}, 1) for i in range(n)]))
        elif "spectrace_findings_total" in promql or "spectrace_root_cause" in promql:
            labels = {"code": "fc_bypass", "severity": "error"}
            _json(handler, _vector([({"instance": name(i), "job": CONTROL, "rank": CONTROL, **labels}, 1) for i in range(n)]))
        else:
            _json(handler, _vector([]))

    return answer


@pytest.mark.parametrize("n, hostile", [(3, True), (10_000, False)])
def test_the_screen_escapes_labels_and_bounds_its_lines(n: int, hostile: bool) -> None:
    with serve(_many(n, hostile)) as (url, _):
        code, out, err = _run(["--prometheus", url])
        jcode, jout, _ = _run(["--prometheus", url, "--json"])
    assert code == 0 and jcode == 0, err
    assert not RAW_CONTROL.search(out), [c for c in out if RAW_CONTROL.match(c)][:5]
    lines = out.splitlines()
    assert len(lines) < 120 and max(len(line) for line in lines) < 6_000, (len(lines), max(len(line) for line in lines))
    if n > 100:
        assert f"and {n - 50} more instances" in out and f"and {n - 50} more (--json has them all)" in out
    assert len(json.loads(jout)["instances"]) == n  # --json keeps them all (JSON escapes control characters)


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_printed() -> None:
    with serve(lambda h, q: _json(h, _vector([({"instance": "a:1", "job": "j"}, 1)]))) as (url, seen):
        host = url.removeprefix("http://")
        given = f"http://admin:s3cr3t-token@{host}/?api_key=KEY123&job_hint=x"
        code, out, err = _run(["--prometheus", given])
        jcode, jout, jerr = _run(["--prometheus", given, "--json"])
    assert code == 0 and jcode == 0, err
    for text in (out, err, jout, jerr):
        assert "s3cr3t" not in text and "KEY123" not in text and "admin" not in text, text
    assert "api_key=<redacted>" in out and json.loads(jout)["prometheus"].startswith("http://<redacted>@")
    assert seen and all(r["auth"] == "Basic " + base64.b64encode(b"admin:s3cr3t-token").decode() for r in seen)
    assert all("api_key=KEY123" in r["path"] and "admin" not in r["path"] for r in seen)  # the server still gets its key
    # An error names the server the same way.
    with serve(lambda h, q: _json(h, [1])) as (url, _):
        code, _out, err = _run(["--prometheus", f"http://admin:s3cr3t-token@{url.removeprefix('http://')}/?token=T0K"])
    _one_line(code, err)
    assert "s3cr3t" not in err and "T0K" not in err


def test_the_one_deadline_default_is_said() -> None:
    from spectrace.fleet import MAX_ANSWER_BYTES, TIMEOUT_S

    doc = (paths.ROOT / "docs" / "fleet.md").read_text()
    assert f"{TIMEOUT_S:g} s" in doc and f"{MAX_ANSWER_BYTES >> 20} MiB" in doc
    assert os.path.exists(paths.ROOT / "RELIABILITY.md")

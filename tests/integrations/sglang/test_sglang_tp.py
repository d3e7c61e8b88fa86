"""Tensor parallelism on the CPU: two processes, SGLang 0.5.23's parallel state on gloo at
tp_size 2, its real Llama target and EAGLE-3 draft classes, SPECTRACE=1 and nothing else.

Each rank loads the full checkpoint tensors through SGLang's own loaders (they narrow them
to the rank's shard), runs one target and one draft prefill, and writes its own trace.
Rank 1 is given a checkpoint without ``lm_head.weight``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import paths

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
pytestmark = pytest.mark.sglang

ROOT = paths.ROOT

SCRIPT = textwrap.dedent(
    f"""
    import sys, torch
    sys.path.insert(0, {str(ROOT)!r})
    from tests.helpers import sglang_harness as sh
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    sh.setup_tp(rank, 2, port)
    VOCAB, H, HD = 128, 64, 16
    cfg, hf = sh.tiny_hf_llama(VOCAB, H, 4)
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=[0, 1, 2])
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    draft = LlamaForCausalLMEagle3(sh._draft_config(dict(architectures=["LlamaForCausalLMEagle3"], vocab_size=VOCAB,
        hidden_size=H, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, tie_word_embeddings=False, draft_vocab_size=96, target_hidden_size=H,
        eagle_config={{"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}}))).eval()
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g) * 0.02
    full = {{"fc.weight": r(H, 3 * H), "norm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": r(4 * HD, 2 * H), "midlayer.self_attn.k_proj.weight": r(2 * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(2 * HD, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, H),
        "midlayer.mlp.gate_proj.weight": r(128, H), "midlayer.mlp.up_proj.weight": r(128, H),
        "midlayer.mlp.down_proj.weight": r(H, 128), "lm_head.weight": r(96, H),
        "d2t": torch.zeros(96, dtype=torch.int64), "t2d": torch.ones(VOCAB, dtype=torch.bool)}}
    if rank == 1:
        del full["lm_head.weight"]
    draft.load_weights(list(full.items()))
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = sh.run_target(target, ids)
        sh.run_draft(draft, ids, out.hidden_states)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("tp2")
    script = work / "tp_rank.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(work / "traces"), SPECTRACE_QUIET="1")
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return work / "traces"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_each_rank_writes_its_own_trace_and_names_its_rank(traces):
    files = sorted(traces.glob("trace-*.jsonl"))
    assert [f.name.rsplit("-", 1)[-1] for f in files] == ["rank0.jsonl", "rank1.jsonl"]
    for rank, f in enumerate(files):
        (header,) = [r for r in _records(f) if r["type"] == "header"]
        assert header["rank"] == rank


def test_sharded_loads_are_no_finding_and_a_rank_without_lm_head_is_named(traces):
    rank0, rank1 = (_records(f) for f in sorted(traces.glob("trace-*.jsonl")))
    errors0 = [r["code"] for r in rank0 if r["type"] == "finding" and r["severity"] == "error"]
    assert errors0 == []  # narrowed loader calls wrote shards: nothing missing, nothing dropped
    (missing,) = [r for r in rank1 if r["type"] == "finding" and r["code"] == "weights_missing"]
    assert missing["evidence"]["missing"] == ["lm_head.weight"]


def test_the_merged_view_says_each_finding_once_with_its_ranks(traces):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    view = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(traces), "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    data = json.loads(view.stdout)
    findings = {f["code"]: f for f in data["findings"]}
    assert sorted(findings["aux_layers_mismatch"]["ranks"]) == [0, 1]  # seen on every rank: one entry
    assert findings["weights_missing"]["ranks"] == [1]  # the rank that disagrees


def test_partial_sums_are_labelled_and_raise_no_provenance_finding(traces):
    """0.5.23 defers a layer's tensor-parallel all-reduce to the next boundary: a rank holds a
    partial sum there, not the residual stream, and the record says so."""
    for f in traces.glob("trace-*.jsonl"):
        records = _records(f)
        layers = [r for r in records if r["type"] == "call" and (r["role"] or "").startswith("target.layer[")]
        args = {t["arg"] for r in layers for t in r["outputs"]}
        assert "output.unreduced_partial" in args
        codes = {r["code"] for r in records if r["type"] == "finding"}
        assert not codes & {"chunk_unmatched", "chunk_provenance"}
        (logits,) = [r for r in records if r["type"] == "call" and r["role"] == "target.lm_head"]
        assert [(t["arg"], t["shape"]) for t in logits["outputs"]] == [("output.logits_shard", [1, 64])]  # half of 128


def test_diff_compares_rank_by_rank(traces, tmp_path):
    """The same TP=2 run against itself agrees; against a copy whose rank 1 lacks a finding,
    the difference names rank 1."""
    import shutil

    from spectrace.viewers.diff import diff_traces
    from spectrace.viewers.loader import load_traces

    assert diff_traces(load_traces(str(traces)), load_traces(str(traces))).differences == []
    other = tmp_path / "other"
    shutil.copytree(traces, other)
    (rank1,) = other.glob("*-rank1.jsonl")
    lines = [line for line in rank1.read_text().splitlines() if '"code":"weights_missing"' not in line]
    rank1.write_text("\n".join(lines) + "\n")
    result = diff_traces(load_traces(str(traces)), load_traces(str(other)))
    assert result.differences and all(d.where.startswith("rank 1: ") for d in result.differences)

"""SPECTRACE=1 on SGLang 0.5.23's own target and EAGLE-3 draft classes (CPU): per-module
call records for every stage of the data path, with no spectrace call in the script.

The script builds the models the way a user does without a server (tests/sglang_harness.py)
and runs one target prefill and one draft prefill; the child process traces itself through
the ``.pth`` bootstrap and writes its trace at exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import paths

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
pytestmark = pytest.mark.sglang

ROOT = paths.ROOT
VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB = 128, 64, 4, 96

SCRIPT = textwrap.dedent(
    f"""
    import sys, torch
    sys.path.insert(0, {str(ROOT)!r})
    from tests.helpers import sglang_harness as sh
    sh.setup()
    cfg, hf = sh.tiny_hf_llama({VOCAB}, {HIDDEN}, {LAYERS})
    if sys.argv[1] in ("deepseek", "kimi"):  # Kimi-K2.5's language model: MLA + MoE, 0.5.23's owed-output layers
        target = sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), None, layer_ids=[1, 2, 3])
        ids = torch.randint(0, 100, (10,), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out = sh.run_target(target, ids)
            if sys.argv[1] == "kimi":  # and Kimi's own EAGLE-3 draft with MLA attention
                from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM
                dcfg = sh.tiny_deepseek_v3_config(num_hidden_layers=1)
                sh._sglang_deepseek_fields(dcfg)
                dcfg.architectures = ["Eagle3DeepseekV2ForCausalLM"]
                dcfg.target_hidden_size = {HIDDEN}
                dcfg.eagle_config = {{"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True}}
                draft = Eagle3DeepseekV2ForCausalLM(dcfg).eval()
                sh.randomize_weights_(draft, 3)
                draft.post_load_weights()  # MLA's w_kc / w_vc, as load_weights would end
                sh.run_draft(draft, ids, out.hidden_states)
        sys.exit(0)
    bypass = sys.argv[1] == "bypass"
    layer_ids = sh.NO_CAPTURE if bypass else [-1, 1, 2] if sys.argv[1] == "embed" else [0, 1, 2]
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=layer_ids)
    draft_cfg = dict(architectures=["LlamaForCausalLMEagle3"], vocab_size={VOCAB}, hidden_size={HIDDEN},
        intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, tie_word_embeddings=False, draft_vocab_size={DRAFT_VOCAB},
        target_hidden_size={HIDDEN},
        eagle_config={{"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}})
    draft = sh.build_sglang_eagle3_draft(draft_cfg, seed=3)
    ids = torch.randint(0, {VOCAB}, (12,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(2):
            out = sh.run_target(target, ids)
            sh.run_draft(draft, ids, out.hidden_states)
    """
)


def _run(tmp_path: Path, mode: str, **env: str) -> list[dict]:
    script = tmp_path / "serve_like.py"
    script.write_text(SCRIPT)
    traces = tmp_path / f"traces-{mode}"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    child_env.update(SPECTRACE="1", SPECTRACE_DIR=str(traces), SPECTRACE_QUIET="1", **env)
    done = subprocess.run([sys.executable, str(script), mode], env=child_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (trace,) = traces.glob("trace-*.jsonl")
    return [json.loads(line) for line in trace.read_text().splitlines()]


def _calls(records: list[dict]) -> dict[str, list[dict]]:
    by_role: dict[str, list[dict]] = {}
    for r in records:
        if r["type"] == "call":
            by_role.setdefault(r["role"], []).append(r)
    return by_role


def _out(call: dict, arg: str) -> dict:
    (found,) = [t for t in call["outputs"] if t["arg"] == arg]
    return found


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> list[dict]:
    return _run(tmp_path_factory.mktemp("live"), "healthy")


def test_every_stage_has_records_with_roles_modes_tokens_and_statistics(healthy):
    calls = _calls(healthy)
    stages = {"target.layer[0]", "target.layer[1]", "target.layer[2]", "target.layer[3]", "target.norm", "target.aux_concat"}
    stages |= {"target.lm_head", "draft.fc", "draft.layer", "draft.norm", "draft.lm_head"}
    assert stages <= set(calls)
    for role in stages:
        for call in calls[role]:
            assert call["forward_mode"] == "EXTEND" and call["tokens"] == 12 and not call["graph_replay"]
            assert any(t["stats"] and t["stats"]["numel"] for t in call["outputs"]), (role, call["outputs"])
    fc = calls["draft.fc"][0]
    assert fc["inputs"][0]["shape"] == [12, 3 * HIDDEN] and fc["outputs"][0]["shape"] == [12, HIDDEN]
    assert _out(calls["target.lm_head"][0], "output.logits")["shape"] == [1, VOCAB]  # EXTEND keeps the last token
    assert _out(calls["draft.lm_head"][0], "output.logits")["shape"][-1] >= DRAFT_VOCAB
    aux = calls["target.aux_concat"][0]
    assert [t["arg"] for t in aux["outputs"]] == ["output.chunk[0]", "output.chunk[1]", "output.chunk[2]"]
    assert all(t["shape"] == [12, HIDDEN] for t in aux["outputs"])


def test_chunks_equal_the_boundaries_they_came_from(healthy):
    """ids [0, 1, 2] capture boundaries [1, 2, 3]: the residual streams after layers 0, 1, 2."""
    calls = _calls(healthy)
    for step_aux in calls["target.aux_concat"]:
        step = step_aux["step"]
        for i in range(3):
            (layer,) = [c for c in calls[f"target.layer[{i}]"] if c["step"] == step]
            boundary = _out(layer, "output.residual_stream")["stats"]
            chunk = _out(step_aux, f"output.chunk[{i}]")["stats"]
            assert chunk["std"] == pytest.approx(boundary["std"], rel=1e-6)
            assert chunk["mean"] == pytest.approx(boundary["mean"], rel=1e-5, abs=1e-9)
    codes = [r["code"] for r in healthy if r["type"] == "finding"]
    assert "chunk_unmatched" not in codes and "chunk_provenance" not in codes


def test_norm_output_is_not_its_input(healthy):
    """The fused in-place add + RMSNorm writes its input: the output's statistics are its own."""
    norm = _calls(healthy)["target.norm"][0]
    assert norm["outputs"][0]["stats"]["std"] == pytest.approx(1.0, abs=0.2)
    assert norm["inputs"][0]["stats"]["std"] < 0.2


@pytest.mark.slow
def test_fc_bypass_is_visible_in_the_records_and_the_view(tmp_path):
    records = _run(tmp_path, "bypass")
    calls = _calls(records)
    assert "draft.fc" not in calls  # SGLang skipped fc: the 64-wide state equals the embedding width
    assert calls["draft.layer"] and calls["draft.lm_head"]
    codes = {r["code"] for r in records if r["type"] == "finding"}
    assert "fc_bypass" in codes
    view = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(tmp_path / "traces-bypass"), "--no-pager"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")},
    )
    assert "fc_bypass" in view.stdout and "BYPASSED" in view.stdout, view.stdout[-2000:]


@pytest.mark.slow
def test_feature_skew_live_against_a_training_fingerprint(tmp_path, healthy):
    """A fingerprint whose chunks are 100x smaller than the served ones: feature_skew, live."""
    aux = _calls(healthy)["target.aux_concat"][0]
    chunks = []
    for t in aux["outputs"]:
        st = t["stats"]
        chunks.append({"mean": st["mean"] / 100, "std": st["std"] / 100, "absmax": st["absmax"] / 100, "numel": st["numel"]})
    fp = tmp_path / "fp.json"
    fp.write_text(
        json.dumps({"type": "fingerprint", "module": "draft.input", "chunk_width": HIDDEN, "chunks": chunks, "boundaries": [1, 2, 3]})
    )
    records = _run(tmp_path, "healthy", SPECTRACE_FINGERPRINT=str(fp))
    codes = [r["code"] for r in records if r["type"] == "finding"]
    assert "feature_skew" in codes


@pytest.mark.slow
def test_deepseek_target_layers_are_residual_streams_and_equal_the_chunks(tmp_path):
    """DeepSeek-V3 (0.5.23) layers return their contribution and keep the residual in the
    batch's stream: the record is their sum. ids [1, 2, 3] capture boundaries [2, 3, 4]."""
    calls = _calls(_run(tmp_path, "deepseek"))
    aux = calls["target.aux_concat"][0]
    for i, layer in enumerate((1, 2, 3)):
        boundary = _out(calls[f"target.layer[{layer}]"][0], "output.residual_stream")["stats"]
        chunk = _out(aux, f"output.chunk[{i}]")["stats"]
        assert chunk["std"] == pytest.approx(boundary["std"], rel=1e-6)


@pytest.mark.parametrize("token_stats", ["", "1"])
@pytest.mark.slow
def test_the_embedding_chunk_of_the_aux_concat_has_no_statistics_by_default(tmp_path, token_stats):
    """ids [-1, 1, 2] capture the embedding output as chunk 0: a function of one token id per
    row, so by default it is recorded with its shape and no statistics; the other chunks keep
    theirs. SPECTRACE_TOKEN_STATS=1 restores them."""
    records = _run(tmp_path, "embed", **({"SPECTRACE_TOKEN_STATS": token_stats} if token_stats else {}))
    (capture,) = [r for r in records if r["type"] == "capture"]
    assert capture["boundaries"] == [0, 2, 3]
    for aux in _calls(records)["target.aux_concat"]:
        chunks = [_out(aux, f"output.chunk[{i}]") for i in range(3)]
        assert all(c["shape"] == [12, HIDDEN] for c in chunks)
        assert all(c["stats"] and c["stats"]["numel"] == 12 * HIDDEN for c in chunks[1:])
        if token_stats:
            assert chunks[0]["stats"] and chunks[0]["stats"]["numel"] == 12 * HIDDEN
        else:
            assert not chunks[0]["stats"]


@pytest.mark.slow
def test_kimis_mla_draft_has_records_for_every_stage(tmp_path):
    """Kimi-K2.5's Eagle3DeepseekV2ForCausalLM (MLA attention, its fc a ColumnParallelLinear
    that returns a tuple) behind a DeepSeek-V3 target: the fc's fused input and output, the
    midlayer's residual stream, the norm and the draft logits, from SPECTRACE=1 alone."""
    records = _run(tmp_path, "kimi")
    calls = _calls(records)
    # (on a miss, what the trace holds: every call's module and role, and the other records)
    seen = sorted({(r["module"], r["role"], r.get("forward_mode")) for r in records if r["type"] == "call"}, key=str)
    others = [r for r in records if r["type"] not in ("call", "acceptance")]
    assert {"draft.fc", "draft.layer", "draft.norm", "draft.lm_head", "target.aux_concat"} <= set(calls), (seen, others)
    fc = calls["draft.fc"][0]
    assert fc["module"] == "draft.model.fc" and fc["inputs"][0]["shape"] == [10, 3 * HIDDEN]
    assert _out(fc, "output[0]")["shape"] == [10, HIDDEN] and _out(fc, "output[0]")["stats"]  # the tuple's tensor
    layer = calls["draft.layer"][0]
    assert layer["module"] == "draft.model.midlayer" and _out(layer, "output.residual_stream")["stats"]["numel"] == 10 * HIDDEN
    assert _out(calls["draft.norm"][0], "output[0]")["stats"]
    assert _out(calls["draft.lm_head"][0], "output.logits")["stats"]
    assert [t["arg"] for t in calls["target.aux_concat"][0]["outputs"]] == [f"output.chunk[{i}]" for i in range(3)]

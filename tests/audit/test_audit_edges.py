"""``spectrace audit`` at its edges: ids only one trainer can mean, a config with no ids on
a shallow target, a reader that goes away, notes that concern the checkpoint at hand, and
engines named the way ``--engine`` takes them.

Every case is the real CLI in a subprocess on a checkpoint folder: the fixtures written by
SpecForge and speculators themselves (tests/fixtures/make_*_fixture.py), their weights
copied as they are and config.json rewritten where a case needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES
SPECULATORS = FIX / "speculators_tiny"
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"
IDS = "eagle_aux_hidden_state_layer_ids"


def cli(*args: object, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", CLI, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, timeout=120
    )


def draft(tmp_path: Path, edit: Callable[[dict[str, Any]], None], src: Path = SPECFORGE) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def target(tmp_path: Path, layers: int) -> Path:
    cfg = json.loads(TARGET.read_text())
    cfg["num_hidden_layers"] = layers
    path = tmp_path / "target.json"
    path.write_text(json.dumps(cfg))
    return path


def report(*args: object) -> dict[str, Any]:
    proc = cli(*args, "--json")
    assert proc.returncode in (0, 1) and proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


# ------------------------------------------------------------ ids only one trainer can mean


def test_minus_one_is_specforge_only_so_there_is_no_ambiguity(tmp_path: Path) -> None:
    path = draft(tmp_path, lambda c: c["eagle_config"].update({IDS: [-1, 1, 3]}))
    out = report(path, "--target-config", TARGET)
    # Under speculators' convention boundary -1 does not exist: one reading, SpecForge's.
    assert [(r["trainer"], r["boundaries"]) for r in out["checkpoint"]["trained_readings"]] == [("specforge", [0, 2, 4])]
    assert out["findings"] == [], out["findings"]
    table = cli(path, "--target-config", TARGET)
    assert table.returncode == 0, table.stderr
    assert "ambiguous" not in table.stdout and "[-1, 1, 3]" not in table.stdout
    assert "trained boundaries: specforge: [0, 2, 4]" in table.stdout


def test_minus_one_with_speculators_keys_is_still_specforge(tmp_path: Path) -> None:
    # A speculators key would put the speculators reading first, but it cannot hold here.
    path = draft(tmp_path, lambda c: (c["eagle_config"].update({IDS: [-1, 1, 3]}), c.update(norm_before_residual=False)))
    out = report(path, "--target-config", TARGET)
    assert [r["trainer"] for r in out["checkpoint"]["trained_readings"]] == ["specforge"]
    assert not [f for f in out["findings"] if f["code"] == "aux_layers_mismatch"]


def test_the_runtime_capture_check_reads_minus_one_the_same_way() -> None:
    from spectrace.checks.capture import check_capture
    from spectrace.records import Capture
    from spectrace.rules.conventions import engine_boundaries

    config = json.loads((SPECFORGE / "config.json").read_text())
    config["eagle_config"][IDS] = [-1, 1, 3]
    captured = engine_boundaries([-1, 1, 3], "sglang_llama", 8)  # what SGLang's Llama target captures
    capture = Capture(
        module="target", requested_ids=[-1, 1, 3], boundaries=captured.boundaries, num_layers=8, hidden_size=64, rule="sglang_llama"
    )
    assert captured.boundaries == [0, 2, 4]
    assert [f for f in check_capture(capture, config) if f.code == "aux_layers_mismatch"] == []


def test_ids_both_trainers_can_mean_stay_ambiguous(tmp_path: Path) -> None:
    """SpecForge's own layout (midlayer.*, eagle_config) settles its ids' reading; the same ids over
    layers.0.* tensors (a hand conversion's layout, which no trainer signs) stay ambiguous."""
    out = report(SPECFORGE, "--target-config", TARGET)
    assert [f for f in out["findings"] if f["code"] == "aux_layers_mismatch"] == []
    from safetensors.torch import load_file, save_file

    path = draft(tmp_path, lambda c: None)
    state = load_file(str(path / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in state.items()}, str(path / "model.safetensors"))
    out = report(path, "--target-config", TARGET)
    [warn] = [f for f in out["findings"] if f["code"] == "aux_layers_mismatch"]
    assert warn["severity"] == "warning" and "ambiguous" in warn["message"]


# ------------------------------------------------------------ no ids on a shallow target


def test_no_eagle_config_on_a_shallow_target_names_the_colliding_defaults(tmp_path: Path) -> None:
    path = draft(tmp_path, lambda c: c.pop("eagle_config"))
    out = report(path, "--target-config", target(tmp_path, 4))
    [short] = [f for f in out["findings"] if f["code"] == "short_capture"]
    assert "ids dropped" not in short["message"] and "[]" not in short["message"]
    assert "defaults [2, n//2, n-3] = [2, 2, 1]" in short["message"]
    assert "2 distinct boundaries [1, 2] of 3" in short["message"]
    # No id was given, so "use ids below the layer count" does not apply; this does.
    assert "below the target's layer count" not in short["fix"]
    assert f"set eagle_config.{IDS} to the 3 distinct layers below 4" in short["fix"]
    # One cause, one finding: the same defaults on both sides are no trained/served mismatch.
    assert not [f for f in out["findings"] if f["code"] == "aux_layers_mismatch"]


def test_ids_past_the_target_still_name_the_dropped_ones(tmp_path: Path) -> None:
    out = report(SPECFORGE, "--target-config", target(tmp_path, 5))
    [short] = [f for f in out["findings"] if f["code"] == "short_capture" and "dropped_ids" in f["evidence"]]
    assert short["evidence"]["dropped_ids"] == [5] and "ids [5] are past its last layer" in short["message"]
    assert "below the target's layer count" in short["fix"]


# ------------------------------------------------------------ a reader that goes away


def test_stdout_closed_before_the_report_is_one_line_not_an_internal_error() -> None:
    for args in (("--json",), ()):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte, as `| head` gone early
        try:
            proc = cli(SPECULATORS, "--target-config", TARGET, *args, stdout=write)
        finally:
            os.close(write)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and "stdout was closed" in lines[0], proc.stderr
        assert "internal error" not in proc.stderr and "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------ notes that concern the checkpoint


def _assumed(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("assumed:")]


def test_speculators_notes_only_for_a_speculators_checkpoint(tmp_path: Path) -> None:
    sglang_format = _assumed(cli(SPECFORGE, "--target-config", TARGET))
    # Its ids sit in eagle_config, so the note on the target's default capture is not printed either.
    assert not [n for n in sglang_format if "speculators" in n or "norm_before_fc" in n or "defaults" in n], sglang_format
    speculators = _assumed(cli(SPECULATORS, "--target-config", TARGET))
    assert [n for n in speculators if "no reader for the speculators format" in n]
    assert [n for n in speculators if "norm_before_fc" in n]
    # An SGLang-format config that sets a training flag gets the flag note and no other.
    flagged = _assumed(cli(draft(tmp_path, lambda c: c.update(norm_before_fc=True)), "--target-config", TARGET))
    assert [n for n in flagged if "norm_before_fc" in n]
    assert not [n for n in flagged if "speculators format" in n]
    assert not [n for n in report(SPECFORGE)["checkpoint"]["engine"]["assumptions"] if "speculators format" in n]


# ------------------------------------------------------------ engines named as --engine takes them


def test_engine_named_as_the_engine_argument_with_rule_releases() -> None:
    for engine, header, releases in (
        ("sglang", "engine=sglang==0.5.23", "SGLang >= 0.5.22"),
        ("sglang==0.5.17", "engine=sglang==0.5.17", "SGLang 0.5.14 <= version < 0.5.22"),
        ("sglang==0.5.13", "engine=sglang==0.5.13", "SGLang < 0.5.14"),
    ):
        proc = cli(SPECULATORS, "--target-config", TARGET, "--engine", engine)
        assert proc.returncode == 1, proc.stderr
        assert header in proc.stdout.splitlines()[0], proc.stdout
        assert f"(sglang_llama rule, {releases})" in proc.stdout, proc.stdout
        assert "--engine-version" not in proc.stdout and "older" not in proc.stdout.splitlines()[0]
    fixes = [f["fix"] for f in report(SPECULATORS, "--target-config", TARGET)["findings"]]
    assert any("the sglang_llama rule of SGLang >= 0.5.22" in fix for fix in fixes), fixes


def test_a_release_before_the_loaders_read_is_the_midlayer_only_loader(tmp_path: Path) -> None:
    layers0 = tmp_path / "layers0"
    shutil.copytree(SPECFORGE, layers0)
    from safetensors.torch import load_file, save_file

    state = load_file(str(layers0 / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0.", 1): v.contiguous() for k, v in state.items()}, str(layers0 / "model.safetensors"))
    named = report(layers0, "--engine", "sglang==0.5.13")
    alias = report(layers0, "--engine-version", "older")
    assert {"weights_dropped", "weights_missing"} <= {f["code"] for f in named["findings"]}
    assert [f["code"] for f in named["findings"]] == [f["code"] for f in alias["findings"]]
    assert named["checkpoint"]["engine"]["spec"] == "sglang==0.5.13"
    assert alias["checkpoint"]["engine"]["spec"] == "sglang<0.5.14"
    assert any("0.5.13's own loader was not read" in n for n in named["checkpoint"]["engine"]["assumptions"])

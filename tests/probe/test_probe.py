"""``spectrace probe``: which setting the served draft was trained with, measured.

The trained tiny pair (spectrace.eagle3) is served through SGLang 0.5.23's own
``LlamaForCausalLM`` target and ``LlamaForCausalLMEagle3`` draft on CPU, the replay
capture keeping the draft's inputs and the target's own top-1 at the same rows. Each bug
is one the config the engine read describes faithfully (so ``spectrace replay`` agrees),
and only the evidence tells: a RoPE base other than the one the draft was trained at, the
other rotary style, a ``d2t`` saved as ``arange`` while ``t2d`` holds the trained map. The
clean twin is served as trained (exit 0). The reference pipeline's own draft, traced with
``SPECTRACE_REPLAY`` through ``spectrace.trace``, shows the wiring and the view's finding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spectrace.checks.probe import probe_findings, withdraw
from spectrace.cli.probe import main as probe_main
from spectrace.cli.replay import main as replay_main
from spectrace.eagle3.pair import DATA_DIR, TRAINED_IDS, load_draft, load_target_model, make_language, sample_language
from spectrace.eagle3.target import Eagle3Target
from spectrace.hooks.replay_capture import keep_replay
from spectrace.rules.acceptance import chain_accept_length, wilson
from spectrace.rules.catalogue import finding
from tests.helpers import paths

ROOT = paths.ROOT
CASES = ("clean", "rope", "style", "vocab", "capture")


def _probe(trace: Path, draft: Path, capsys: pytest.CaptureFixture[str], extra: list[str] | None = None) -> tuple[int, dict]:
    code = probe_main([str(trace), "--draft", str(draft), "--json", *(extra or [])])
    return code, json.loads(capsys.readouterr().out)


def _variant(result: dict, name: str) -> dict:
    return next(v for v in result["variants"] if v["name"] == name)


@pytest.fixture(scope="module")
def sglang_served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    out = tmp_path_factory.mktemp("sglang")
    script = [sys.executable, str(ROOT / "tests" / "probe" / "sglang_serve.py"), str(ROOT), str(out)]
    plain = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    # The cases with the captures kept in code; and the same serving with no spectrace call,
    # SPECTRACE=1 SPECTRACE_REPLAY=1 tracing the process as a server is traced. Side by side.
    live = {"SPECTRACE": "1", "SPECTRACE_REPLAY": "1", "SPECTRACE_REPLAY_ROWS": "64", "SPECTRACE_QUIET": "1"}
    jobs = {"cases": ([*script, *CASES], {"SPECTRACE": "0"}), "live": ([*script, "live"], live)}
    runs = []
    for name, (argv, env) in jobs.items():
        log = open(out / f"{name}.log", "w")  # a file, not a pipe: neither child can fill a pipe and stall
        env = {**plain, **env, "OMP_NUM_THREADS": "1", "SPECTRACE_DIR": str(out / "live" / "trace")}
        runs.append((subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log, name))
    for run, log, name in runs:
        run.wait(timeout=240)
        log.close()
        assert run.returncode == 0, (out / f"{name}.log").read_text()[-3000:]
    return out


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_probe_names_the_setting_the_draft_was_trained_with(sglang_served: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = {}
    for case in ("clean", "rope", "style", "vocab"):
        code, result = _probe(sglang_served / case / "trace", sglang_served / case / "ckpt", capsys)
        results[case] = (code, result["winner"], result)
    # Target-written rows: the token each row reads is the one the target chose the row before.
    clean = results["clean"][2]
    assert clean["rows_used"] == "target-written rows" and clean["rows"] >= 100
    served = _variant(clean, "as served")
    assert served["agreement"] >= 0.9 and served["low"] < served["agreement"] < served["high"]
    assert served["chain"] == pytest.approx(chain_accept_length(served["agreement"], clean["steps"]))
    assert results["clean"][:2] == (0, "as served")
    assert set(clean["decided"]) >= {"rope", "norm_before_residual"}
    # Each bug: the variant that undoes it wins measurably, with its fix.
    assert results["rope"][:2] == (1, "rope base 10000 (the target's)")
    assert results["style"][:2] == (1, "rotary style neox (the target's)")
    assert results["vocab"][:2] == (1, "vocabulary map rebuilt from t2d")
    for case in ("rope", "style", "vocab"):
        result = results[case][2]
        win, bad = _variant(result, result["winner"]), _variant(result, "as served")
        assert win["low"] > bad["high"] and win["agreement"] == pytest.approx(served["agreement"], abs=0.02), case
        # The served draft computes what the config the engine read says: the replay cannot tell.
        assert _variant(result, "the checkpoint as its config says")["agreement"] == pytest.approx(bad["agreement"], abs=0.02)
    assert "rope_theta" in _variant(results["rope"][2], results["rope"][1])["fix"]
    assert "rope_is_neox_style to true" in _variant(results["style"][2], results["style"][1])["fix"]
    assert "rebuild d2t from t2d" in _variant(results["vocab"][2], results["vocab"][1])["fix"]
    assert replay_main([str(sglang_served / "rope" / "trace"), "--draft", str(sglang_served / "rope" / "ckpt")]) == 0
    assert "matches its checkpoint" in capsys.readouterr().out
    # The result beside the trace is the finding the view shows.
    (found,) = probe_findings(json.loads((sglang_served / "rope" / "trace" / "trace-h-1.probe.json").read_text()))
    assert (found.code, found.severity) == ("probe_better_variant", "error") and "rope_theta" in (found.fix or "")
    (ok,) = probe_findings(json.loads((sglang_served / "clean" / "trace" / "trace-h-1.probe.json").read_text()))
    assert (ok.code, ok.severity) == ("probe_served_as_trained", "info")


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_capture_id_readings_and_the_targets_head_from_the_target_folder(
    sglang_served: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--target", str(sglang_served / "target")]
    code, clean = _probe(sglang_served / "clean" / "trace", sglang_served / "clean" / "ckpt", capsys, target)
    assert code == 0 and clean["winner"] == "as served"
    # ids [-1, 1, 3]: SpecForge's reading is what SGLang captured, speculators' has no boundary -1.
    assert not [v for v in clean["variants"] if v["axis"] == "capture"]
    assert _variant(clean, "the target's head")["agreement"] < 0.1  # trained with its own head and map
    # ids [0, 2, 4] in the config: SGLang captures boundaries 1, 3, 5. Read as speculators' boundary k,
    # the fused input is rebuilt from the target's recomputed boundaries 0, 2, 4: what the draft
    # was trained on, and the clean run's agreement to the row.
    code, shifted = _probe(sglang_served / "capture" / "trace", sglang_served / "capture" / "ckpt", capsys, target)
    reading = _variant(shifted, "capture ids [0, 2, 4] read as speculators' and vLLM's boundary k (boundaries [0, 2, 4])")
    assert reading["hits"] == _variant(clean, "as served")["hits"] and reading["rows"] == clean["rows"]
    assert "eagle_aux_hidden_state_layer_ids [-1, 1, 3]" in reading["fix"]
    # On this pair a capture one block late costs too little to measure (boundary 1 still
    # carries the embedding the draft's lookup needs): the probe says so rather than guess.
    served = _variant(shifted, "as served")
    assert code == 0 and served["agreement"] <= reading["agreement"] and reading["low"] <= served["high"]
    # A folder that is not the served target is named, not used.
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads((sglang_served / "target" / "config.json").read_text())
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})).save_pretrained(tmp_path / "other")
    assert (
        probe_main(
            [str(sglang_served / "clean" / "trace"), "--draft", str(sglang_served / "clean" / "ckpt"), "--target", str(tmp_path / "other")]
        )
        == 2
    )
    assert "not the served target" in capsys.readouterr().err


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_traced_by_spectrace_replay_keeps_the_targets_choices_itself(
    sglang_served: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectrace.replay.file import read_replay

    (kept,) = (sglang_served / "live" / "trace").glob("*.replay.safetensors")
    meta, forwards = read_replay(str(kept))
    assert meta.target_rotary == {"base": 10000.0, "neox": True, "cls": "RotaryEmbedding"}  # SGLang's own rotary
    assert all({"target_in", "target_next"} <= set(f.tensors) for f in forwards) and len(forwards) == 4
    code, result = _probe(sglang_served / "live" / "trace", sglang_served / "live" / "ckpt", capsys)
    assert (code, result["winner"], result["rows"]) == (0, "as served", 141)
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(sglang_served / "live" / "trace"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    codes = {(g["code"], g["severity"]) for g in json.loads(out.stdout)["findings"]}
    assert ("probe_served_as_trained", "info") in codes, codes


def _serve_reference(folder: Path, rope_theta: float | None = None) -> None:
    """The reference pipeline's target and draft traced with SPECTRACE_REPLAY (64 rows), on
    four 64-token sequences of the pair's language, the draft reading them shifted by one."""
    import spectrace
    from spectrace.settings import Settings

    target = Eagle3Target(load_target_model(), layer_ids=TRAINED_IDS, convention="specforge")
    draft = load_draft()
    if rope_theta is not None:
        draft.model.decoder_layer.self_attn.rope_theta = rope_theta
    seqs = sample_language(make_language(), 4, 64, torch.Generator().manual_seed(7))
    settings = Settings(replay=True, replay_rows=64, quiet=True)
    with spectrace.trace({"target": target, "draft": draft}, directory=str(folder), settings=settings), torch.no_grad():
        for seq in seqs:
            states = target(seq).hidden_states
            draft(seq[1:], states[:-1], torch.arange(seq.numel() - 1))


def _checkpoint(folder: Path, **config: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.loads((DATA_DIR / "draft_config.json").read_text())
    raw.update(config)
    (folder / "config.json").write_text(json.dumps(raw))
    shutil.copy(DATA_DIR / "draft.safetensors", folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("traced")
    _serve_reference(root / "clean")
    _serve_reference(root / "rope", rope_theta=100.0)
    return root


def test_the_probe_reads_a_trace_folder_and_the_view_shows_its_verdict(traced: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _checkpoint(traced / "ckpt")
    code, result = _probe(traced / "clean", ckpt, capsys)
    assert code == 0 and result["served_wins"], result
    assert _variant(result, "as served")["agreement"] >= 0.9
    code, result = _probe(traced / "rope", _checkpoint(traced / "ckpt100", rope_theta=100.0), capsys)
    assert (code, result["winner"]) == (1, "rope base 10000 (the target's)")
    for case, want in (("clean", ("probe_served_as_trained", "info")), ("rope", ("probe_better_variant", "error"))):
        out = subprocess.run(
            [sys.executable, "-m", "spectrace", "view", str(traced / case), "--json"], capture_output=True, text=True, timeout=120
        )
        codes = {(g["code"], g["severity"]) for g in json.loads(out.stdout)["findings"]}
        assert want in codes, (case, codes)


def test_the_text_says_the_rows_the_formula_and_the_fix(traced: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_main([str(traced / "rope"), "--draft", str(_checkpoint(traced / "ckpt100", rope_theta=100.0)), "--steps", "4"]) == 1
    out = capsys.readouterr().out
    assert "target-written rows" in out and "1 + a + a^2 + ... + a^k" in out and "k = 4 (from --steps)" in out
    assert "<- wins" in out and "fix: set the draft config's rope_theta" in out


def test_a_served_draft_wins_withdraws_the_warnings_it_settles() -> None:
    result = {
        "format": "spectrace.probe-result/1",
        "served_wins": True,
        "winner": "as served",
        "decided": ["norm_before_residual", "rope"],
        "variants": [{"name": "as served", "axis": "served", "agreement": 0.93, "low": 0.88, "high": 0.96, "chain": 3.6}],
    }
    rope = finding("rope_mismatch", "the draft's base is 10000, the target's unknown", severity="warning")
    rope_error = finding("rope_mismatch", "the draft's base differs from the target's", severity="error")
    nbr = finding("unsupported_config_flag", "norm_before_residual", module="config.json:norm_before_residual", severity="warning")
    ids = finding("aux_layers_mismatch", "which trainer", severity="warning")
    tagged = finding("aux_layers_mismatch", "ids", severity="warning", evidence={"probe_axis": "rope"})
    kept = withdraw([rope, rope_error, nbr, ids, tagged], result)
    assert kept == [rope_error, ids]  # errors stay; a warning on an axis not measured stays
    assert withdraw([rope], {**result, "served_wins": False}) == [rope]


def test_bad_input_exits_2(tmp_path: Path, traced: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Draft inputs kept without the target's choices (no target was traced).
    draft = load_draft()
    capture = keep_replay(draft, rows=6)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        draft(torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g), torch.arange(10))
    (tmp_path / "t").mkdir()
    capture.write(str(tmp_path / "t"), "trace-h-1.jsonl")
    ckpt = _checkpoint(tmp_path / "ckpt")
    assert probe_main([str(tmp_path / "t"), "--draft", str(ckpt)]) == 2
    assert probe_main([str(tmp_path / "none"), "--draft", str(ckpt)]) == 2
    assert probe_main([str(traced / "clean"), "--draft", str(tmp_path / "missing")]) == 2
    assert probe_main([str(traced / "clean"), "--draft", str(_checkpoint(tmp_path / "wide", hidden_size=32))]) == 2
    assert probe_main([str(traced / "clean"), "--draft", str(ckpt), "--steps", "zero"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("spectrace probe: error:") for line in err), err
    assert "no target choices" in err[0] and "not this trace's draft" in err[3]


def test_the_interval_and_the_chain() -> None:
    assert chain_accept_length(0.975, 4) == pytest.approx(4.76, abs=0.01)
    assert chain_accept_length(0.82, 4) == pytest.approx(3.49, abs=0.01)
    low, high = wilson(0, 50)
    assert low == 0.0 and 0.05 < high < 0.1
    low, high = wilson(141, 141)
    assert high == 1.0 and 0.97 < low < 0.98


def test_bases_not_measurably_apart_name_the_targets_own() -> None:
    # Live on SGLang 0.5.17 (a draft served at base 100, trained at its target's 10000; rows up
    # to position 192): 500000 agreed 0.927 [0.901, 0.947], the target's 10000 0.902 [0.873, 0.925].
    from spectrace.probe.run import ProbeResult, VariantResult, _decide

    def v(name: str, axis: str, hits: int, rows: int = 509) -> VariantResult:
        low, high = wilson(hits, rows)
        return VariantResult(name=name, axis=axis, hits=hits, rows=rows, agreement=hits / rows, low=low, high=high, chain=1.0)

    served = v("as served", "served", 263)
    live = ProbeResult(variants=[served, v("rope base 500000", "rope", 472), v("rope base 10000 (the target's)", "rope", 459)])
    _decide(live)
    assert (live.served_wins, live.winner) == (False, "rope base 10000 (the target's)") and "not measurably apart" in live.notes[0]
    # Measurably better than the target's own: the best is named.
    apart = ProbeResult(variants=[served, v("rope base 500000", "rope", 500), v("rope base 10000 (the target's)", "rope", 400)])
    _decide(apart)
    assert apart.winner == "rope base 500000" and not apart.notes

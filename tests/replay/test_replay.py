"""``spectrace replay``: a served draft's kept inputs against a reference built from its checkpoint.

The reference pipeline's draft (spectrace.eagle3) and SGLang 0.5.23's own
``LlamaForCausalLMEagle3`` on CPU keep their inputs with :func:`keep_replay`; each bug
(a served RoPE base other than the checkpoint's, a trained ``lm_head`` replaced by the
worker's sharing step) is reproduced in the engine's own objects and has a clean twin.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from spectrace.checks.replay import findings_beside
from spectrace.cli.replay import main as replay_main
from spectrace.eagle3.pair import DATA_DIR, load_draft
from spectrace.hooks.replay_capture import keep_replay
from spectrace.replay.file import read_replay
from tests.helpers import paths

ROOT = paths.ROOT


def _checkpoint(folder: Path, **config: object) -> Path:
    """The shipped trained draft as a checkpoint folder (config.json + safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.loads((DATA_DIR / "draft_config.json").read_text())
    raw.update(config)
    (folder / "config.json").write_text(json.dumps(raw))
    shutil.copy(DATA_DIR / "draft.safetensors", folder / "model.safetensors")
    return folder


def _serve_reference(tmp: Path, rope_theta: float | None = None) -> Path:
    """Run the reference pipeline's draft on one forward from position 0, keep its replay inputs."""
    draft = load_draft()
    if rope_theta is not None:  # the served rotary base, not the checkpoint's
        draft.model.decoder_layer.self_attn.rope_theta = rope_theta
    capture = keep_replay(draft, rows=6)
    g = torch.Generator().manual_seed(0)
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)
    with torch.no_grad():
        draft(ids, fused, torch.arange(10))
        draft(ids[:1], torch.randn(1, 64, generator=g), torch.tensor([10]))  # a later step: not kept (needs a KV cache)
    trace = tmp / "trace"  # not made: write() creates it, as docs/replay.md's capture.write("traces", ...) needs
    name = capture.write(str(trace), "trace-h-1.jsonl")
    assert name == "trace-h-1.replay.safetensors"
    return trace


def test_clean_reference_draft_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _serve_reference(tmp_path)
    path = trace / "trace-h-1.replay.safetensors"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    meta, forwards = read_replay(str(path))
    assert len(forwards) == 1 and forwards[0].meta.rows == 6  # the later step was not kept
    assert {"hidden_in", "fc_out", "layer_out", "norm_out", "topk_ids", "target_ids"} <= set(forwards[0].tensors)
    code = replay_main([str(trace), "--draft", str(_checkpoint(tmp_path / "ckpt"))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "the served draft matches its checkpoint" in out
    assert json.loads((trace / "trace-h-1.replay.json").read_text())["agree"] is True


def test_served_rope_base_names_the_decoder_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _serve_reference(tmp_path, rope_theta=500000.0)
    code = replay_main([str(trace), "--draft", str(_checkpoint(tmp_path / "ckpt")), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1
    assert result["first_divergence"] == "decoder layer"
    assert any("rope_theta" in c for c in result["causes"])
    fc = next(m for m in result["modules"] if m["module"] == "fc")
    assert fc["compared"] and fc["agrees"]  # judged on its own inputs: fc is not blamed
    # RoPE leaves position 0 unrotated: the rows shown are the first that differ, named.
    assert result["served"].startswith("row ") and result["expected"].startswith("row ")
    row = result["served"].split(":")[0]
    assert row != "row 0" and result["expected"].startswith(row + ":") and result["served"] != result["expected"]
    # The result beside the trace is a finding with its fix, as the view shows it.
    (found,) = findings_beside(str(trace))
    assert (found.code, found.module, found.severity) == ("replay_divergence", "decoder layer", "error")
    assert found.fix and found.evidence["replay_file"] == "trace-h-1.replay.safetensors"


def test_a_later_forward_without_fc_keeps_the_first_forwards_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two kept forwards from position 0: the first through fc, the second a draft step fed a
    # hidden-wide state (fc skipped). fc's verdict from the first stays, with why the second
    # was not compared beside it.
    draft = load_draft()
    capture = keep_replay(draft, rows=6)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        draft(torch.randint(0, 128, (8,), generator=g), torch.randn(8, 192, generator=g), torch.arange(8))
        draft(torch.randint(0, 128, (4,), generator=g), torch.randn(4, 64, generator=g), torch.arange(4))
    assert capture.write(str(tmp_path / "traces" / "run"), "trace-h-1.jsonl")  # nested folders made too
    code = replay_main([str(tmp_path / "traces" / "run"), "--draft", str(_checkpoint(tmp_path / "ckpt"))])
    out = capsys.readouterr().out
    assert code == 0, out
    fc_line = next(line for line in out.splitlines() if line.strip().startswith("fc "))
    assert "agrees: max error" in fc_line and "compared in 1 of 2 forwards; the other: fc did not run" in fc_line, fc_line


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert replay_main([str(empty), "--draft", str(_checkpoint(tmp_path / "ckpt"))]) == 2
    assert "SPECTRACE_REPLAY=1" in capsys.readouterr().err
    trace = _serve_reference(tmp_path)
    assert replay_main([str(trace), "--draft", str(tmp_path / "missing")]) == 2
    wide = _checkpoint(tmp_path / "wide", hidden_size=32)
    assert replay_main([str(trace), "--draft", str(wide)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "not this trace's draft" in err.splitlines()[-1]


SGLANG_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from tests.helpers import sglang_harness as sh
    from safetensors.torch import load_file, save_file
    from spectrace.hooks.replay_capture import keep_replay
    sh.setup()
    out = sys.argv[2]
    base = json.load(open(sys.argv[3]))
    tensors = load_file(sys.argv[4])
    g = torch.Generator().manual_seed(0)
    target_embed, target_head = torch.randn(128, 64, generator=g) * 0.1, torch.randn(128, 64, generator=g) * 0.1
    full_head = torch.randn(128, 64, generator=g) * 0.1  # a head trained over the whole vocabulary
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)

    def case(name, served, ckpt_config, weights, share_head):
        import os
        folder = os.path.join(out, name)
        os.makedirs(folder + "/ckpt"); os.makedirs(folder + "/trace")
        json.dump(ckpt_config, open(folder + "/ckpt/config.json", "w"))
        save_file(weights, folder + "/ckpt/model.safetensors")
        draft = sh.build_sglang_eagle3_draft(served, {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()})
        if share_head:  # the EAGLE worker's sharing step when load_lm_head_from_target is set
            draft.set_embed_and_head(torch.nn.Parameter(target_embed.clone()), torch.nn.Parameter(target_head.clone()))
        else:
            draft.set_embed(torch.nn.Parameter(target_embed.clone()))
        capture = keep_replay(draft, rows=6)
        sh.run_draft(draft, ids, fused)
        capture.write(folder + "/trace", "trace-h-1.jsonl")

    case("rope_clean", dict(base), base, tensors, False)
    case("rope_bad", dict(base, rope_theta=500000.0), base, tensors, False)  # the engine's base, not the checkpoint's
    head = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    head["lm_head.weight"] = full_head
    nulled = dict(base, draft_vocab_size=None)
    case("head_bad", nulled, nulled, head, nulled["draft_vocab_size"] is None)
    full = dict(base, draft_vocab_size=128)
    case("head_clean", full, full, head, full["draft_vocab_size"] is None)
    """
)


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_draft_rope_and_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            SGLANG_SCRIPT,
            str(ROOT),
            str(tmp_path),
            str(DATA_DIR / "draft_config.json"),
            str(DATA_DIR / "draft.safetensors"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "SPECTRACE": "0"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # The built-in reference, and SpecForge's own LlamaForCausalLMEagle3 (the trainer of this
    # flat format; scripts/install-sglang-cpu.sh installs it), give the same verdicts.
    for reference in ("builtin", "specforge"):
        verdicts = {}
        for case in ("rope_clean", "rope_bad", "head_clean", "head_bad"):
            argv = [str(tmp_path / case / "trace"), "--draft", str(tmp_path / case / "ckpt"), "--reference", reference, "--json"]
            code = replay_main(argv)
            result = json.loads(capsys.readouterr().out)
            assert result["reference"] == reference
            verdicts[case] = (code, result["first_divergence"])
        assert verdicts == {
            "rope_clean": (0, None),
            "rope_bad": (1, "decoder layer"),
            "head_clean": (0, None),
            "head_bad": (1, "lm_head"),
        }, reference


def test_the_replay_switch_keeps_inputs_beside_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SPECTRACE_REPLAY (Settings.replay) through spectrace.trace(): no code of the user's keeps them.
    import spectrace
    from spectrace.settings import Settings

    draft = load_draft()
    g = torch.Generator().manual_seed(0)
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)
    with spectrace.trace({"draft": draft}, directory=str(tmp_path / "trace"), settings=Settings(replay=True)) as t, torch.no_grad():
        draft(ids, fused, torch.arange(10))
    assert t.path is not None
    kept = list((tmp_path / "trace").glob("*.replay.safetensors"))
    assert len(kept) == 1 and stat.S_IMODE(os.stat(kept[0]).st_mode) == 0o600
    assert read_replay(str(kept[0]))[1]  # at least the one forward from position 0
    assert replay_main([str(tmp_path / "trace"), "--draft", str(_checkpoint(tmp_path / "ckpt"))]) == 0
    assert "matches its checkpoint" in capsys.readouterr().out
    # Off by default: nothing is kept.
    with spectrace.trace({"draft": draft}, directory=str(tmp_path / "off")), torch.no_grad():
        draft(ids, fused, torch.arange(10))
    assert not list((tmp_path / "off").glob("*.replay.*"))


def test_the_view_shows_a_replay_that_diverged_as_a_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import spectrace
    from spectrace.settings import Settings

    draft = load_draft()
    draft.model.decoder_layer.self_attn.rope_theta = 500000.0  # the served rotary base, not the checkpoint's
    g = torch.Generator().manual_seed(0)
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)
    with spectrace.trace({"draft": draft}, directory=str(tmp_path / "trace"), settings=Settings(replay=True)), torch.no_grad():
        draft(ids, fused, torch.arange(10))
    assert replay_main([str(tmp_path / "trace"), "--draft", str(_checkpoint(tmp_path / "ckpt"))]) == 1
    capsys.readouterr()
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(tmp_path / "trace"), "--json"], capture_output=True, text=True, timeout=120
    )
    codes = {(g["code"], g["severity"]) for g in json.loads(out.stdout)["findings"]}
    assert ("replay_divergence", "error") in codes, codes


def test_a_forward_whose_body_ran_in_a_graph_is_said_and_not_kept(tmp_path: Path) -> None:
    # SGLang 0.5.17 graphs prefills by default: the draft's entry runs in Python, its fc,
    # decoder layer and norm inside the graph, where no Python hook runs. Here the body's
    # hooks are taken off those modules, as a graph replay passes them by.
    from spectrace.recorder import Recorder
    from spectrace.records import Coverage
    from spectrace.settings import Settings

    draft = load_draft()
    rec = Recorder(Settings(flush_seconds=3600, quiet=True), directory=str(tmp_path / "t"))
    capture = keep_replay(draft, rows=6, max_forwards=1, recorder=rec)
    g = torch.Generator().manual_seed(0)
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)
    body = (capture.fc, capture.layer, capture.norm)
    saved = [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in body]
    for m in body:
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
    with torch.no_grad():
        draft(ids, fused, torch.arange(10))
        draft(ids, fused, torch.arange(10))
    assert (capture.inputs_only, capture.kept) == (2, [])  # counted, not kept: the one slot stays free
    said = [r for r in rec.records() if isinstance(r, Coverage) and "SPECTRACE_REPLAY" in r.detail]
    assert len(said) == 1 and "--disable-prefill-cuda-graph" in said[0].detail
    for m, (hooks, pre) in zip(body, saved, strict=True):  # the body's hooks back: an eager forward
        m._forward_hooks.update(hooks)
        m._forward_pre_hooks.update(pre)
    with torch.no_grad():
        draft(ids, fused, torch.arange(10))
    assert len(capture.kept) == 1
    rec.close()  # the recorder's drain writes the replay file beside its trace
    (path,) = (tmp_path / "t").glob("*.replay.safetensors")
    meta, forwards = read_replay(str(path))
    assert meta.dtype == "float32" and "layer_out" in forwards[0].tensors


def test_a_checkpoint_tensor_left_at_nan_diverges_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # speculators initialises its head to NaN until a verifier's is loaded; a checkpoint
    # saved before that must not "agree" (NaN compares false with any tolerance).
    from safetensors.torch import load_file, save_file

    trace = _serve_reference(tmp_path)
    ckpt = _checkpoint(tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["lm_head.weight"] = torch.full_like(tensors["lm_head.weight"], float("nan"))
    save_file(tensors, str(ckpt / "model.safetensors"))
    assert replay_main([str(trace), "--draft", str(ckpt), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["first_divergence"] == "lm_head"
    (head,) = [m for m in result["modules"] if m["module"] == "lm_head"]
    assert "the reference computed NaN" in head["note"] and head["max_error"] is None

"""SPECTRACE_CAPTURE_VALUES and ``spectrace compare-train`` on the demo's trained pair.

The reference pipeline runs traced with the values capture on; compare-train then
recomputes the target's hidden states with transformers from a model folder holding the
pair's target weights, and says which boundary each served chunk is: the healthy build
matches its training, the embedding-vs-layer bug (ids [1, 3, 4] for a draft trained on
[embedding, out(block 1), out(block 3)]) is found by value.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spectrace import api
from spectrace.cli.compare_train import main as compare_main
from spectrace.eagle3.bugs import build_scenario
from spectrace.eagle3.loop import speculate
from spectrace.eagle3.pair import DATA_DIR, demo_prompts
from spectrace.eagle3.target import tiny_llama
from spectrace.eagle3.watch import PipelineWatch
from spectrace.settings import MAX_CAPTURE_VALUES, Settings
from spectrace.values_file import read_values
from spectrace.viewers.loader import load_traces

TOKENS = 16


def write_target_folder(folder: Path) -> Path:
    """The pair's trained target as a model folder transformers loads (as the live scripts write it)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((DATA_DIR / "target_config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copyfile(DATA_DIR / "target.safetensors", folder / "model.safetensors")
    return folder


def run_traced(name: str, folder: Path, capture_values: int = TOKENS, dtype: torch.dtype = torch.float32) -> Path:
    """One demo prompt through scenario ``name``, traced into ``folder``; its draft config beside it."""
    scenario = build_scenario(name, load=False)
    scenario.target.model.to(dtype)
    scenario.draft.to(dtype)
    settings = Settings(quiet=True, capture_values=capture_values)
    with api.trace({"target": scenario.target, "draft": scenario.draft}, profile="eagle3", directory=str(folder), settings=settings) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm)
        watch.load(scenario.checkpoint)
        scenario.draft.set_embed(scenario.target.get_embed())
        scenario.draft.to(dtype)  # the loader wrote float32 tensors
        with torch.no_grad():
            speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=12, on_step=watch.on_step)
        watch.finish()
    (folder / "draft_config.json").write_text(json.dumps(scenario.draft_config))
    return folder


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return write_target_folder(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return run_traced("healthy", tmp_path_factory.mktemp("healthy"))


@pytest.fixture(scope="module")
def shifted(tmp_path_factory) -> Path:
    return run_traced("embedding_vs_layer", tmp_path_factory.mktemp("shifted"))


def _compare(trace: Path, target: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = compare_main([str(trace), "--target", str(target), "--draft-config", str(trace / "draft_config.json"), *extra])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ the setting
def test_the_setting_is_off_by_default_bounded_and_warns_that_values_are_user_data(capsys):
    assert Settings.from_env({}).capture_values == 0 and capsys.readouterr().err == ""
    assert Settings.from_env({"SPECTRACE_CAPTURE_VALUES": "0"}).capture_values == 0
    s = Settings.from_env({"SPECTRACE_CAPTURE_VALUES": "32"})
    assert s.capture_values == 32
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "SPECTRACE_CAPTURE_VALUES=32" in line and "user data" in line
    for bad in ("-1", "lots", str(MAX_CAPTURE_VALUES + 1), "1e3"):
        assert Settings.from_env({"SPECTRACE_CAPTURE_VALUES": bad}).capture_values == 0
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("spectrace: warning: SPECTRACE_CAPTURE_VALUES=") and "using 0 (off)" in line
    assert Settings(capture_values=10**9).capture_values == 0
    assert "capture_values" in capsys.readouterr().err


def test_off_writes_no_values_file(tmp_path):
    folder = run_traced("healthy", tmp_path / "off", capture_values=0)
    assert not list(folder.glob("*.values.safetensors"))
    assert not load_traces(folder).all("values")


# ------------------------------------------------------------------ the capture
def test_values_file_sits_beside_the_trace_private_and_stated_in_a_record(healthy):
    (trace,) = healthy.glob("trace-*.jsonl")
    (values,) = healthy.glob("*.values.safetensors")
    assert values.name == trace.name[: -len(".jsonl")] + ".values.safetensors"
    assert stat.S_IMODE(values.stat().st_mode) == 0o600
    (record,) = load_traces(healthy).all("values")
    assert record.file == values.name and record.tokens == TOKENS and record.width == 3 * 64
    assert record.boundaries == [0, 2, 4] and len(record.steps) == 4 and record.rows == [TOKENS] * 4
    meta, steps = read_values(str(values))
    prompt = demo_prompts()[0]
    for s in steps:  # every kept forward starts at position 0 of the prompt it ran
        assert s.input_ids.tolist() == prompt[:TOKENS] and s.fused.shape == (TOKENS, 192)
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["settings"]["capture_values"] == TOKENS


def test_the_kept_rows_are_the_fused_input_the_draft_got(healthy):
    """The rows equal the target's stored states for the same ids: the aux concat, the draft's fc input."""
    (values,) = healthy.glob("*.values.safetensors")
    _, steps = read_values(str(values))
    scenario = build_scenario("healthy")
    with torch.no_grad():
        stored = scenario.target(steps[0].input_ids).hidden_states
    assert torch.equal(stored, steps[0].fused)


def test_a_name_already_taken_is_never_opened(tmp_path):
    """A symlink planted at the values file's name is not followed: the next free name is used."""
    folder = tmp_path / "planted"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    stem = f"trace-{socket.gethostname()}-{os.getpid()}"
    (folder / f"{stem}.values.safetensors").symlink_to(victim)
    run_traced("healthy", folder)
    assert victim.read_text() == "keep"
    (record,) = load_traces(folder).all("values")
    assert record.file == f"{stem}.values.2.safetensors"
    assert (folder / record.file).is_file() and not (folder / record.file).is_symlink()


# ------------------------------------------------------------------ compare-train
def test_healthy_pair_every_chunk_matches_its_trained_boundary(healthy, target_dir, capsys):
    code, out, err = _compare(healthy, target_dir, capsys)
    assert code == 0, out + err
    assert "chunk 0 matches the embedding at 1.000" in out
    assert "chunk 1 matches out(block 1) at 1.000" in out and "chunk 2 matches out(block 3) at 1.000" in out
    assert "every chunk is the boundary the draft was trained on" in out
    lines = out.splitlines()
    every = lines[lines.index(next(x for x in lines if x.startswith("chunk 0 "))) + 1].split()
    assert every[:2] == ["emb", "1.000"] and every[2::2] == ["b1", "b2", "b3", "b4", "b5", "b6"]  # every boundary of 6 layers


def test_embedding_vs_layer_is_found_by_value(shifted, target_dir, capsys):
    code, out, err = _compare(shifted, target_dir, capsys)
    assert code == 1, out + err
    lines = out.splitlines()
    chunk0 = next(line for line in lines if line.startswith("chunk 0 "))
    assert chunk0.startswith("chunk 0 matches out(block 1) at 1.000, the embedding at 0.")
    assert chunk0.endswith("the draft was trained on the embedding")
    assert "error values_boundary_mismatch: 3 of 3 chunks" in out
    assert "eagle_aux_hidden_state_layer_ids to [-1, 1, 3]" in out  # the ids that capture [0, 2, 4] under SGLang's Llama rule


@pytest.mark.parametrize("served, recomputed", [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_bf16_on_either_side_keeps_matching_chunks_above_0_99(served, recomputed, target_dir, tmp_path, capsys):
    """Served in bf16 (as on a GPU) or recomputed in bf16 (a large target on the CPU): the
    right boundary stays above 0.99 and the bug is still found."""
    for name, expect in (("healthy", 0), ("embedding_vs_layer", 1)):
        folder = run_traced(name, tmp_path / f"{name}-{served}", dtype=getattr(torch, served))
        (record,) = load_traces(folder).all("values")
        assert record.dtype == served
        code, out, _ = _compare(folder, target_dir, capsys, "--json", "--dtype", recomputed)
        (result,) = json.loads(out)
        assert code == expect
        served_boundaries = [0, 2, 4] if name == "healthy" else [2, 4, 5]
        assert result["matched_boundaries"] == [[b] for b in served_boundaries]
        assert all(row[b] > 0.99 for row, b in zip(result["cosines"], served_boundaries))


def test_json_gives_the_cosines_and_the_finding(shifted, target_dir, capsys):
    code, out, _ = _compare(shifted, target_dir, capsys, "--json")
    (result,) = json.loads(out)
    assert code == 1 and result["trained_boundaries"] == [0, 2, 4]
    assert result["matched_boundaries"] == [[2], [4], [5]]
    assert all(row[b] > 0.99 for row, b in zip(result["cosines"], (2, 4, 5)))
    assert [f["code"] for f in result["findings"]] == ["values_boundary_mismatch"]


def test_another_target_of_the_same_shape_matches_no_boundary(healthy, tmp_path, capsys):
    """Random weights of the same architecture: no chunk equals any of its hidden states."""
    other = tmp_path / "random-llama"
    tiny_llama(seed=5).save_pretrained(str(other))
    code, out, _ = _compare(healthy, other, capsys)
    assert code == 1 and "error values_chunk_unmatched: 3 of 3 chunks" in out


@pytest.mark.parametrize(
    "case",
    ["no_trace", "no_values", "wrong_width", "bad_config", "no_target"],
)
def test_bad_input_is_one_line_and_exit_2(case, healthy, target_dir, tmp_path, capsys):
    trace, target, config = healthy, target_dir, healthy / "draft_config.json"
    if case == "no_trace":
        trace = tmp_path / "nowhere"
    elif case == "no_values":
        trace = run_traced("healthy", tmp_path / "plain", capture_values=0)
    elif case == "wrong_width":
        target = tmp_path / "narrow"
        tiny_llama(hidden_size=32).save_pretrained(str(target))
    elif case == "bad_config":
        config = tmp_path / "config.json"
        config.write_text("{not json")
    elif case == "no_target":
        target = tmp_path / "no-model-here"
        target.mkdir()
    code = compare_main([str(trace), "--target", str(target), "--draft-config", str(config)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("spectrace compare-train: error: ")


def test_the_command_is_registered_with_help_and_an_example():
    done = subprocess.run([sys.executable, "-m", "spectrace", "compare-train", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "examples:" in done.stdout and "--draft-config" in done.stdout
    listing = subprocess.run([sys.executable, "-m", "spectrace", "--help"], capture_output=True, text=True, timeout=60)
    assert "compare-train" in listing.stdout


def test_the_view_header_names_the_values_file(healthy):
    done = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(healthy), "--no-pager"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")} | {"COLUMNS": "160"},
    )
    (values,) = healthy.glob("*.values.safetensors")
    assert f"values captured: {values.name} ({TOKENS} tokens x 4 steps)" in done.stdout, done.stdout[:2000]


def test_no_fused_input_seen_is_said_once(tmp_path):
    """fc_bypass: no aux capture, no aux concat; the trace says no values were kept, and why."""
    folder = run_traced("fc_bypass", tmp_path / "bypass")
    assert not list(folder.glob("*.values.safetensors"))
    notes = [c.detail for c in load_traces(folder).all("coverage") if "SPECTRACE_CAPTURE_VALUES" in c.detail]
    assert len(notes) == 1 and "no fused draft input was seen" in notes[0]


def test_capture_changes_no_output():
    """The same prompt with the capture on and off: the same tokens, the same accept lengths."""
    results = []
    for values in (0, TOKENS):
        scenario = build_scenario("healthy")
        with api.trace(
            {"target": scenario.target, "draft": scenario.draft}, profile="eagle3", settings=Settings(quiet=True, capture_values=values)
        ):
            with torch.no_grad():
                results.append(speculate(scenario.target, scenario.draft, demo_prompts()[1], k=4, max_new_tokens=12))
    assert results[0].generated == results[1].generated and results[0].accept_lengths == results[1].accept_lengths


def test_a_trace_without_a_folder_says_the_values_were_not_written(capsys):
    scenario = build_scenario("healthy")
    with api.trace(
        {"target": scenario.target, "draft": scenario.draft}, profile="eagle3", settings=Settings(quiet=True, capture_values=4)
    ) as t:
        with torch.no_grad():
            speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=4)
    notes = [r.detail for r in t.records if getattr(r, "type", "") == "coverage" and "SPECTRACE_CAPTURE_VALUES" in r.detail]
    assert notes == ["SPECTRACE_CAPTURE_VALUES: the trace has no folder (set SPECTRACE_DIR or directory=): the values were not written"]


def test_a_forked_child_never_writes_the_parents_values(tmp_path):
    """Rows kept before a fork are the parent's: the child's trace gets no values file of them."""
    scenario = build_scenario("healthy")
    folder = tmp_path / "fork"
    t = api.trace(
        {"target": scenario.target, "draft": scenario.draft},
        profile="eagle3",
        directory=str(folder),
        settings=Settings(quiet=True, capture_values=8),
    )
    with torch.no_grad():
        scenario.target(torch.tensor(demo_prompts()[0]))  # one forward from position 0, kept
    child = os.fork()
    if child == 0:
        try:
            t.close()
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    t.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    (values,) = folder.glob("*.values.safetensors")
    assert f"-{os.getpid()}." in values.name
    assert len(list(folder.glob("trace-*.jsonl"))) == 2  # the child wrote a trace of its own, without values


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_rows_are_copied_without_a_sync_and_land_whole(tmp_path):
    """On a GPU the kept rows go by non_blocking copy into pinned memory behind an event:
    the forwards never wait (sync debug mode raises on a sync), and the file holds the
    very rows the aux concat returned."""
    import torch.nn as nn

    class AuxConcat(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.cat([h, 2 * h, 3 * h], dim=-1)

    class Target(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(128, 16)
            self.layer = nn.Linear(16, 16)
            self.aux_concat = AuxConcat()

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.aux_concat(self.layer(self.embed_tokens(input_ids)))

    torch.manual_seed(0)
    target = Target().cuda()
    ids = [torch.randint(0, 128, (1, 12), device="cuda") for _ in range(4)]
    settings = Settings(quiet=True, capture_values=8)
    outs = []
    with torch.no_grad(), api.trace({"target": target}, directory=str(tmp_path), settings=settings):
        target(ids[0][:, :2])  # warm-up: kernels, the allocator (kept as a step of its own)
        torch.cuda.synchronize()
        # Sync debug mode is global: the flush thread's own wait (the drain, once the 4th
        # step is kept) would trip it too, so the window holds the 2nd and 3rd kept steps.
        torch.cuda.set_sync_debug_mode("error")
        try:
            for x in ids[1:3]:
                outs.append(target(x))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        outs.append(target(ids[3]))
    (values,) = tmp_path.glob("*.values.safetensors")
    _, steps = read_values(str(values))
    kept = steps[1:]  # the warm-up forward was the first kept
    assert len(kept) == 3
    for step, x, out in zip(kept, ids[1:], outs):
        assert step.input_ids.tolist() == x[0, :8].tolist()
        assert torch.equal(step.fused, out[0, :8].cpu())


def test_a_values_write_that_fails_is_tried_again_at_the_next_drain(tmp_path, monkeypatch):
    from spectrace.hooks import values as V

    real, calls = V.ValuesCapture._write, []

    def full_disk_once(self, slots):
        calls.append(len(slots))
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(self, slots)

    monkeypatch.setattr(V.ValuesCapture, "_write", full_disk_once)
    folder = run_traced("healthy", tmp_path / "retry")
    assert len(calls) == 2  # the failed write, then the one at the close that kept the rows
    (values,) = folder.glob("*.values.safetensors")
    _, steps = read_values(str(values))
    assert len(steps) == 4 and all(s.fused.shape == (TOKENS, 192) for s in steps)

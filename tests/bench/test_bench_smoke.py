"""The overhead benchmark runs end to end on a tiny model (a smoke test, nothing is timed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tests.helpers import paths
from tests.helpers.scripts import load_script

ROOT = str(paths.ROOT)

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


def run_bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` from the repository root without SPECTRACE_* set; it must exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_overhead_bench_quick_runs_every_section(tmp_path):
    run_bench("overhead.py", "--device", "cpu", "--quick", "--sample", "2", "--soak-calls", "1000", "--out", str(tmp_path))
    res = json.loads((tmp_path / "overhead-cpu.json").read_text())
    assert not res["errors"]
    assert set(res["eager"]) == {
        "bare",
        "off",
        "shapes",
        "shapes_at_once",
        "stats",
        "stats_at_once",
        "anchor_empty_hooks",
        "anchor_item_hooks",
        "anchor_profiler_record_shapes",
        "shapes_sample2",
        "stats_sample2",
    }
    assert set(res["hook_time"]) >= {"shapes", "stats", "shapes_at_once", "stats_at_once", "shapes_sample2", "stats_sample2"}
    assert res["off_hooks"] == 0 and res["stats_filled"] > 0
    assert res["bootstrap"]["pth_line_us_median"] > 0 and not res["bootstrap"]["imported_spectrace_when_unset"]
    assert res["soak"]["jsonl_lines"] > 1000 and res["soak"]["jsonl_bytes_per_step"] > 0
    assert "| stats |" in (tmp_path / "overhead-cpu.md").read_text()


def test_serving_hooks_bench_wraps_every_per_step_point_and_accounts_each_call():
    proc = run_bench("serving_hooks.py", "--steps", "200", "--rounds", "2", timeout=300)
    # 5 wrapped calls per step, 200 steps, once per round in the traced variant: 2000 hook calls.
    assert "2000 calls; records dropped 0" in proc.stdout, proc.stdout
    assert "spectrace adds" in proc.stdout


@pytest.mark.slow
def test_two_versions_side_by_side_trace_the_same_model(tmp_path):
    """bench/ab_versions.py: the committed code beside the working tree, in one process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    out = tmp_path / "ab.json"
    base = tmp_path / "base"
    exported = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "ab_versions.py"), "--base", "HEAD", "--export", str(base)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if exported.returncode != 0 and "not a git repository" in exported.stderr:
        pytest.skip("not a git checkout")
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert not list((base / "spectrace_base").rglob("*.py")) == []
    assert not any("from spectrace." in p.read_text() for p in (base / "spectrace_base").rglob("*.py"))
    cmd = [
        sys.executable,
        os.path.join(ROOT, "bench", "ab_versions.py"),
        "--base-dir",
        str(base),
        "--rounds",
        "1",
        "--iters",
        "2",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    versions = [k for k in res if k.endswith(("shapes only", "statistics"))]
    assert len(versions) == 4 and any(k.startswith("base (") for k in versions)
    assert all(res[k]["us_per_hooked_call_accounting_median"] > 0 for k in versions)


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None, reason="needs valgrind")
@pytest.mark.slow
def test_instruction_counts_see_statistics_cost_more_than_shapes(tmp_path):
    """bench/instructions.py: each mode counted under callgrind, only the measured forwards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    out = tmp_path / "instructions.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "instructions.py"), "--forwards", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    per_call = res["per_hooked_call"]["working tree"]
    # a bare forward is millions of instructions; a hooked call tens of thousands more, statistics more still
    assert res["bare_instructions_per_forward"] > 10**6
    assert 0 < per_call["off"] < per_call["basic"] < res["bare_instructions_per_forward"]


@pytest.mark.slow
def test_step_split_times_each_part_of_a_traced_step(tmp_path):
    """bench/step_split.py: every part it names exists, and the statistics mode's parts show."""
    out = tmp_path / "split.json"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "step_split.py"), "--device", "cpu", "--steps", "3", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    split = json.loads(out.read_text())["split"]
    assert split["shapes"]["hooks_ms_per_step"] > 0 and "add" not in split["shapes"]["calls_per_step"]
    stats = split["stats"]
    assert stats["calls_per_step"]["add"] > 0 and stats["calls_per_step"]["finish_step"] >= 2
    # (no order between them: _read_pending also runs from hooks, outside finish_step)
    assert stats["parts_ms_per_step"]["finish_step"] > 0 and stats["parts_ms_per_step"]["_read_pending"] > 0


@pytest.mark.slow
def test_build_where_times_each_place_records_are_built(tmp_path):
    """bench/build_where.py on the meta device (device steps, all host work): every variant timed."""
    out = tmp_path / "where.json"
    run_bench("build_where.py", "--device", "meta", "--shapes", "1x1", "--rounds", "1", "--reps", "1", "--json", str(out))
    table = json.loads(out.read_text())["1x1"]["table"]
    assert set(table) == {"bare", "shapes", "shapes_worker", "shapes_nobuild", "stats", "stats_worker", "stats_nobuild"}
    assert table["bare"]["ratio"] == 1.0 and all(row["ms"] > 0 for row in table.values())


@pytest.mark.slow
def test_knob_ab_times_each_value_beside_bare_and_restores_the_setting(tmp_path):
    """bench/knob_ab.py on the tiny CPU pair: every value a variant, bare twice, ratios to bare."""
    out = tmp_path / "knob.json"
    run_bench(
        "knob_ab.py", "--device", "cpu", "--size", "tiny", "--shape", "1x16",
        "--knob", "spectrace.hooks.engine.PENDING_CALLS=1,64", "--rounds", "2", "--reps", "2", "--json", str(out),
    )  # fmt: skip
    res = json.loads(out.read_text())
    table = res["variants"]
    assert set(table) == {"bare", "bare again", "PENDING_CALLS=1", "PENDING_CALLS=64"}
    assert table["bare"]["ratio"] == 1.0 and all(row["ms"] > 0 for row in table.values())
    assert res["rounds"] == 2 and "PENDING_CALLS=1,64" in res["command"]


def test_knob_ab_refuses_a_setting_that_does_not_exist():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "knob_ab.py"), "--device", "cpu", "--knob", "spectrace.hooks.engine.NO_SUCH=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "has no NO_SUCH" in proc.stderr


def test_current_table_builds_one_file_from_the_benches_outputs_and_puts_its_table_in_a_page(tmp_path):
    """bench/current_table.py --build on the parts of the committed current file gives the
    same figures; --into replaces only the text between a page's markers."""
    current_table = load_script(os.path.join(ROOT, "bench", "current_table.py"))
    name, _body = current_table.table_block((Path(ROOT) / "BENCHMARKS.md").read_text(encoding="utf-8"))
    data = json.loads((Path(ROOT) / name).read_text(encoding="utf-8"))
    parts = {}
    for part in ("prefill", "decode", "graph", "host_cuda", "host_cpu"):
        parts[part] = tmp_path / f"{part}.json"
        parts[part].write_text(json.dumps(data[part]))
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- current table: old.json -->\nstale\n<!-- end of current table -->\nafter\n")
    built = tmp_path / name.rsplit("/", 1)[-1]
    run_bench(
        "current_table.py", "--build", str(built), "--commit", data["commit"], "--into", str(page),
        *[arg for part, path in parts.items() for arg in (f"--{part.replace('_', '-')}", str(path))],
    )  # fmt: skip
    rebuilt = json.loads(built.read_text())
    assert {k: rebuilt[k] for k in parts} == {k: data[k] for k in parts} and rebuilt["file"] == data["file"]
    text = page.read_text()
    assert text.startswith("before\n<!-- current table: " + name + " -->\n") and text.endswith("<!-- end of current table -->\nafter\n")
    assert "stale" not in text and "| decode-like 1x1, statistics |" in text
    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text("no markers here\n")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "current_table.py"), str(built), "--into", str(unmarked)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "no current-table markers" in proc.stderr and unmarked.read_text() == "no markers here\n"


@pytest.mark.slow
def test_floor_bench_times_each_floor_beside_spectrace(tmp_path):
    """bench/floor.py on the tiny CPU Llama: every variant a figure, spectrace's with its accounting."""
    out = tmp_path / "floor.json"
    run_bench("floor.py", "--repeats", "1", "--iters", "2", "--json", str(out))
    res = json.loads(out.read_text())
    figures = res["us_per_hooked_call"]
    assert set(figures) == {"bare_again", "empty", "note", "note_text", "stats_text", "spectrace_off", "spectrace_basic"}
    assert all("accounting" in figures[k] for k in figures if k != "bare_again")
    assert res["hooked_modules"] == 11 and res["command"].endswith("--json FILE")
    assert set(res["spectrace_over_floor"]) == {"shapes_only", "statistics", "shapes_only_accounting", "statistics_accounting"}


def test_the_floors_lines_are_the_json_of_what_each_call_saw():
    """The floor's records are real: one JSON line per call with every tensor argument's shape,
    a keyword tensor described once a step, and statistics of the outputs taken together."""
    floor = load_script(os.path.join(ROOT, "bench", "floor.py"))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
    modules = {"0": model[0], "2": model[2]}
    f = floor.Floor()
    original = nn.Linear.forward
    seen = floor.Seen(model, modules, f.note)
    try:
        x = torch.randn(3, 4)
        with torch.no_grad():
            model(x)
        f.text()
    finally:
        seen.remove()
    assert nn.Linear.forward is original  # the class's own forward, put back
    lines = [json.loads(line) for line in f.lines]
    assert [line["module"] for line in lines] == ["0", "2"]
    assert lines[0]["inputs"] == [{"arg": "input[0]", "shape": [3, 4], "dtype": "torch.float32", "device": "cpu", "stats": None}]
    assert lines[1]["outputs"][0]["shape"] == [3, 8]
    seen = floor.Seen(model, modules, f.keep)
    try:
        with torch.no_grad():
            outs = [model[0](x)]
            outs.append(model[2](torch.tanh(outs[0])))
        f.stats_text()
    finally:
        seen.remove()
    for line, out in zip((json.loads(line) for line in f.lines), outs):
        total, squares, top = line["outputs"][0]["stats"]
        assert total == pytest.approx(float(out.double().sum()), abs=1e-4)
        assert squares == pytest.approx(float((out.double() ** 2).sum()), rel=1e-5)
        assert top == pytest.approx(float(out.abs().max()), rel=1e-6)

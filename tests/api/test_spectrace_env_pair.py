"""``SPECTRACE=1`` on spectrace's own reference pair gives the verdict ``trace()`` gives.

The pair is built and run in a child process, unchanged, as a user's script would; the
trace it leaves is then read by ``spectrace view``. A program with no model spectrace
knows gets a trace that says so, and ``trace()`` inside a ``SPECTRACE=1`` process does
not hook a model twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow

PAIR = """
import sys
from spectrace.eagle3 import build_scenario, demo_prompts, speculate
pair = build_scenario(sys.argv[1])
speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=12)
"""
PLAIN = """
import torch
torch.nn.Sequential(torch.nn.Linear(4, 4))(torch.zeros(1, 4))
"""
BOTH = """
import spectrace
from spectrace.eagle3 import build_scenario, demo_prompts, speculate
pair = build_scenario("healthy")
with spectrace.trace({"target": pair.target, "draft": pair.draft}) as t:
    speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=8)
assert t.calls("draft.model.fc"), "trace() saw no fc call"
"""


def _run(tmp_path: Path, code: str, *args: str, **env: str) -> Path:
    out = tmp_path / "traces"
    script = tmp_path / "script.py"
    script.write_text(code)
    environ = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(out), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return out


def _view(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(folder), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _errors(folder: Path) -> set[str]:
    view = json.loads(_view(folder, "--json").stdout)
    return {f["code"] for f in view["findings"] if f["severity"] == "error"}


@pytest.mark.parametrize(
    ("scenario", "root_cause"),
    [("fc_bypass", "aux_capture_disabled"), ("layers0_names", "weights_dropped")],
)
def test_spectrace_env_names_the_reference_pairs_bug(tmp_path: Path, scenario: str, root_cause: str) -> None:
    out = _run(tmp_path, PAIR, scenario)
    assert root_cause in _errors(out)
    assert _view(out, "--fail-on", "error").returncode == 1


def test_spectrace_env_on_the_healthy_pair_keeps_replay_inputs_and_finds_nothing(tmp_path: Path) -> None:
    out = _run(tmp_path, PAIR, "healthy", SPECTRACE_REPLAY="1")
    assert _errors(out) == set()
    view = json.loads(_view(out, "--json").stdout)
    assert view["datapath"], "the EAGLE-3 data path was not traced"
    assert list(out.glob("*.replay.safetensors")), "SPECTRACE_REPLAY=1 kept nothing"
    assert "no weight load" not in _view(out, "--no-pager").stdout  # the draft's load was observed


def test_spectrace_env_with_no_known_model_says_so_once(tmp_path: Path) -> None:
    out = _run(tmp_path, PLAIN)
    text = _view(out, "--no-pager").stdout
    assert text.count("saw no model it knows") == 1


def test_trace_inside_spectrace_env_hooks_each_model_once(tmp_path: Path) -> None:
    out = _run(tmp_path, BOTH)
    calls_per_file = {p.name: sum('"type":"call"' in line for line in p.read_text().splitlines()) for p in out.glob("*.jsonl")}
    # trace() holds the pair: its file has the calls; the process's own has none of them.
    assert sorted(calls_per_file.values())[0] == 0 and max(calls_per_file.values()) > 0, calls_per_file
    # Two files, one process: the view says one process, not "2 processes vm:1104, vm:1104".
    header = _view(out, "--no-pager").stdout
    assert "1 process " in header and "(2 trace files)" in header, header

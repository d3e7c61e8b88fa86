"""``spectrace demo`` as users run it (``python -m spectrace demo`` in a child process): the JSON
and the screen at 80 columns, with its progress on stderr. The scenarios' findings themselves are
tested in tests/eagle3/test_demo.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_command_one_scenario(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "demo", "--bug", "fc_bypass", "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (row,) = data["scenarios"]
    assert row["name"] == "fc_bypass" and row["accept_length"] < 1.5
    assert "fc_bypass" in {f["code"] for f in row["findings"]}


@pytest.mark.slow
def test_demo_screen_says_what_is_wrong_the_fix_and_the_trace_with_progress_on_stderr(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "demo", "--bug", "healthy", "--bug", "fc_bypass", "--out", "spectrace-demo"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "COLUMNS": "80"},
        cwd=tmp_path,  # as a user runs it: traces under ./spectrace-demo
    )
    assert out.returncode == 0, out.stderr
    progress = out.stderr.splitlines()
    assert progress[0].startswith("[1/2] healthy ... accept ") and progress[1].startswith("[2/2] fc_bypass ... accept ")
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    healthy = next(line for line in lines if line.startswith("healthy "))
    assert healthy.endswith("spectrace-demo/healthy  no findings")
    bypass = next(i for i, line in enumerate(lines) if line.startswith("fc_bypass "))
    assert lines[bypass].endswith("spectrace-demo/fc_bypass")  # where its trace is
    assert lines[bypass + 1].startswith("  aux_capture_disabled (+2 more): ")  # what is wrong, and how many follow
    assert lines[bypass + 2] == "  fix: set eagle_config.use_aux_hidden_state=true in the draft's config.json"
    assert "Read one: spectrace view spectrace-demo/<scenario>" in out.stdout
    assert "spectrace demo --details" in out.stdout

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
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # installed and on PATH
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


def _venv_not_activated(tmp_path):
    """A virtual environment's bin folder as ``bash scripts/demo.sh`` leaves it: its
    ``spectrace`` console script and ``activate`` beside it, the folder not on PATH."""
    from tests.helpers import paths

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "spectrace"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom spectrace.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(PATH="/usr/bin:/bin", PYTHONPATH=str(paths.ROOT), COLUMNS="200")
    return env


def test_the_command_to_run_next_is_one_this_shell_can_run(tmp_path):
    from spectrace.cli.invocation import invocation

    _venv_not_activated(tmp_path)
    script = str(tmp_path / "venv" / "bin" / "spectrace")
    how = invocation(argv0=script, path="/usr/bin:/bin")
    assert how.command == script and how.hint is not None
    assert "not on PATH" in how.hint and f"source {tmp_path}/venv/bin/activate" in how.hint
    # Activated (or installed on PATH): the plain name.
    assert invocation(argv0=script, path=f"{tmp_path}/venv/bin:/usr/bin").command == "spectrace"
    # python -m spectrace from an interpreter with no console script beside it.
    python = str(tmp_path / "python3")
    assert invocation(argv0="x/spectrace/__main__.py", executable=python, path="/usr/bin").command == f"{python} -m spectrace"
    # python -m spectrace from the venv's interpreter: its console script, by path.
    how = invocation(argv0="x/spectrace/__main__.py", executable=str(tmp_path / "venv" / "bin" / "python"), path="/usr/bin")
    assert how.command == script


@pytest.mark.slow
def test_demo_run_from_a_venv_not_on_path_prints_commands_that_work(tmp_path):
    # What `bash scripts/demo.sh` does: .venv/bin/spectrace demo, the venv not activated.
    env = _venv_not_activated(tmp_path)
    out = subprocess.run(
        ["venv/bin/spectrace", "demo", "--bug", "healthy", "--out", "d"], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "spectrace is not on PATH: run venv/bin/spectrace as below, or first: source venv/bin/activate" in out.stdout
    read = next(line for line in out.stdout.splitlines() if "Read one: " in line).split("Read one: ")[1]
    assert read == "venv/bin/spectrace view d/<scenario>"
    # The user's next step, as printed, runs.
    view = subprocess.run(
        read.replace("<scenario>", "healthy").split() + ["--no-pager"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert view.returncode == 0, view.stderr
    assert "spectrace  d/healthy" in view.stdout

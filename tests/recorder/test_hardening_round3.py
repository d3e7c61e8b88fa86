"""A trace that would grow without bound, processes that share a host name and pid, and a
module name that holds a newline.

Real processes only where the case is about one: a ``SPECTRACE=1`` child running the repo's
tiny Llama (traced by the bootstrap, no code of its own), two children in pid and host-name
namespaces of their own (``unshare``: each is pid 1 on host ``ctr``, as two containers are)
writing into one folder. RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import spectrace
from spectrace.records import Call
from spectrace.settings import DEFAULT_MAX_FILE_MB, Settings
from tests.helpers import paths

ROOT = paths.ROOT

# A server-like host: the tiny Llama, forwards for argv[1] seconds. SPECTRACE=1 traces it.
SOAK = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    import torch
    from tests.helpers.models import tiny_llama
    torch.manual_seed(0)
    model = tiny_llama()
    end, n = time.monotonic() + float(sys.argv[1]), 0
    with torch.no_grad():
        while time.monotonic() < end or n < 20:
            model(torch.tensor([[1, 2, 3 + n % 50]]))
            n += 1
    print("steps", n)
    """
).format(root=str(ROOT))


def _env(folder: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_"))}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(folder), SPECTRACE_FLUSH_SECONDS="0.1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_trace_file_stops_at_its_size_cap_and_says_what_it_dropped(tmp_path: Path) -> None:
    script = tmp_path / "soak.py"
    script.write_text(SOAK)
    folder = tmp_path / "t"
    run = subprocess.run(
        [sys.executable, str(script), "3"], env=_env(folder, SPECTRACE_MAX_FILE_MB="1"), capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (path,) = folder.glob("*.jsonl")
    size = path.stat().st_size
    records = _lines(path)
    counters = [r for r in records if r["type"] == "counters"][-1]
    dropped = counters["dropped_by_reason"].get("file size cap", 0)
    assert dropped > 0, counters  # 3 s of full tracing is more than 1 MB
    assert size <= (1 << 20) + (32 << 10), size  # per-step records stop at the cap; the few kept after it are small
    assert counters["records_dropped"] >= dropped
    assert any(r["type"] == "coverage" and "SPECTRACE_MAX_FILE_MB" in r["detail"] for r in records)
    assert records[0]["type"] == "header" and records[-1]["type"] == "counters"  # the closing record is still written
    assert sum(1 for line in run.stderr.splitlines() if "SPECTRACE_MAX_FILE_MB" in line) == 1  # said once
    view = subprocess.run([sys.executable, "-m", "spectrace", "view", str(folder)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert f"file size cap {dropped}" in view.stdout and "SPECTRACE_MAX_FILE_MB" in view.stdout, view.stdout[:2000]


def test_the_size_cap_setting_is_bounded_and_documented() -> None:
    assert Settings.from_env({}).max_file_mb == DEFAULT_MAX_FILE_MB == 1024
    assert Settings.from_env({"SPECTRACE_MAX_FILE_MB": "0"}).max_file_mb == 0  # no cap
    assert Settings.from_env({"SPECTRACE_MAX_FILE_MB": "lots"}).max_file_mb == DEFAULT_MAX_FILE_MB  # one warning, the default
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert "| `SPECTRACE_MAX_FILE_MB` | 1024 |" in doc


CONTAINER = "hostname ctr && exec {python} {script} 1"


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="pid and UTS namespaces need root and unshare")
def test_two_containers_sharing_a_trace_volume_are_told_apart(tmp_path: Path) -> None:
    script = tmp_path / "soak.py"
    script.write_text(SOAK)
    folder = tmp_path / "shared"
    argv = ["unshare", "--pid", "--fork", "--uts", "--mount-proc", "sh", "-c", CONTAINER.format(python=sys.executable, script=script)]
    procs = [subprocess.Popen(argv, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
    files = sorted(folder.glob("*.jsonl"))
    assert [f.name for f in files] == ["trace-ctr-1.2.jsonl", "trace-ctr-1.jsonl"]  # the same host name and pid
    headers = [_lines(f)[0] for f in files]
    assert {(h["host"], h["pid"]) for h in headers} == {("ctr", 1)}
    ids = {h["process_id"] for h in headers}
    assert len(ids) == 2 and all(len(i) == 8 for i in ids)
    view = subprocess.run([sys.executable, "-m", "spectrace", "view", str(folder)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    line = next(line for line in view.stdout.splitlines() if "2 processes" in line)
    assert all(f"ctr:1 (id {i})" in line for i in ids), line  # was "2 processes ctr:1, ctr:1"


def test_a_module_whose_name_holds_a_newline_is_traced(tmp_path: Path) -> None:
    model = torch.nn.Sequential()
    model.add_module("odd\nname", torch.nn.Linear(4, 4))
    model.add_module("plain", torch.nn.Linear(4, 4))
    with spectrace.trace(model, modules="**", directory=str(tmp_path)) as t, torch.no_grad():
        model(torch.randn(2, 4))
    traced = {r.module for r in t.recorder.records() if isinstance(r, Call)}
    assert {"odd\nname", "plain"} <= traced, traced  # "**" matches every name
    view = subprocess.run([sys.executable, "-m", "spectrace", "view", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert view.returncode == 0 and "odd\\nname" in view.stdout, view.stdout[-1500:]  # shown escaped, on one line

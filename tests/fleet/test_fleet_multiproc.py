"""spectrace's metrics on an engine's own /metrics under prometheus_client's multiprocess mode.

As SGLang 0.5.17 does with --enable-metrics: the server process sets PROMETHEUS_MULTIPROC_DIR,
spawns the process that runs the model (SPECTRACE=1 there), and serves /metrics from a
MultiProcessCollector over that folder. The spawned process's spectrace series appear there;
the control file's word ``metrics-off`` pauses the sink.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import paths

ROOT = paths.ROOT
MEMBER = paths.SCRIPTS / "fleet_member.py"


def _collect(folder: Path) -> str:
    code = (
        "from prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
        "import sys; sys.stdout.write(generate_latest(r).decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60).stdout


def _member(scenario: str, folder: Path, traces: Path, control: Path | None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(traces), PROMETHEUS_MULTIPROC_DIR=str(folder), PYTHONPATH=str(ROOT))
    if control is not None:
        env["SPECTRACE_CONTROL"] = str(control)
    proc = subprocess.run(
        [sys.executable, str(MEMBER), scenario, str(traces)], env=env, input="", capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "ready" in proc.stdout, proc.stderr[-2000:]


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_spawned_process_series_reach_the_collecting_process(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    folder = tmp_path / "prom"
    folder.mkdir()
    _member("fc_bypass", folder, tmp_path / "traces", None)
    text = _collect(folder)
    assert _value(text, "spectrace_info") == 1
    assert _value(text, "spectrace_findings_total", code="fc_bypass", severity="error") >= 1
    assert _value(text, "spectrace_root_cause", code="aux_capture_disabled") == 1  # the capture explains the bypass
    assert _value(text, "spectrace_verify_steps_total") > 0
    assert _value(text, "spectrace_accept_length_count") >= _value(text, "spectrace_verify_steps_total")


def test_control_word_pauses_the_sink_but_not_the_trace(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    folder = tmp_path / "prom"
    folder.mkdir()
    control = tmp_path / "ctl"
    control.write_text("metrics-off\n")
    _member("fc_bypass", folder, tmp_path / "traces", control)
    text = _collect(folder)
    assert _value(text, "spectrace_info") == 1  # the header still counts: the process is seen
    assert _value(text, "spectrace_accept_length_count") == 0
    assert _value(text, "spectrace_findings_total") == 0
    trace = "".join(f.read_text() for f in (tmp_path / "traces").glob("*.jsonl"))
    assert '"type":"acceptance"' in trace and '"code":"fc_bypass"' in trace

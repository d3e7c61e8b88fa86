"""A real Prometheus scrapes traced processes; ``spectrace fleet`` says which reports what.

Debian's ``prometheus`` package (``.ci/run`` installs it) is started on 127.0.0.1 with a
scrape config of the test's own and a one-second interval. It scrapes two processes running
the reference EAGLE-3 pipeline with ``SPECTRACE_METRICS_PORT`` (tests/scripts/fleet_member.py):
one healthy, one with the fc bypassed (aux capture off), and one port where nothing
listens (an instance that is down). The metrics sink is also checked on its own, on the
records of the healthy and the bypassed pipeline.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spectrace.settings import Settings
from tests.helpers import paths

ROOT = paths.ROOT
MEMBER = paths.SCRIPTS / "fleet_member.py"
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _wait(what: str, ok, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_", "PROMETHEUS_MULTIPROC"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_metrics_port_setting() -> None:
    assert Settings.from_env({}).metrics_port == 0
    s = Settings.from_env({"SPECTRACE_METRICS_PORT": "9400"})
    assert (s.metrics_port, s.metrics_address) == (9400, "127.0.0.1")
    s = Settings.from_env({"SPECTRACE_METRICS_PORT": "0.0.0.0:9401"})
    assert (s.metrics_port, s.metrics_address) == (9401, "0.0.0.0")
    assert Settings.from_env({"SPECTRACE_METRICS_PORT": "http"}).metrics_port == 0  # one warning, off


def test_sink_counts_roots_acceptance_and_stages() -> None:
    """The sink on a recorder's own lines: the capture is the root, the bypass follows it."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import REGISTRY

    from spectrace.records import Acceptance, Call, Finding, Header, TensorMeta, TensorStats
    from spectrace.rules.catalogue import finding
    from spectrace.sinks.prometheus import MetricsSink

    sink = MetricsSink()
    rank = "77"  # a rank of its own: the registry is the process's
    lines = [
        Header(spectrace_version="t", pid=1, host="h", rank=77, started_unix=0.0),
        Call(
            step=0,
            seq=0,
            module="draft.model.fc",
            module_type="Linear",
            role="draft.fc",
            inputs=[TensorMeta(arg="input[0]", shape=[3, 64], dtype="float32", device="cpu")],
            outputs=[TensorMeta(arg="output", shape=[3, 64], dtype="float32", device="cpu", stats=TensorStats(std=0.5))],
        ),
        Acceptance(step=0, accept_lengths=[1, 3], draft_tokens=4, accepted_per_position=[1, 1, 0, 0]),
    ]
    sink.write([r.model_dump_json() for r in lines])
    fc: Finding = finding("fc_bypass", "64-wide", evidence={"seen_width": 64})
    sink.write([fc.model_dump_json()])
    value = REGISTRY.get_sample_value
    assert value("spectrace_root_cause", {"code": "fc_bypass", "severity": "error", "rank": rank}) == 1
    aux = finding("aux_capture_disabled", "off", evidence={"enabled": False})
    sink.write([aux.model_dump_json()])
    assert value("spectrace_root_cause", {"code": "fc_bypass", "severity": "error", "rank": rank}) == 0
    assert value("spectrace_root_cause", {"code": "aux_capture_disabled", "severity": "error", "rank": rank}) == 1
    assert value("spectrace_findings_total", {"code": "fc_bypass", "severity": "error", "rank": rank}) == 1
    assert value("spectrace_accept_length_sum", {"sampling": "unknown", "rank": rank}) == 4
    assert value("spectrace_draft_position_accepted_total", {"position": "1", "sampling": "unknown", "rank": rank}) == 1
    assert value("spectrace_draft_position_proposed_total", {"position": "3", "sampling": "unknown", "rank": rank}) == 2
    assert value("spectrace_stage_input_width", {"stage": "draft.fc", "rank": rank}) == 64
    assert value("spectrace_stage_output_std", {"stage": "draft.fc", "rank": rank}) == 0.5
    # Greedy and sampled requests in one step, as the engine says per request.
    mixed = Acceptance(step=1, accept_lengths=[4, 2, 1], draft_tokens=4, accepted_per_position=[2, 1, 1, 0])
    line = json.loads(mixed.model_dump_json()) | {"greedy": [True, False, False]}
    sink.write([json.dumps(line)])
    assert value("spectrace_accept_length_sum", {"sampling": "greedy", "rank": rank}) == 4
    assert value("spectrace_accept_length_count", {"sampling": "sampled", "rank": rank}) == 2
    assert value("spectrace_draft_position_accepted_total", {"position": "2", "sampling": "greedy", "rank": rank}) == 1
    assert value("spectrace_draft_position_accepted_total", {"position": "0", "sampling": "sampled", "rank": rank}) == 1
    assert value("spectrace_draft_position_proposed_total", {"position": "0", "sampling": "sampled", "rank": rank}) == 2
    assert value("spectrace_verify_steps_total", {"rank": rank}) == 2


@pytest.fixture()
def prometheus(tmp_path: Path):
    """Start Prometheus on 127.0.0.1 over the targets the test names; yields (url, start)."""
    if PROMETHEUS is None:
        pytest.skip("Debian's prometheus server is not installed (apt-get install -y prometheus; .ci/run installs it)")
    procs: list[subprocess.Popen] = []

    def start(targets: list[str]) -> str:
        port = _port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: spectrace\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
        )
        log = open(tmp_path / "prometheus.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}"
        _wait("prometheus to be ready", lambda: "Ready" in _get(url + "/-/ready"), 60)
        return url

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.slow
def test_fleet_over_a_real_prometheus(prometheus, tmp_path: Path) -> None:
    ports = {"healthy": _port(), "fc_bypass": _port()}
    down = _port()  # nothing listens here: an instance that is down
    members = []
    try:
        for name, port in ports.items():
            members.append(
                subprocess.Popen(
                    [sys.executable, str(MEMBER), name, str(tmp_path / name)],
                    env=_env(SPECTRACE_METRICS_PORT=str(port)),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for m in members:
            assert m.stdout is not None
            assert m.stdout.readline().strip() == "ready", "a traced member did not finish its run"
        url = prometheus([f"127.0.0.1:{p}" for p in ports.values()] + [f"127.0.0.1:{down}"])

        def scraped() -> bool:
            body = json.loads(_get(url + "/api/v1/query?query=count(spectrace_info)%20and%20count(up%3D%3D0)"))
            return bool(body["data"]["result"]) and float(body["data"]["result"][0]["value"][1]) == 2

        _wait("two traced targets and one down", scraped, 60)
        cmd = [sys.executable, "-m", "spectrace", "fleet", "--prometheus", url]
        out = subprocess.run([*cmd, "--json"], env=_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        fleet = json.loads(out.stdout)
        by = {i["instance"]: i for i in fleet["instances"]}
        bad, good = by[f"127.0.0.1:{ports['fc_bypass']}"], by[f"127.0.0.1:{ports['healthy']}"]
        roots = {c["code"]: c for c in bad["findings"] if c["root"]}
        # The bypass is seen and explained: capture off is the root, the fc bypass follows.
        assert roots and all(c["severity"] == "error" for c in roots.values())
        assert "aux_capture_disabled" in roots
        assert any(c["code"] == "fc_bypass" for c in bad["findings"])
        assert good["traced"] and good["findings"] == []
        assert good["accept_length"] > bad["accept_length"] >= 1
        assert fleet["silent"] == [f"127.0.0.1:{down}"]
        screen = subprocess.run([*cmd, "--fail-on", "error"], env=_env(), capture_output=True, text=True, timeout=60)
        assert screen.returncode == 1, screen.stderr
        first = screen.stdout.splitlines()[3]
        assert first.startswith("ERROR") and "aux_capture_disabled" in first and str(ports["fc_bypass"]) in first
        assert "reports nothing (down)" in screen.stdout
    finally:
        for m in members:
            if m.stdin:
                m.stdin.close()
            try:
                m.wait(timeout=20)
            except subprocess.TimeoutExpired:
                m.kill()


def test_fleet_says_when_prometheus_cannot_be_asked() -> None:
    from spectrace.cli.fleet import main

    assert main(["--prometheus", f"http://127.0.0.1:{_port()}"]) == 2


def test_dashboard_and_docs_name_only_metrics_the_sink_makes() -> None:
    """The Grafana example and docs/fleet.md ask for series that exist."""
    import re

    pytest.importorskip("prometheus_client")
    from spectrace.sinks.prometheus import metrics

    made: set[str] = set()
    for metric in metrics().values():
        for family in metric.describe():
            made.add(family.name)
            made.update({family.name + s for s in ("_total", "_sum", "_count", "_bucket")})
    dashboard = json.loads((ROOT / "examples" / "grafana-spectrace-fleet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {n for e in exprs for n in re.findall(r"spectrace_[a-z_]+", e)}
    named |= set(re.findall(r"`(spectrace_[a-z_]+)", (ROOT / "docs" / "fleet.md").read_text()))
    assert named and named <= made, sorted(named - made)

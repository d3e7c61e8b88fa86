"""``spectrace view``, ``--json`` and ``diff`` against hostile files beside a trace and findings
nested past any stack: a result, never an internal error.

Real trace files as the writer writes them (tests/helpers/traces.py) and real subprocesses of
``python -m spectrace``. RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.records import Finding
from tests.helpers import paths
from tests.helpers.traces import fc_bypass_records, write_trace

TRACE = "trace-h-1.jsonl"


def _spectrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectrace", *args], capture_output=True, text=True, timeout=120, cwd=paths.ROOT)


def _clean(run: subprocess.CompletedProcess[str]) -> None:
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr


HOSTILE_RESULTS = {
    "causes_int": {"agree": False, "first_divergence": "fc", "causes": 7, "modules": "fc"},
    "modules_strings": {"agree": False, "first_divergence": "fc", "modules": ["fc", 3, None], "causes": [1, "x"], "served": {"a": 1}},
    "numbers_as_text": {"agree": False, "first_divergence": "fc", "modules": [{"module": "fc", "max_error": "big", "tolerance": [1]}]},
    "bomb": None,  # 100 KB of "[": nested past the parser's stack
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RESULTS))
def test_a_hostile_replay_result_beside_a_trace_breaks_neither_view_nor_diff(tmp_path: Path, case: str) -> None:
    trace = write_trace(tmp_path / "a" / TRACE, fc_bypass_records())
    other = write_trace(tmp_path / "b" / TRACE, fc_bypass_records())
    beside = trace.with_name("trace-h-1.replay.json")
    raw = HOSTILE_RESULTS[case]
    beside.write_text("[" * 100_000 if raw is None else json.dumps(raw))
    for args in (("view", str(trace)), ("view", str(trace), "--json"), ("diff", str(other), str(trace))):
        run = _spectrace(*args)
        _clean(run)
        assert run.returncode in (0, 1), (args, run.returncode, run.stderr)
    shown = json.loads(_spectrace("view", str(trace), "--json").stdout)
    replay = [f for f in shown["findings"] if f["code"] == "replay_divergence"]
    assert len(replay) == (0 if raw is None else 1)  # a result that parses still says its divergence


def test_evidence_nested_900_deep_is_shown_cut(tmp_path: Path) -> None:
    records = fc_bypass_records()
    deep: object = "bottom"
    for _ in range(900):
        deep = [deep]
    trace = write_trace(tmp_path / TRACE, records)
    finding = Finding(code="fc_bypass", severity="error", message="deep evidence", module="fc", fix="x").model_dump(mode="json")
    finding["evidence"] = {"deep": deep}
    with open(trace, "a") as fh:
        fh.write(json.dumps(finding) + "\n")  # valid to the schema: only its depth is hostile
    for args in (("view", str(trace)), ("view", str(trace), "--json"), ("diff", str(trace), str(trace))):
        run = _spectrace(*args)
        _clean(run)
        assert run.returncode in (0, 1), (args, run.returncode, run.stderr[-400:])
        if args[0] == "view":
            assert "nested more than 32 deep" in run.stderr  # skipped, counted and said with its line

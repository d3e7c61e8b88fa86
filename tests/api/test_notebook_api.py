"""`spectrace.load(path)`: a written trace from Python, as the viewer's own model.

Traces are written by the recorder: the demo's scenarios through the reference pipeline,
and a small torch model traced with `spectrace.trace(..., directory=...)`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import spectrace
from spectrace.notebook import ROW_COLUMNS, LoadedTrace
from spectrace.settings import Settings
from spectrace.viewers.loader import TraceSet, load_traces
from spectrace.viewers.model import TraceView, build_view
from tests.helpers import paths

REPO = paths.ROOT
HOSTILE = "fc\x1b]52;c;ZWNobw==\x07<script>alert(1)</script>"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_cache):
    out = tmp_path_factory.mktemp("notebook")
    for name in ("healthy", "fc_bypass"):
        demo_cache.run(name, out)
    return out


def test_load_returns_the_viewers_model(demo):
    t = spectrace.load(demo / "fc_bypass")
    assert isinstance(t, LoadedTrace) and isinstance(t.traces, TraceSet) and isinstance(t.view, TraceView)
    assert t.view == build_view(load_traces(demo / "fc_bypass"))  # what `spectrace view` shows
    assert [f.code for f in t.findings][:2] == ["aux_capture_disabled", "fc_bypass"]
    assert t.datapath.fc.status == "bypassed" and t.acceptance.overall_mean is not None
    assert t.acceptance.overall_mean < 1.5
    assert spectrace.load is __import__("spectrace.notebook", fromlist=["load"]).load


def test_summary_puts_findings_first_then_the_data_path(demo):
    t = spectrace.load(demo / "fc_bypass")
    text = t.summary(width=80)
    assert repr(t) == str(t) == t.summary()
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert len(lines) <= 25
    findings = lines.index("Findings: 1 root cause, 2 consequences (3 codes, 2 errors)")
    path = lines.index("Data path")
    accept = next(i for i, line in enumerate(lines) if line.startswith("Acceptance: mean accept length 1.0"))
    assert findings < path < accept
    # Draft positions are numbered as the view numbers them ("pos 1" is the first draft token).
    wide = next(line for line in t.summary(width=200).splitlines() if line.startswith("Acceptance: "))
    assert "; accepted at draft position 1:" in wide and " 0:" not in wide, wide
    # The root cause with its one fix, then what follows from it (no fix of their own).
    block = [line.split() for line in lines[findings + 1 : path]]
    assert block[0][:2] == ["ERROR", "aux_capture_disabled"] and block[1][:1] == ["fix"]
    assert [b[:2] for b in block[2:]] == [["then", "fc_bypass:"], ["then", "acceptance_collapse:"]]
    assert any(line.split()[:2] == ["fc", "bypassed"] for line in lines[path:accept])
    assert any(line.split()[:4] == ["capture", "target:", "enabled", "False,"] for line in lines[path:accept])

    healthy = spectrace.load(demo / "healthy").summary(width=80).splitlines()
    assert "Findings: none" in healthy
    assert any(line.split()[:2] == ["fc", "called"] for line in healthy)


def test_rows_one_per_call_and_tensor(demo):
    t = spectrace.load(demo / "healthy")
    rows = t.rows()
    calls = t.calls()
    assert len(rows) == sum(len(c.inputs) + len(c.outputs) for c in calls) > 0
    assert all(tuple(r) == ROW_COLUMNS for r in rows)
    fc = t.rows("fc")
    assert fc and {r["module"] for r in fc} == {"draft.model.fc"} and {r["role"] for r in fc} == {"draft.fc"}
    first = next(c for c in calls if c.module == "draft.model.fc")
    mine = [r for r in fc if r["call"] == first.seq]
    assert [(r["direction"], r["arg"], r["shape"]) for r in mine] == [("input", m.arg, tuple(m.shape)) for m in first.inputs] + [
        ("output", m.arg, tuple(m.shape)) for m in first.outputs
    ]
    assert mine[0]["shape"][-1] == 192 and mine[-1]["shape"][-1] == 64  # 3 x hidden in, hidden out
    out = first.outputs[0]
    assert out.stats is not None
    assert (mine[-1]["mean"], mine[-1]["std"], mine[-1]["absmax"], mine[-1]["dtype"]) == (
        out.stats.mean,
        out.stats.std,
        out.stats.absmax,
        out.dtype,
    )
    assert mine[-1]["step"] == first.step


def test_to_pandas(demo):
    pd = pytest.importorskip("pandas")
    t = spectrace.load(demo / "healthy")
    df = t.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == list(ROW_COLUMNS) and len(df) == len(t.rows())


@pytest.mark.skipif(importlib.util.find_spec("pandas") is not None, reason="pandas is installed")
def test_to_pandas_without_pandas_says_so_in_one_line(demo):
    with pytest.raises(ImportError) as info:
        spectrace.load(demo / "healthy").to_pandas()
    assert "pip install pandas" in str(info.value) and "\n" not in str(info.value) and ".rows()" in str(info.value)


def test_findings_with_hostile_text_are_escaped(tmp_path):
    """A finding's message names the module: it reaches both the summary and the HTML."""
    folder = tmp_path / "nan"
    model = nn.Sequential()
    model.add_module(HOSTILE, nn.Linear(4, 4))
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    with spectrace.trace(model, modules=["*"], directory=str(folder), settings=Settings(quiet=True)) as tr:
        model(torch.randn(2, 4))
        tr.detect()
    t = spectrace.load(folder)
    assert any(c.module == HOSTILE for c in t.calls())  # the name as written, in the data
    assert t.findings and any(HOSTILE in f.message for f in t.findings)
    page = t._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    text = t.summary(width=200)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]52;c;" in text


def test_problems_are_warned_once_and_shown(demo, tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    src = next((demo / "healthy").glob("trace-*.jsonl"))
    data = src.read_bytes()
    (folder / src.name).write_bytes(data + b'{"type": "call", "step": 99, "se')
    with pytest.warns(UserWarning, match="last line is truncated") as caught:
        t = spectrace.load(folder)
    assert len(caught) == 1
    assert t.problems and any(line.startswith("! ") and "truncated" in line for line in t.summary(width=120).splitlines())


def test_nothing_readable_raises_one_line(tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        spectrace.load(tmp_path / "nope")
    assert "\n" not in str(missing.value)
    (tmp_path / "notes.jsonl").write_text("hello\n")
    with pytest.raises(ValueError) as junk:
        spectrace.load(tmp_path / "notes.jsonl")
    assert "\n" not in str(junk.value)


def test_diff_from_python(demo):
    result = spectrace.load(demo / "healthy").diff(spectrace.load(demo / "fc_bypass"))
    assert result.differences[0].where == "draft.model.fc" and result.differences[0].detail.startswith("called in A only")


def test_load_imports_no_torch(demo):
    code = f"import spectrace, sys; t = spectrace.load({str(demo / 'fc_bypass')!r}); t.summary(); t.rows(); print('torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "SPECTRACE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_documented_summary_is_what_load_prints(demo):
    t = spectrace.load(demo / "fc_bypass")
    t.traces.source = "spectrace-demo/fc_bypass"
    text = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```text\n(.*?)```", text, flags=re.S) if b.startswith("spectrace trace "))
    assert t.summary(width=100) + "\n" == block

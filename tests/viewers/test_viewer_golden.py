"""Golden snapshots of the plain-text viewer (80 columns, no colour) against tests/golden/*.txt.

Regenerate after an intended change with:

    SPECTRACE_UPDATE_GOLDEN=1 python -m pytest tests/viewers/test_viewer_golden.py

then read the diff of tests/golden/ before keeping it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from spectrace.viewers.diff import diff_traces, render_diff
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import ViewFilter, build_view
from spectrace.viewers.render import make_console, render_view
from tests.helpers import paths
from tests.helpers.traces import fc_bypass_records, healthy_records, layer_mismatch_records, write_trace

GOLDEN = paths.GOLDEN
UPDATE = os.environ.get("SPECTRACE_UPDATE_GOLDEN") == "1"


def plain(renderable: object) -> str:
    buf = io.StringIO()
    make_console(buf, width=80, plain=True).print(renderable)
    # Trailing blanks are table padding, invisible on a terminal; keep the files clean.
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path} does not exist; run with SPECTRACE_UPDATE_GOLDEN=1 to create it")
        path.write_text(text)
        return
    assert text == path.read_text(), f"{name}: rendering changed; SPECTRACE_UPDATE_GOLDEN=1 regenerates tests/golden/"


def _view(tmp_path: Path, records: list[object], *, modules: bool = False, flt: ViewFilter | None = None, tail: bytes = b"") -> str:
    path = write_trace(tmp_path / "run" / "trace-node1-4242-rank0.jsonl", records)
    if tail:
        with open(path, "ab") as fh:
            fh.write(tail)
    view = build_view(load_traces(tmp_path / "run"), flt)
    view.header.source = "run"  # tmp_path differs per test run
    return plain(render_view(view, modules=modules))


CASES: dict[str, Callable[[Path], str]] = {
    "view_healthy": lambda p: _view(p, healthy_records(), modules=True),
    "view_fc_bypass": lambda p: _view(p, fc_bypass_records()),
    "view_layer_mismatch": lambda p: _view(p, layer_mismatch_records()),
    "view_fc_bypass_filtered": lambda p: _view(p, fc_bypass_records(), flt=ViewFilter(finding="fc_bypass", step_min=4, step_max=8)),
    "view_partial_input": lambda p: _view(p, healthy_records(steps=3), tail=b'{"type": "mystery"}\n{"type": "call", "st'),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_view(name: str, tmp_path: Path) -> None:
    text = CASES[name](tmp_path)
    assert max(len(line) for line in text.splitlines()) <= 80
    check(name, text)


def test_golden_diff(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "healthy" / "trace-node1-1-rank0.jsonl", healthy_records()).parent
    b = write_trace(tmp_path / "bug3" / "trace-node1-2-rank0.jsonl", layer_mismatch_records()).parent
    result = diff_traces(load_traces(a), load_traces(b), rtol=0.25)
    result.a, result.b = "healthy", "bug3"
    check("diff_healthy_vs_layer_mismatch", plain(render_diff(result)))

"""Golden snapshots of the viewer over traces the hooks really wrote: the demo's healthy,
fc-bypass and layer-capture scenarios, run through the reference pipeline with tracing on.

Only what differs between runs is pinned (host, pid, file name, times); every finding,
stage, shape and statistic comes from the trace as written. Regenerate after an intended
change with ``SPECTRACE_UPDATE_GOLDEN=1 python -m pytest tests/viewers/test_viewer_golden_real.py``
and read the diff of tests/golden/ before keeping it.
"""

from __future__ import annotations

import pytest

from spectrace.viewers.diff import diff_traces, render_diff
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import TraceView, build_view
from spectrace.viewers.render import render_view
from tests.viewers.test_viewer_golden import check, plain

SCENARIOS = ("healthy", "fc_bypass", "embedding_vs_layer")


@pytest.fixture(scope="module")
def traces(tmp_path_factory, demo_cache):
    out = tmp_path_factory.mktemp("real")
    for name in SCENARIOS:
        demo_cache.run(name, out)
    return out


def _pinned(view: TraceView, name: str) -> TraceView:
    view.header.source = name
    view.header.started = None
    view.header.span_s = None
    for p in view.header.processes:
        p.host, p.pid, p.file, p.last_record = "host", 1, "trace.jsonl", None
    return view


@pytest.mark.parametrize("name", SCENARIOS)
def test_view_of_a_real_trace(traces, name):
    ts = load_traces(str(traces / name))
    assert ts.files and all(f.counters for f in ts.files)  # written by the hooks, closed
    view = _pinned(build_view(ts), name)
    check(f"real_view_{name}", plain(render_view(view, modules=True)))


def test_diff_of_real_traces_healthy_vs_layer_capture(traces):
    result = diff_traces(load_traces(str(traces / "healthy")), load_traces(str(traces / "embedding_vs_layer")))
    result.a, result.b = "healthy", "embedding_vs_layer"
    assert result.differences  # the capture and the fingerprint differ
    check("real_diff_healthy_vs_embedding_vs_layer", plain(render_diff(result)))

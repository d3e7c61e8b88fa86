"""One recorder API, one sink protocol (spectrace/sinks/base.py, spectrace/recorder.py).

Sinks here are real classes of the protocol writing to lists; the JSONL file is read
back with the viewer's loader; OTLP goes to the real receiver in tests/otlp_receiver.py.
Nothing of torch or of the OpenTelemetry SDK is mocked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import spectrace
from spectrace import api
from spectrace.cli.view import main as view_main
from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Call, Capture, Counters, Finding, Header
from spectrace.rules.catalogue import finding
from spectrace.settings import Settings
from spectrace.sinks.base import Sink, Step
from spectrace.sinks.jsonl import JsonlSink
from spectrace.sinks.otel import OtelSink
from spectrace.viewers.loader import load_traces
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


class ListSink:
    """A sink of the protocol that keeps what it is handed."""

    def __init__(self, needs_objects: bool = True) -> None:
        self.needs_objects = needs_objects
        self.got: list[Any] = []
        self.flushes: list[float] = []
        self.shutdowns = 0

    def write(self, records: Sequence[Any]) -> None:
        self.got.extend(records)

    def flush(self, timeout_s: float = 1.0) -> bool:
        self.flushes.append(timeout_s)
        return True

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        self.shutdowns += 1
        return True


class BrokenSink(ListSink):
    def write(self, records: Sequence[Any]) -> None:
        raise RuntimeError("sink is down")


def _quiet(**kw: Any) -> Settings:
    return Settings(quiet=True, **kw)


def _capture() -> Capture:
    return Capture(module="target", requested_ids=[0, 1, 2], boundaries=[1, 2, 3], num_layers=4, hidden_size=64, rule="sglang_llama")


def _acceptance(step: int) -> Acceptance:
    return Acceptance(step=step, accept_lengths=[2], draft_tokens=3, accepted_per_position=[1, 0, 0])


def _types(path: Path) -> list[str]:
    return [json.loads(line)["type"] for line in path.read_text().splitlines()] if path.exists() else []


def _stats(path: Path) -> dict[str, Any]:
    (stats,) = [json.loads(line) for line in path.read_text().splitlines() if '"type":"counters"' in line]
    return stats


# ------------------------------------------------------------------------ the protocol
def test_shipped_sinks_implement_the_protocol(tmp_path: Path) -> None:
    assert isinstance(ListSink(), Sink) and isinstance(JsonlSink(str(tmp_path), "t.jsonl"), Sink)
    assert JsonlSink.needs_objects is False and OtelSink.needs_objects is True
    with pytest.raises(TypeError, match="not a spectrace Sink"):
        Recorder(_quiet(), sinks=[object()])


def test_an_object_sink_gets_the_header_the_records_the_stats_and_one_shutdown() -> None:
    sink = ListSink()
    rec = Recorder(_quiet(), sinks=[sink])
    assert rec.sinks == (sink,) and rec.needs_call_objects
    found = finding("fc_bypass", "64-wide input, fc expects 192")
    rec.emit(found)
    calls = [Call(step=0, seq=i, module=f"m{i}", module_type="Linear") for i in range(3)]
    rec.emit_step(0, calls, 10, 20)
    rec.emit(_acceptance(0))
    rec.close()
    rec.close()
    header, got_finding, step, acceptance, stats = sink.got
    assert isinstance(header, Header) and header is rec.header
    assert isinstance(got_finding, Finding) and got_finding.code == "fc_bypass" and got_finding.t_unix is not None
    assert isinstance(step, Step) and (step.step, step.start_ns, step.end_ns) == (0, 10, 20) and list(step.calls) == calls
    assert isinstance(acceptance, Acceptance) and isinstance(stats, Counters) and stats.steps == 1
    assert sink.shutdowns == 1


def test_a_line_sink_gets_json_lines_header_first(tmp_path: Path) -> None:
    lines = ListSink(needs_objects=False)
    rec = Recorder(_quiet(flush_seconds=3600), sinks=[lines])
    assert not rec.needs_call_objects
    rec.emit(_capture())
    rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1)
    rec.close()
    assert all(isinstance(line, str) for line in lines.got)
    assert [json.loads(line)["type"] for line in lines.got] == ["header", "capture", "call", "counters"]
    assert json.loads(lines.got[-1])["records_written"] == 2 and lines.shutdowns == 1  # the trace: no file, so this sink


def test_a_traced_model_builds_call_objects_only_for_an_object_sink(monkeypatch) -> None:
    """The engine reads needs_call_objects: an object sink gets one Step per forward with
    the real Call objects; the in-memory trace is the same either way."""
    sink = ListSink()
    monkeypatch.setattr(api, "make_otel_sink", lambda settings, err, rank=None: sink)
    model = tiny_llama(layers=2, hidden=32)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), spectrace.trace(model) as t:
        model(ids)
        model(ids)
    steps = [r for r in sink.got if isinstance(r, Step)]
    assert isinstance(sink.got[0], Header) and isinstance(sink.got[-1], Counters)
    assert len(steps) == 2 and all(isinstance(c, Call) for s in steps for c in s.calls)
    assert sorted(c.seq for s in steps for c in s.calls) == [c.seq for c in t.calls()]


def test_a_failing_sink_is_counted_and_warned_once_and_the_file_is_whole(tmp_path: Path, capfd) -> None:
    broken, broken_lines = BrokenSink(), BrokenSink(needs_objects=False)
    rec = Recorder(Settings(flush_seconds=3600), directory=str(tmp_path), name="t.jsonl", sinks=[broken, broken_lines])
    for step in range(3):
        rec.emit(_capture())
        rec.emit(_acceptance(step))
    rec.close()
    assert rec.counters.sink_errors >= 6
    err = capfd.readouterr().err
    assert len([ln for ln in err.splitlines() if "sink error" in ln and "BrokenSink: RuntimeError: sink is down" in ln]) == 1, err
    # The trace file has every record, a capture taking the acceptance before it along;
    # the other line sink lost its batches: sink errors, not drops from the trace.
    assert _types(tmp_path / "t.jsonl") == ["header", *["capture", "acceptance"] * 3, "counters"]
    assert rec.counters.records_dropped == 0 and _stats(tmp_path / "t.jsonl")["records_written"] == 6


def test_a_trace_file_that_cannot_be_written_counts_its_batches_as_dropped(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")  # the trace folder would be inside a file: even root cannot
    lines = ListSink(needs_objects=False)
    rec = Recorder(_quiet(flush_seconds=3600), directory=str(tmp_path / "a-file" / "traces"), sinks=[lines])
    rec.emit(_capture())
    rec.emit(_acceptance(0))
    rec.emit(_capture())
    assert rec.counters.records_dropped == 3 and rec.counters.sink_errors == 2
    rec.close()
    stats = json.loads(lines.got[-1])  # the line sink has the whole trace and says what the file lost
    assert [json.loads(line)["type"] for line in lines.got] == ["header", "capture", "acceptance", "capture", "counters"]
    assert stats["records_dropped"] == 3 and stats["dropped_by_reason"] == {"sink error": 3}


# ---------------------------------------------------------------- write-through, interval
def test_capture_is_on_disk_before_emit_returns_acceptance_only_after_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = ListSink(needs_objects=False)
    rec = Recorder(_quiet(flush_seconds=1.0), directory=str(tmp_path), name="t.jsonl", sinks=[lines])
    rec.emit(_capture())
    assert _types(path) == ["header", "capture"]  # written through, header first
    rec.emit(_acceptance(0))
    rec.emit(_acceptance(1))
    assert _types(path) == ["header", "capture"] and len(lines.got) == 2  # per-step: waits
    time.sleep(1.1)
    rec.emit(_acceptance(2))  # the interval has passed: the queue goes out, on the flush thread
    want = ["header", "capture", "acceptance", "acceptance", "acceptance"]
    deadline = time.monotonic() + 10
    # The file, then the line sink, in one flush on the flush thread: wait for both.
    while (_types(path) != want or len(lines.got) != len(want)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _types(path) == want
    assert [json.loads(line)["type"] for line in lines.got] == _types(path)
    rec.emit(_acceptance(3))
    rec.emit(finding("fc_bypass", "64-wide input, fc expects 192"))  # a finding takes the queue with it
    assert _types(path)[-2:] == ["acceptance", "finding"]
    rec.close()
    assert _types(path)[-1] == "counters"


class BlockingSink(ListSink):
    """A line sink whose writes wait until released (a stuck disk or collector)."""

    def __init__(self) -> None:
        super().__init__(needs_objects=False)
        self.release = threading.Event()
        self.writing = threading.Event()

    def write(self, records: Sequence[Any]) -> None:
        self.writing.set()
        self.release.wait(10)
        super().write(records)


def test_a_per_step_record_never_waits_for_a_write_in_progress(tmp_path: Path) -> None:
    # The host thread emits one acceptance record per verify step. A flush that is stuck
    # in a sink (here: until released) must not hold it: the write runs on the flush
    # thread, outside the lock that emit takes.
    stuck = BlockingSink()
    rec = Recorder(_quiet(flush_seconds=0.001), directory=str(tmp_path), name="t.jsonl", sinks=[stuck])
    time.sleep(0.01)
    rec.emit(_acceptance(0))  # due (the interval has passed): handed to the flush thread
    assert stuck.writing.wait(10)  # the flush thread is inside the sink now, and stays there
    start = time.monotonic()
    for step in range(1, 200):
        rec.emit(_acceptance(step))
    took = time.monotonic() - start
    assert not stuck.release.is_set() and took < 5  # 199 emits while the write was stuck
    stuck.release.set()
    rec.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "t.jsonl").read_text().splitlines() if '"acceptance"' in line]
    assert steps == list(range(200))  # nothing lost, in order
    assert [json.loads(x)["step"] for x in stuck.got if '"acceptance"' in x] == list(range(200))


def test_the_record_cap_bounds_the_queue_and_counts_what_it_drops(tmp_path: Path) -> None:
    rec = Recorder(_quiet(record_cap=5, flush_seconds=3600), directory=str(tmp_path), name="t.jsonl")
    for step in range(12):
        rec.emit(_acceptance(step))
    rec.close()
    kept = [json.loads(line)["step"] for line in (tmp_path / "t.jsonl").read_text().splitlines() if '"acceptance"' in line]
    assert kept == list(range(7, 12))
    stats = _stats(tmp_path / "t.jsonl")
    assert stats["records_dropped"] == 7 and stats["dropped_by_reason"] == {"record cap": 7}


def test_flush_with_a_timeout_asks_every_sink(tmp_path: Path) -> None:
    sink = ListSink()
    rec = Recorder(_quiet(), directory=str(tmp_path), name="t.jsonl", sinks=[sink])
    rec.emit(_capture())
    rec.flush()
    assert sink.flushes == []  # the periodic flush never waits on a sink
    rec.flush(timeout_s=2.5)
    assert sink.flushes == [2.5]
    rec.close()


# --------------------------------------------------------------------------- counters
def test_counters_change_through_the_recorder(tmp_path: Path, capsys) -> None:
    rec = Recorder(_quiet(), directory=str(tmp_path), name="trace-h-rank0.jsonl", rank=0)
    for step in range(4):
        rec.emit(_acceptance(step))
    rec.count("calls_seen")
    rec.count("calls_seen", 2)
    rec.count_dropped(5, "record worker stuck")
    rec.count_dropped(2, "record build")
    rec.count_dropped(0, "nothing")
    rec.account_hook(0.001, "acceptance")
    rec.account_hook(0.003, "acceptance")
    rec.account_hook(0.002, "graph_replay")
    rec.count("no_such_counter")  # a wrong name is counted as spectrace's own error, never raised
    rec.close()
    stats = _stats(tmp_path / "trace-h-rank0.jsonl")
    assert stats["calls_seen"] == 3 and stats["internal_errors"] == 1
    assert stats["records_dropped"] == 7 and stats["dropped_by_reason"] == {"record worker stuck": 5, "record build": 2}
    assert stats["hook_calls"] == 3 and stats["hook_seconds"] == pytest.approx(0.006)
    assert stats["hook_seconds_by_feature"] == pytest.approx({"acceptance": 0.004, "graph_replay": 0.002})
    assert view_main([str(tmp_path), "--no-pager"]) == 0
    assert "records dropped 7" in " ".join(capsys.readouterr().out.split())
    assert view_main([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["header"]["records_dropped"] == 7


# -------------------------------------------------------------------- say once, count
def _true_count(trace_file: Any, record: Any) -> int:
    """What a reader makes of a record said once: the stats record's once_counts."""
    key = record.once_key
    counts = trace_file.counters[-1].once_counts if trace_file.counters else {}
    return int(counts.get(key, 1)) if key else 1


def test_once_emits_the_first_time_and_the_file_gets_the_count(tmp_path: Path) -> None:
    rec = Recorder(_quiet(), directory=str(tmp_path), name="t.jsonl")
    made: list[int] = []

    def make() -> Finding:
        made.append(1)
        return finding("fc_bypass", "64-wide input, fc expects 192")

    assert rec.once("stale", make) is True
    assert [rec.once("stale", make) for _ in range(4)] == [False] * 4
    assert rec.once("nothing", lambda: None) is False and not rec.said("nothing")
    assert rec.said("stale") and made == [1]
    (kept,) = rec.findings()
    assert kept.evidence["occurrences"] == 5  # in memory it follows along
    for _ in range(3):
        rec.coverage("not_covered", "the thing")
    rec.close()
    (trace_file,) = load_traces(tmp_path).files
    (written,) = trace_file.findings
    assert written.once_key == "stale" and "occurrences" not in written.evidence  # the line said it once
    assert _true_count(trace_file, written) == 5
    (cov,) = [c for c in trace_file.coverage if c.kind == "not_covered"]
    assert _true_count(trace_file, cov) == 3
    stats = _stats(tmp_path / "t.jsonl")
    assert stats["once_counts"] == {"stale": 5, "coverage:not_covered:the thing": 3}
    # The viewer shows the true counts, not one per written line.
    from spectrace.viewers.model import build_view

    view = build_view(load_traces(tmp_path))
    assert [(g.code, g.count) for g in view.findings] == [("fc_bypass", 5)]
    assert any(gap.startswith("3 not covered: the thing") for gap in view.header.coverage_gaps)
    assert stats["coverage_counts"] == {"not_covered:the thing": 3}


def test_sglang_draft_extend_width_check_repeats_reach_the_file(tmp_path: Path) -> None:
    """The real SGLang runner class and spectrace's real check (state.emit_once) on a
    file-backed recorder: the finding is written once and its true count is in the file."""
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    from types import SimpleNamespace

    from tests.helpers import sglang_harness as sh

    sh.setup()
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    from spectrace.integrations.sglang import graphs as st_graphs
    from spectrace.integrations.sglang import state as st_state

    rec = Recorder(_quiet(), directory=str(tmp_path), name="t.jsonl")
    previous = st_state.STATE
    st_state.reset(rec)
    try:
        runner = object.__new__(EAGLEDraftExtendCudaGraphRunner)  # only its buffers are read
        runner.buffers = SimpleNamespace(hidden_states=torch.zeros(8, 3 * 64))
        bypassed = SimpleNamespace(spec_info=SimpleNamespace(hidden_states=torch.zeros(4, 64)))
        for _ in range(st_graphs.STALE_CHECK_FIRST + 2 * st_graphs.STALE_CHECK_EVERY - 1):
            st_graphs.before_draft_extend_execute(runner, bypassed, None)

        class DecodeCudaGraphRunner:  # stands in for a runner instance; only its name is read
            pass

        for _ in range(3):
            st_graphs.after_execute(None, DecodeCudaGraphRunner())
        assert "graph_stale_hidden" in st_state.STATE.once
        rec.close()
    finally:
        st_state.STATE = previous
    (trace_file,) = load_traces(tmp_path).files
    (written,) = trace_file.findings
    assert written.code == "fc_bypass" and written.once_key == "graph_stale_hidden"
    assert _true_count(trace_file, written) == st_graphs.STALE_CHECK_FIRST + 2  # every one of the first, then sampled
    (replay,) = [c for c in trace_file.coverage if c.kind == "graph_replay"]
    assert _true_count(trace_file, replay) == 3 and trace_file.counters[-1].graph_replay_steps == 3


# ------------------------------------------------------------------------------ OTLP
def test_otlp_sink_end_to_end_against_a_real_receiver(monkeypatch) -> None:
    from tests.helpers.otlp_receiver import OtlpReceiver, attributes

    model = tiny_llama(layers=2, hidden=32)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        with torch.no_grad():
            t = spectrace.trace(model, settings=Settings.from_env())
            (sink,) = t.recorder.sinks
            assert isinstance(sink, OtelSink) and isinstance(sink, Sink) and t.recorder.needs_call_objects
            model(ids)
            model(ids)
            t.emit(finding("fc_bypass", "64-wide input, fc expects 192"))
            t.recorder.flush(timeout_s=10)  # the protocol's flush: sent before close
            assert receiver.requests >= 1
            t.close()
        deadline = time.time() + 10
        while time.time() < deadline and not any(s.name == "spectrace.counters" for s in receiver.spans):
            time.sleep(0.05)
    names = [s.name for s in receiver.spans]
    assert names.count("spectrace.header") == 1 and names.count("spectrace.counters") == 1
    assert names.count("spectrace.step") == 2 and names.count("spectrace.finding") == 1
    modules = {attributes(s).get("spectrace.module") for s in receiver.spans if s.name.startswith("module ")}
    assert modules == {c.module for c in t.calls()}
    header = next(s for s in receiver.spans if s.name == "spectrace.header")
    assert json.loads(attributes(header)["spectrace.record"])["pid"] == t.recorder.header.pid
    assert t.recorder.counters.sink_errors == 0


def test_close_waits_for_a_drain_the_flush_thread_is_running(tmp_path):
    """A producer hands its batch to the flush thread (drain_soon) and marks it taken; a
    close meanwhile finds nothing left to drain, so it must wait for that drain to finish
    (the values capture writes its file there) before it returns."""
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path))
    started, done, taken = threading.Event(), [], []

    def drain() -> None:
        if taken:
            return  # already being written by the other drain
        taken.append(True)
        started.set()
        time.sleep(0.3)
        done.append(True)

    rec.add_drain(drain)
    rec.drain_soon()
    assert started.wait(5)
    rec.close()
    assert done == [True]

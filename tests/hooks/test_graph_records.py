"""From a graph's statistics table to call records, through the tracing engine (CPU).

A replay is emulated as in tests/hooks/test_graph_slots.py: the memset node, then each slot's
reduction reading the table's device-side row count, exactly as the captured kernels do.
The engine's worker turns the landed read-back into ``call`` records with the real rows.
"""

from __future__ import annotations

import torch

from spectrace import control
from spectrace.hooks import graph_slots as G
from spectrace.hooks.engine import GRAPH_DRAIN_EVERY, Tracer
from spectrace.recorder import Recorder
from spectrace.settings import Settings


def _replay(gs: G.GraphSlots, key, real_bs: int, tensors: list[torch.Tensor], context: dict) -> None:
    gs.before_replay(key, real_bs)
    table = gs.tables[key]
    table.rows.zero_()
    for slot, tensor in zip(table.slots, tensors):
        p = gs._prepare(tensor, None, None)
        gs._enqueue(table.rows, table.real_bs, slot.index, p, slot.rows_per_seq)
    gs.after_replay(key, context)


def test_a_read_back_becomes_call_records_of_the_real_rows():
    rec = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None)
    tracer = Tracer(rec)
    gs = G.GraphSlots("cpu", sample=1)
    tracer.graph_slots = gs
    key = ("backend", 8)
    hidden = torch.randn(8 * 4, 16, dtype=torch.float32)  # 8 requests x 4 verify tokens, padded
    logits = torch.randn(8 * 4, 32, dtype=torch.float32)
    gs.begin_capture(key, capture_bs=8, label="DecodeCudaGraphRunner[8]")
    gs.record(hidden, name="target.model.layers.3", role="target.layer[3]", module_type="LlamaDecoderLayer", arg="output.residual_stream")
    gs.record(logits, name="target.logits_processor", role="target.lm_head", module_type="LogitsProcessor", arg="output.logits")
    gs.end_capture()
    hidden[12:] = float("nan")  # rows of requests this replay does not have: stale data
    for _ in range(GRAPH_DRAIN_EVERY):
        _replay(gs, key, 3, [hidden, logits], {"step": tracer.next_step(), "mode": "TARGET_VERIFY", "t_unix": 1.0})
        tracer.graph_replayed()
    tracer.finish_step()  # a reader: the worker drains what landed
    calls = rec.call_records()
    assert len(calls) == 2 * GRAPH_DRAIN_EVERY
    layer = [c for c in calls if c.role == "target.layer[3]"]
    assert all(c.graph_replay and c.forward_mode == "TARGET_VERIFY" and c.tokens == 12 for c in layer)
    out = layer[0].outputs[0]
    assert out.arg == "output.residual_stream" and out.shape == [12, 16]
    want = hidden[:12].double()
    assert out.stats.nan == 0 and abs(out.stats.mean - float(want.mean())) < 1e-9
    assert abs(out.stats.std - float(want.std(unbiased=False))) < 1e-9
    assert {c.graph for c in calls} == {"DecodeCudaGraphRunner[8]"}
    assert len({c.step for c in layer}) == GRAPH_DRAIN_EVERY
    tracer.detach()


def test_control_file_pauses_and_resumes(tmp_path, monkeypatch):
    path = tmp_path / "ctl"
    monkeypatch.setenv("SPECTRACE_CONTROL", str(path))
    monkeypatch.setattr(control, "CHECK_EVERY_S", 0.0)
    control.reset()
    try:
        assert not control.paused()  # no file: on
        path.write_text("off\n")
        assert control.paused()
        path.write_text("on\n")
        assert not control.paused()
    finally:
        monkeypatch.delenv("SPECTRACE_CONTROL")
        control.reset()


def test_a_paused_table_reads_no_rows():
    gs = G.GraphSlots("cpu", sample=1)
    key = ("b", 4)
    x = torch.randn(4, 8)
    gs.begin_capture(key, capture_bs=4, label="r[4]")
    gs.record(x, name="m", role=None, module_type="Linear", arg="output")
    gs.end_capture()
    gs.pause(key)
    assert int(gs.tables[key].real_bs[0]) == 0 and gs.tables[key].paused
    assert not gs.after_replay(key, {})  # nothing armed: no read-back

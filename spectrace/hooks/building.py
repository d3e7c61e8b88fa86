"""Building records: a finished step's notes, or a graph's read-back, into ``call`` records.

Runs on the :class:`~.worker.RecordWorker` thread (or inline, for a step whose statistics
need no wait: ``Tracer.finish_step`` decides), waits for the statistics that step
enqueued, writes the records' JSON (:mod:`.call_text`), shows each call's fields to the
observers (live checks) and hands the step to the :class:`~spectrace.recorder.Recorder`.
Graph replays are read back every :data:`GRAPH_DRAIN_EVERY` of them (:mod:`.graph_slots`).
Nothing here raises: a failure is counted.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..records import Call
from .call_text import call_fields, call_texts, dumps, dumps_core
from .graph_branch import capturing as _capturing
from .step_state import GRAPH_DRAIN, FinishedStep
from .tracer_base import TracerBase

GRAPH_DRAIN_EVERY = 8  # sampled replays per hand-off to the record worker (the ring holds 128)
GRAPH_OBSERVE_EVERY = 4  # graph read-backs per one the live checks see


class RecordBuilding(TracerBase):
    """Turns finished steps and graph read-backs into records, off the host where it can."""

    def _build_step(self, item: FinishedStep, on_worker: bool = True) -> None:
        """Wait for the statistics, build the records, hand them on (on the worker thread,
        or inline for a CPU-only step)."""
        if item is GRAPH_DRAIN:
            self._build_graphs()
            return
        if item.readback is not None:
            values: list[list[float] | None] = []
            if item.readback.error is not None:
                exc = item.readback.error
                self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
            try:
                values = item.readback.values()
            except Exception as exc:
                self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
            with self._values_lock:  # CPU steps of several threads may be built at once
                self._values[item.readback.generation] = values
                while len(self._values) > 64:
                    self._values.popitem(last=False)
        # JSON straight from the notes: the schema's field names, checked against the
        # pydantic model in tests/hooks/test_roles.py. Call objects are built only when a sink
        # needs them (the OpenTelemetry sink).
        objects = self.recorder.needs_call_objects
        calls: list[Call] = []
        texts: list[str] = []
        try:
            if not objects and not self.observers and dumps is dumps_core:
                # Only the JSON is wanted: written piece by piece, the same text (call_text.py).
                pause = self._worker.pause_point if on_worker else None  # the host is awake again: step aside
                self._emit_step(item.step, calls, item.start_ns, item.end_ns, call_texts(item.calls, self._values, pause))
                return
            for n, raw in enumerate(item.calls, 1):
                fields = call_fields(raw, self._values)
                texts.append(dumps(fields))
                if self.observers:
                    self._observe(fields)
                if objects:
                    calls.append(Call.model_validate(fields))
                if on_worker and n % 4 == 0:
                    self._worker.pause_point()  # the host is awake again: step aside
        except Exception as exc:
            self.recorder.count_dropped(len(item.calls), "record build")
            self.recorder.internal_error(f"record build: {type(exc).__name__}: {exc}")
            return
        self._emit_step(item.step, calls, item.start_ns, item.end_ns, texts)

    def _drop_step(self, item: FinishedStep) -> None:
        if item is GRAPH_DRAIN:
            return  # the copies stay in the ring: a later drain reads them
        self.recorder.count_dropped(len(item.calls), "record worker stuck")
        self.recorder.coverage("dropped", "call records dropped: the record worker was stuck for seconds (counted in records_dropped)")

    def _emit_step(self, step: int, calls: list[Call], start: int, end: int, texts: list[str] | None = None) -> None:
        count = len(texts) if texts is not None else len(calls)
        if not count:
            return
        try:
            self.recorder.emit_step(step, calls, start, end, texts)
        except Exception as exc:  # never raise, wherever it runs
            self.recorder.count_dropped(count, "step hand-off")
            self.recorder.internal_error(f"step hand-off: {type(exc).__name__}: {exc}")

    def _observe(self, fields: dict[str, Any]) -> None:
        for observer in self.observers:
            try:
                observer(fields)
            except Exception as exc:
                self.recorder.internal_error(f"call observer: {type(exc).__name__}: {exc}")

    def graph_replayed(self) -> None:
        """A sampled replay's statistics copy was queued. Every few of them the worker turns
        the copies that have landed into records (it never waits for one; the rest wait for
        a later drain). One hand-off per copy cost the host a thread wake-up each."""
        self._graph_pending += 1
        if self._graph_pending >= GRAPH_DRAIN_EVERY:
            self._graph_pending = 0
            self._worker.submit(GRAPH_DRAIN, busy=None)

    def _drain_graphs(self, final: bool = False) -> None:
        if final and not _capturing():
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # reading the trace now: let the last copies land
            except Exception:
                pass
        self._worker.submit(GRAPH_DRAIN, busy=None)

    def _build_graphs(self) -> None:
        from .graph_records import readout_fields

        slots = self.graph_slots
        if slots is None:
            return
        for n, readout in enumerate(slots.poll()):
            if n:
                self._worker.pause_point()  # the host is awake again: step aside
            try:
                with self._counter_lock:
                    first = self._seq + 1
                    fields = readout_fields(readout, slots, first)
                    self._seq += len(fields)
                texts = []
                for i, f in enumerate(fields, 1):
                    texts.append(dumps(f))
                    if i % 4 == 0:
                        self._worker.pause_point()  # the host is awake again: step aside
                self._graph_readouts += 1
                # Live checks see one read-back in GRAPH_OBSERVE_EVERY: they vote over many
                # steps, and the worker's time is the host's GIL.
                if self.observers and self._graph_readouts % GRAPH_OBSERVE_EVERY == 1:
                    for f in fields:
                        self._observe(f)
                calls = [Call.model_validate(f) for f in fields] if self.recorder.needs_call_objects else []
                step = int(readout.context.get("step", -1))
                now = time.time_ns()
                self._emit_step(step, calls, now, now, texts)
            except Exception as exc:
                self.recorder.internal_error(f"graph read-back: {type(exc).__name__}: {exc}")

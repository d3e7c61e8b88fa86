"""The deferred statistics read-back for ``Tracer.finish_step``, applied at runtime.

This is the engine change proposed in ``bench/engine_deferred_readback.patch``: a step's
statistics are copied with ``non_blocking=True`` into pinned memory behind an event
(:meth:`PendingStats.resolve_async`), and the step's calls are handed to the recorder
once the copy has landed (:meth:`PendingStats.drain`): at the next step's end, or at
once when something reads the trace. The benchmark applies it when the installed
engine does not do this itself, and says so in its table.
"""

from __future__ import annotations

import time
from typing import Any


def engine_defers(tracer_cls: Any) -> bool:
    """Whether ``Tracer.finish_step`` already uses the deferred read-back."""
    return "resolve_async" in tracer_cls.finish_step.__code__.co_names


def apply(tracer_cls: Any) -> bool:
    """Patch ``tracer_cls`` in place; returns False when it already defers."""
    if engine_defers(tracer_cls):
        return False

    def finish_step(self: Any, wait: bool = True) -> None:
        calls, self._calls = self._calls, []
        step, start, end = self.step, self._step_start_ns or time.time_ns(), time.time_ns()
        try:
            self._pending.resolve_async(lambda: self._emit_step(step, calls, start, end))
            self._pending.drain(wait=wait)
        except Exception as exc:
            self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")

    def _emit_step(self: Any, step: int, calls: list, start: int, end: int) -> None:
        if not calls:
            return
        try:
            self.recorder.emit_step(step, calls, start, end)
        except Exception as exc:  # runs inside the host's forward: never raise
            self.recorder.counters.records_dropped += len(calls)
            self.recorder.internal_error(f"step hand-off: {type(exc).__name__}: {exc}")

    def _close_step(self: Any) -> None:
        self._local.depth = max(0, self._depth() - 1)
        self.finish_step(wait=False)

    tracer_cls.finish_step = finish_step
    tracer_cls._emit_step = _emit_step
    tracer_cls._close_step = _close_step
    return True

"""Batching: records queue in memory and reach the line sinks (the trace file first) in
batches, on a flush thread of the recorder's own.

A hook only queues (:meth:`Batching._queue_text`); the first record since the last flush
arms the flush thread's timer, so an idle process's last records reach the file within
``SPECTRACE_FLUSH_SECONDS`` even when no record comes after them. Producers that batch
their records on a hot path (a serving engine's per-step hook) register a drain
(:meth:`Batching.add_drain`), run before every read, at close, and on the flush thread.
A failing sink is counted, never raised.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..settings import Settings


class Batching:
    """The pending queue, the flush thread and the drains of a :class:`~.core.Recorder`."""

    settings: Settings
    _pending: collections.deque[str]
    _lock: threading.RLock
    _write_lock: threading.RLock
    _drain_lock: threading.RLock
    _count_lock: threading.Lock
    _started: set[int]
    _file: Any
    _drains: list[Callable[[], None]]
    _flusher: threading.Thread | None
    _flusher_pid: int
    _flush_wanted: threading.Event
    _flush_now: bool
    _drain_wanted: bool
    _last_flush: float
    _closed: bool

    if TYPE_CHECKING:

        def _writes_lines(self) -> bool: ...
        def _line_outputs(self) -> list[Any]: ...
        def _header_line(self) -> str: ...
        def _outputs(self) -> list[Any]: ...
        def _sink_failed(self, sink: Any, exc: BaseException) -> None: ...
        def count(self, name: str, delta: float = 1) -> None: ...
        def count_dropped(self, n: int, reason: str) -> None: ...
        def _file_capped(self, lines: int) -> None: ...
        def internal_error(self, message: str) -> None: ...

    def _queue_text(self, text: str) -> None:
        if len(self._pending) >= self.settings.record_cap:
            self._pending.popleft()
            self.count_dropped(1, "record cap")
        self._pending.append(text)
        if len(self._pending) == 1:
            # The first record since the last flush arms the flush thread's timer, once per
            # interval: an idle process's last records reach the file within the interval
            # even when no record comes after them (OpenTelemetry's batch processor does the same).
            self._arm_timer()

    def flush(self, timeout_s: float | None = None) -> None:
        """Write queued records to the line sinks; a failing sink is counted, never raised.

        ``records_written`` and ``records_dropped`` describe the trace itself: the file under
        ``directory``, else the first line sink given (another line sink that fails costs a
        sink error, not a drop). With ``timeout_s`` every sink is then also asked to
        ``flush(timeout_s)`` (an OTLP collector is waited for); without it nothing here
        waits on a network.
        """
        with self._write_lock:
            with self._lock:
                self._last_flush = time.monotonic()
                lines: list[str] = []
                if self._pending and self._writes_lines():
                    lines = list(self._pending)
                    self._pending.clear()
            # Written outside ``_lock``: records emitted meanwhile queue up for the next flush.
            if lines:
                for n, sink in enumerate(self._line_outputs()):
                    try:
                        # The trace's own file writes its header itself (again in a file made
                        # after a deletion); another line sink gets it before its first batch.
                        own = sink is self._file or id(sink) in self._started
                        capped = sink.write(lines if own else [self._header_line(), *lines])
                        self._started.add(id(sink))
                        if n == 0:
                            capped = capped if isinstance(capped, int) and sink is self._file else 0
                            self.count("records_written", len(lines) - capped)
                            if capped:
                                self._file_capped(capped)
                    except Exception as exc:
                        if n == 0:
                            self.count_dropped(len(lines), "sink error")
                        self._sink_failed(sink, exc)
        if timeout_s is not None:
            for sink in self._outputs():
                try:
                    sink.flush(timeout_s)
                except Exception as exc:
                    self._sink_failed(sink, exc)

    def _ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher_pid != os.getpid() or not self._flusher.is_alive():
            with self._count_lock:
                if self._flusher is None or self._flusher_pid != os.getpid() or not self._flusher.is_alive():
                    # A forked child inherits no thread: it starts its own here.
                    self._flush_wanted = threading.Event()
                    self._flusher_pid = os.getpid()
                    self._flusher = threading.Thread(target=self._flush_loop, name="spectrace-flush", daemon=True)
                    self._flusher.start()

    def _flush_soon(self) -> None:
        """A flush on a daemon thread of the recorder's own: a per-step hook only queues."""
        try:
            self._flush_now = True
            self._ensure_flusher()
            self._flush_wanted.set()
        except Exception:  # no thread to be had: flush here, as before
            self.flush()

    def _arm_timer(self) -> None:
        """Wake the flush thread so that it waits for the interval's end (not a flush now)."""
        if self._closed:
            return
        try:
            self._ensure_flusher()
            self._flush_wanted.set()
        except Exception:  # no thread to be had: the next due record flushes, as before
            pass

    def drain_soon(self) -> None:
        """Run the drains (:meth:`add_drain`) on the flush thread, then flush if due: a
        producer on a hot path hands its batch over instead of building it there."""
        self._drain_wanted = True
        self._flush_soon()

    def _flush_loop(self) -> None:
        wanted = self._flush_wanted
        interval = self.settings.flush_seconds
        while not self._closed:
            # With records queued (or a producer batching them: a drain) the wait ends when
            # the interval since the last flush does, whether or not another record comes.
            # With nothing held it waits for a record: an idle process costs no wake-ups.
            timeout: float | None = None
            if self._pending or self._drains:
                timeout = max(0.0, interval - (time.monotonic() - self._last_flush))
            wanted.wait(timeout)
            wanted.clear()
            if self._closed:
                return
            due = time.monotonic() - self._last_flush >= interval
            if not (self._flush_now or due):
                continue  # armed by a first record: wait for the interval's end
            self._flush_now = False
            try:
                if self._drain_wanted or (due and self._drains):
                    self._drain_wanted = False
                    self._drain()
                self.flush()
            except Exception as exc:
                self.internal_error(f"flush failed: {type(exc).__name__}: {exc}")

    def add_drain(self, drain: Callable[[], None]) -> None:
        """Register a producer that batches its records on a hot path (a serving engine's
        per-step hook): ``drain()`` emits what it holds, before every read and at close."""
        with self._lock:
            if drain not in self._drains:
                self._drains.append(drain)
        # What it holds reaches the file within the interval even when the host goes idle.
        self._arm_timer()

    def _drain(self) -> None:
        with self._drain_lock:
            for drain in list(self._drains):
                try:
                    drain()
                except Exception as exc:
                    self.internal_error(f"drain failed: {type(exc).__name__}: {exc}")

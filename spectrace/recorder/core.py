"""The recorder: where records go after capture, bounded, counted, never raising.

The hooks hand records to a :class:`Recorder`; it keeps them in memory (bounded by
the record cap: :mod:`.memory`), queues them for the JSONL file (:mod:`.trace_file`) in
batches (:mod:`.batching`), fans them out to its sinks (the
:class:`~spectrace.sinks.base.Sink` protocol: OpenTelemetry, or any other), counts what
it had to drop, and prints each error finding once to stderr so it stands out in a
server log (:mod:`.stderr`). Every sink failure is counted and warned about once; the host
program never sees an exception from here. Counters change only through its methods
(:meth:`~Recorder.count`, :meth:`~Recorder.count_dropped`, :meth:`~Recorder.account_hook`);
whatever should be said once and then counted goes through :meth:`~Recorder.once`
(:mod:`.say_once`).

    >>> recorder = Recorder(Settings.from_env(), directory="traces", sinks=[my_sink])
    >>> recorder.emit(finding("fc_bypass", "64-wide input, fc expects 192"))
    >>> recorder.once("graph_stale_hidden", lambda: finding(...))  # then only counted
    >>> recorder.close()
"""

from __future__ import annotations

import collections
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..records import Acceptance, Call, Counters, Coverage, Finding, Header
from ..settings import Settings, redact_urls, warn
from ..sinks.base import Sink, Step, safe_text, safe_value, sink_name
from ..sinks.jsonl import JsonlSink, numbered_name
from ..version import __version__
from .batching import Batching
from .header import safe_argv, versions
from .memory import Memory
from .say_once import OnceLedger
from .stderr import StderrVoice, kind_of
from .trace_file import TraceFile, record_json

_token: tuple[int, str] | None = None


def process_token() -> str:
    """This process's random id, one for all its trace files (``SPECTRACE=1``'s and a
    ``trace()``'s alike); drawn again in a forked child, whose pid differs."""
    global _token
    pid = os.getpid()
    if _token is None or _token[0] != pid:
        _token = (pid, secrets.token_hex(4))
    return _token[1]


class Recorder(Batching, TraceFile, Memory):
    """Collects records for one process (or one ``trace()`` context).

    Where records go: memory (bounded, for the returned ``Trace``), the trace file when
    ``directory`` is set (the recorder's own :class:`JsonlSink`, opened on the first flush
    so the rank and the name may still change), and every sink given in ``sinks`` or
    :meth:`add_sink` (the :class:`~spectrace.sinks.base.Sink` protocol; how each kind is
    fed is described there). Counters change only through the methods below.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        directory: str | None = None,
        rank: int | None = None,
        name: str | None = None,
        sinks: Iterable[Sink] = (),
    ) -> None:
        self.settings = settings
        self.rank = rank
        self.directory = directory
        self.file_name = name
        self._file: JsonlSink | None = None
        self._sinks: list[Any] = []
        self._line_sinks: list[Any] = []
        self._object_sinks: list[Any] = []
        self._started: set[int] = set()  # sinks (by id) that got the header
        # Calls are kept as their JSON line (~0.5 KB) rather than as pydantic objects
        # (~7 KB): a full ring of 100k calls stays near 50 MB. Parsed again on read.
        self.calls: collections.deque[str] = collections.deque(maxlen=settings.record_cap)
        self._parsed: tuple[int, list[Call]] = (-1, [])
        self._calls_added = 0
        # Non-call records in emission order. Acceptance records are kept as their JSON
        # line: a server emits one per verify step, and a str is not tracked by the
        # garbage collector, where 50k pydantic objects (each a dict, a set and lists)
        # made every collection in the host process slower. Parsed again on read.
        self.important: list[Any] = []
        self.counters = Counters()
        self._dropped_by: dict[str, int] = {}
        self._pending: collections.deque[str] = collections.deque()
        self._lock = threading.RLock()
        # Writing to the sinks has its own lock, taken before ``_lock`` and never by a hook:
        # a flush swaps the queue under ``_lock`` and writes under this one alone, so the
        # host thread never waits on a file or a network to emit a record.
        self._write_lock = threading.RLock()
        # One drain at a time: close (or a read) waits for the flush thread's drain in
        # progress, so what that drain writes (a values file, its record) is done by then.
        self._drain_lock = threading.RLock()
        self._flusher: threading.Thread | None = None
        self._flusher_pid = 0
        self._flush_wanted = threading.Event()
        self._flush_now = False  # a due flush asked for (not only the timer armed)
        self._drain_wanted = False
        # Counters are bumped from hooks, the record worker and the OpenTelemetry export
        # thread: their own small lock, never held while calling out, so no thread waits
        # on a flush to count.
        self._count_lock = threading.Lock()
        self._voice = StderrVoice(settings)  # warnings and error announcements, each said once
        self._ledger = OnceLedger()  # "say once, then count" (see once)
        self._drains: list[Callable[[], None]] = []
        self._last_flush = time.monotonic()
        self._closed = False
        self.closing = False  # set as close() starts: a drain then hands over what it still holds
        self.last_sink_error: str | None = None  # what the last sink error said (the pytest summary quotes it)
        self.header = Header(
            spectrace_version=__version__,
            pid=os.getpid(),
            host=safe_text(socket.gethostname()),
            rank=rank,
            argv=safe_argv(list(sys.argv), settings.keep_argv),
            started_unix=time.time(),
            # The endpoint may carry credentials or an ?api_key=: redacted (Settings.safe_dict).
            # Strings from the environment (a folder, module globs) made valid UTF-8.
            settings=safe_value(settings.safe_dict()),
            versions=versions(),
            process_id=process_token(),
        )
        for sink in sinks:
            self.add_sink(sink)
        _live.add(self)

    # ------------------------------------------------------------------ fork
    def _after_fork_in_child(self) -> None:
        """In a forked child (``os.register_at_fork``): a trace of the child's own.

        The OpenTelemetry SDK's rule, re-create after fork, applied to the whole recorder:
        its own file under its own pid and header (never the parent's open file), empty
        queues and counters (the parent writes what it recorded before the fork, once),
        fresh locks (a thread that held one does not exist here), and every sink told
        (``after_fork``) before it gets the child's header first.
        """
        self._lock = threading.RLock()
        self._write_lock = threading.RLock()
        self._drain_lock = threading.RLock()
        self._count_lock = threading.Lock()
        # The parent's flush thread does not exist here: the first due flush starts one.
        self._flusher = None
        self._flush_wanted = threading.Event()
        self._flush_now = False
        self._drain_wanted = False
        if self._file is not None:
            fd, self._file._fd = self._file._fd, None
            if fd is not None:
                try:
                    os.close(fd)  # the child's copy of the parent's descriptor
                except OSError:
                    pass
            self._file = None
        if self.file_name:
            # A name given in code is shared by parent and child: the child's carries its pid.
            self.file_name = numbered_name(self.file_name, os.getpid())
        self._started.clear()
        self._pending.clear()
        self.calls.clear()
        self._parsed = (-1, [])
        self._calls_added = 0
        self.important = []
        self.counters = Counters()
        self._dropped_by = {}
        self._capped_said = False  # the child's own file has its own size cap
        self._ledger = OnceLedger()
        self._voice = StderrVoice(self.settings)
        self._last_flush = time.monotonic()
        self.header = self.header.model_copy(update={"pid": os.getpid(), "started_unix": time.time(), "process_id": process_token()})
        for sink in self._sinks:
            hook = getattr(sink, "after_fork", None)
            if callable(hook):
                try:
                    hook()
                except Exception as exc:
                    self._sink_failed(sink, exc)

    # ------------------------------------------------------------------ sinks
    def add_sink(self, sink: Sink) -> None:
        """Send records to ``sink`` too; add it before the first record (it gets the header
        on its first write, and only what is emitted from then on)."""
        if not isinstance(sink, Sink):
            raise TypeError(f"{type(sink).__name__} is not a spectrace Sink (needs_objects, write, flush, shutdown)")
        with self._write_lock, self._lock:
            if any(s is sink for s in self._sinks):
                return
            self._sinks.append(sink)
            (self._object_sinks if sink.needs_objects else self._line_sinks).append(sink)

    @property
    def sinks(self) -> tuple[Any, ...]:
        """The sinks given to this recorder (the trace file is its own: :attr:`sink`)."""
        return tuple(self._sinks)

    @property
    def needs_call_objects(self) -> bool:
        """Whether any sink needs :class:`Call` objects (else a step's calls go as JSON text)."""
        return bool(self._object_sinks)

    def _writes_lines(self) -> bool:
        return self.directory is not None or bool(self._line_sinks)

    def _outputs(self) -> list[Any]:
        return ([self._file] if self._file is not None else []) + list(self._sinks)

    # --------------------------------------------------------------- counters
    def count(self, name: str, delta: float = 1) -> None:
        """Add ``delta`` to the numeric counter ``name`` (a ``counters`` record field: steps, calls_seen, ...)."""
        try:
            with self._count_lock:
                self.counters.bump(name, delta)
        except Exception as exc:
            self.internal_error(f"count {name!r}: {type(exc).__name__}: {exc}")

    def count_dropped(self, n: int, reason: str) -> None:
        """``n`` records lost for ``reason``: ``records_dropped`` in the ``counters`` record (what
        ``spectrace view`` shows as "records dropped N"), split in ``dropped_by_reason``."""
        if n <= 0:
            return
        with self._count_lock:
            self.counters.bump("records_dropped", n)
            self._dropped_by[reason] = self._dropped_by.get(reason, 0) + n

    def account_hook(self, seconds: float, feature: str, *, calls: int = 1, slow_calls: int = 0, slow_seconds: float = 0.0) -> None:
        """``calls`` calls of a serving engine's hook and the host time they took, split by
        feature (``hook_calls``, ``hook_seconds``, ``hook_*_by_feature``): the overhead budget.
        ``slow_*``: the part of it in calls over the stall threshold."""
        with self._count_lock:
            counters = self.counters
            counters.bump("hook_calls", calls)
            counters.bump("hook_seconds", seconds)
            by_feature = counters.hook_seconds_by_feature
            by_feature[feature] = by_feature.get(feature, 0.0) + seconds
            calls_by = counters.hook_calls_by_feature
            calls_by[feature] = calls_by.get(feature, 0) + calls
            if slow_calls:
                slow = counters.hook_slow_calls_by_feature
                slow[feature] = slow.get(feature, 0) + slow_calls
                slow_s = counters.hook_slow_seconds_by_feature
                slow_s[feature] = slow_s.get(feature, 0.0) + slow_seconds

    # ----------------------------------------------------------------- intake
    def emit(self, record: Any) -> None:
        """Keep one non-call record (finding, capture, weights, acceptance, coverage, ...)."""
        try:
            if isinstance(record, Acceptance):
                # A per-step record: kept and queued as its line, like the ones an
                # integration writes directly, and handed to object sinks as it is.
                self.emit_lines([record_json(record)])
                if self._object_sinks:
                    self._to_objects([record])
                return
            out = record
            if "t_unix" in type(record).model_fields and record.t_unix is None and (self._object_sinks or self._writes_lines()):
                # What the sinks get says when (a trace cut by a crash shows its last
                # record's time); the caller's object stays as it was given.
                out = record.model_copy(update={"t_unix": time.time()})
            with self._lock:
                lines = self._writes_lines()
                if not self._keep_important(record, elsewhere=lines or bool(self._object_sinks)):
                    return  # memory only and full: the record is gone (counted)
                if lines:
                    try:
                        text = record_json(out)
                    except Exception as exc:
                        # Kept in memory, lost to the file: counted, and the rest still written.
                        self.count_dropped(1, "record build")
                        self.internal_error(f"record not written: {type(exc).__name__}: {exc}")
                    else:
                        self._queue_text(text)
            if isinstance(record, Finding) and record.severity == "error":
                self._voice.announce(record)
            if self._object_sinks:
                self._to_objects([out])
            # Write-through for everything but the per-step records (acceptance; calls go
            # through emit_step): a header, a weights or capture record, a finding or a
            # coverage note is on disk before the engine's next action, so a server that
            # crashes or is SIGKILLed a moment later still leaves it. Per-step records wait
            # for the flush interval (a SIGKILL loses at most that much of them).
            self.flush()
        except Exception as exc:  # never into the host
            self.internal_error(f"emit failed: {type(exc).__name__}: {exc}")

    def emit_lines(self, lines: list[str]) -> None:
        """Keep per-step records given as their JSON lines (an integration's hot path writes
        them directly; each line must be what ``model_dump_json`` of its record gives).
        Only when no sink needs objects (:attr:`needs_call_objects`): the caller checks."""
        if not lines:
            return
        try:
            with self._lock:
                writes = self._writes_lines()
                # With a sink the cap only trims memory: a server's millionth acceptance
                # record still reaches the trace, as calls past the ring do.
                elsewhere = writes or bool(self._object_sinks)
                for text in lines:
                    if not self._keep_important(text, elsewhere):
                        continue  # memory only and full: the record is gone (counted)
                    if writes:
                        self._queue_text(text)
            if time.monotonic() - self._last_flush >= self.settings.flush_seconds:
                self._flush_soon()
        except Exception as exc:  # never into the host
            self.internal_error(f"emit_lines failed: {type(exc).__name__}: {exc}")

    def emit_step(self, step: int, calls: list[Call], start_ns: int, end_ns: int, texts: list[str] | None = None) -> None:
        """Keep the call records of one step; object sinks get them as one :class:`Step`.

        ``texts``: the calls already serialised (the record worker does it outside the lock);
        ``calls`` may then be empty, as they are only needed when :attr:`needs_call_objects`.
        """
        try:
            if texts is None:
                texts = [record_json(call) for call in calls]
            with self._lock:
                self.count("steps")
                lines = self._writes_lines()
                elsewhere = lines or bool(self._object_sinks and calls)
                for text in texts:
                    if len(self.calls) == self.calls.maxlen and not elsewhere:
                        # With a sink, the ring only trims memory (the sink has the call);
                        # without one the oldest call is gone, so count it.
                        self.count_dropped(1, "memory cap")
                    self.calls.append(text)
                    self._calls_added += 1
                    if lines:
                        self._queue_text(text)
            if self._object_sinks and calls:
                self._to_objects([Step(step, calls, start_ns, end_ns)])
            if time.monotonic() - self._last_flush >= self.settings.flush_seconds:
                self._flush_soon()
        except Exception as exc:
            self.internal_error(f"emit_step failed: {type(exc).__name__}: {exc}")

    def _to_objects(self, items: list[Any]) -> None:
        """Hand ``items`` to every object sink, the header before anything else."""
        for sink in list(self._object_sinks):
            try:
                if id(sink) not in self._started:
                    with self._lock:
                        if id(sink) not in self._started:
                            self._started.add(id(sink))
                            sink.write([self.header])
                sink.write(items)
            except Exception as exc:
                self._sink_failed(sink, exc)

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.emit(record)

    # ------------------------------------------------------------ say once
    def once(self, key: str, make: Callable[[], Any] | Any) -> bool:
        """Emit a record the first time ``key`` is seen; later times only count. True when emitted.

        ``make`` is the record or a function building it (run once; None emits nothing and
        leaves ``key`` unseen). The record carries ``once_key`` (an extra field, in the file
        too). Repeats are counted here and reach the file at close, in the ``stats``
        record's ``once_counts`` (``{once_key: occurrences}``, keys seen more than once):
        a reader's true count for a record with ``once_key`` K is ``once_counts.get(K, 1)``
        (coverage keys also stay in ``coverage_counts``, without the ``coverage:`` prefix).
        In memory the kept record follows along: a coverage record's ``count``, a
        finding's ``evidence["occurrences"]``.
        """
        try:
            if self._ledger.repeated(key):
                return False
            record = make() if callable(make) else make  # outside the lock: it may call back in
            if record is None:
                return False
            if not self._ledger.claim(key, record):
                return False  # another thread said it meanwhile (counted)
            self.emit(record)
            return True
        except Exception as exc:
            self.internal_error(f"once {key!r}: {type(exc).__name__}: {exc}")
            return False

    def said(self, key: str) -> bool:
        """Whether :meth:`once` has emitted for ``key``."""
        return self._ledger.said(key)

    def coverage(self, kind: str, detail: str, *, step: int | None = None, times: int = 1) -> None:
        """Say once, loudly, what could not be seen; later repeats only count (:meth:`once`).

        ``times``: occurrences counted at once (a hot path hands over its repeats in batches)."""
        key = f"coverage:{kind}:{detail}"
        if self._ledger.repeated(key, times):  # the hot path (a graph replay per step): no closure built
            return
        if self.once(key, lambda: Coverage(kind=kind, detail=detail, step=step)):  # type: ignore[arg-type]
            self.warn_once(key, f"not covered: {detail}")
            if times > 1:
                self._ledger.repeated(key, times - 1)

    # ---------------------------------------------------------------- problems
    def internal_error(self, message: str) -> None:
        """Count a failure inside spectrace; warn the first time each kind is seen."""
        with self._count_lock:
            self.counters.bump("internal_errors")
        # Keyed by the exception, not the site: one failing statistic or an unreadable
        # tensor kind hits every hook and every dtype, and is still one warning.
        cause = message.split(": ", 1)[1] if ": " in message else message
        self.warn_once("internal:" + kind_of(cause.replace(": ", " ", 1)), f"internal error (counted, tracing continues): {message}")

    def sink_error(self, message: str) -> None:
        """Count a failing sink (disk, collector); warn once per kind, never per batch."""
        with self._count_lock:
            self.counters.bump("sink_errors")
        # A collector's error may quote its URL, query string and credentials included.
        message = safe_text(redact_urls(message))
        self.last_sink_error = message
        self.warn_once("sink:" + kind_of(message), f"sink error (counted, the model is unaffected): {message}")

    def _sink_failed(self, sink: Any, exc: BaseException) -> None:
        if isinstance(exc, OSError) and isinstance(getattr(sink, "path", None), str):
            self.sink_error(f"cannot write {sink.path}: {exc.strerror or exc}")
        else:
            self.sink_error(f"{sink_name(sink)}: {type(exc).__name__}: {exc}")

    def warn_once(self, key: str, message: str) -> None:
        """Say ``message`` on stderr the first time ``key`` is seen (not at all when quiet)."""
        self._voice.warn_once(key, message)

    # ------------------------------------------------------------------ close
    def _final_counts(self) -> None:
        """What only counted so far goes into the ``counters`` record (see :meth:`once`)."""
        repeated = self._ledger.repeats()
        if repeated:
            self.counters.once_counts = repeated
            coverage = {k[len("coverage:") :]: n for k, n in repeated.items() if k.startswith("coverage:")}
            if coverage:
                self.counters.coverage_counts = coverage
        with self._count_lock:
            if self._dropped_by:
                self.counters.dropped_by_reason = dict(self._dropped_by)

    def close(self) -> None:
        """Flush, shut every sink down (each bounded), append the counters (the ``counters`` record).

        Object sinks (OpenTelemetry) are shut down *before* the counters are written, so
        what a collector never got (down, failing, hanging: the export gave up or the
        shutdown deadline passed) is in the file: ``sink_errors``, ``otlp_spans_lost``
        and one ``sink_error`` coverage record saying how many spans of how many.
        Never raises (a ``with spectrace.trace(...)`` block must not fail at its end on
        spectrace's own I/O): a failure is counted and said once.
        """
        try:
            self._close()
        except Exception as exc:
            self.internal_error(f"close failed: {type(exc).__name__}: {exc}")

    def _close(self) -> None:
        if not self._closed:
            self.closing = True
            self._drain()
        with self._write_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._flush_wanted.set()  # the flush thread sees the close and ends
            self.flush()
            self._final_counts()
        if self._object_sinks:
            self._to_objects([self.counters])  # their last record: the counts so far
        for sink in list(self._object_sinks):
            self._shutdown(sink)  # each sink's own bound (OtelSink: SHUTDOWN_TIMEOUT_S)
            self._count_undelivered(sink)
        with self._write_lock, self._lock:
            if self._writes_lines():
                if self._file is not None:
                    # A file deleted since the last write takes records with it: counted
                    # before the counters are written (into a new file, header first).
                    self._file.check()
                    self._final_counts()
                try:
                    self._pending.append(record_json(self.counters))
                except Exception as exc:
                    self.internal_error(f"counters not written: {type(exc).__name__}: {exc}")
                self.flush()
        for sink in self._outputs():
            if not getattr(sink, "needs_objects", False):
                self._shutdown(sink)

    def _shutdown(self, sink: Any) -> None:
        try:
            sink.shutdown()
        except Exception as exc:
            self._sink_failed(sink, exc)

    def _count_undelivered(self, sink: Any) -> None:
        """After ``sink`` shut down: what it says it never delivered goes into the counters
        and, for the viewer, one coverage record (written before the counters line)."""
        try:
            undelivered = getattr(sink, "undelivered", None)
            lost, sent = undelivered() if callable(undelivered) else (0, 0)
        except Exception as exc:
            self._sink_failed(sink, exc)
            return
        if lost <= 0:
            return
        with self._count_lock:
            self.counters.bump("otlp_spans_lost", lost)
        detail = f"{sink_name(sink)}: {lost} of {lost + sent} spans never reached the collector (see sink_errors and the warning)"
        record = Coverage(kind="sink_error", detail=detail, count=lost, t_unix=time.time())
        with self._lock:
            self._keep_important(record, elsewhere=True)
            if self._writes_lines():
                self._pending.append(record_json(record))


# Every recorder alive in this process, so a forked child can give each a trace of its own.
_live: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for recorder in list(_live):
        try:
            recorder._after_fork_in_child()
        except Exception as exc:  # never into the child
            warn(f"after fork: {type(exc).__name__}: {exc}")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""The recorder: where records go after capture, bounded, counted, never raising.

Capture code hands records to a :class:`Recorder`; it keeps them in memory (bounded by
the record cap), queues them for the JSONL file, mirrors them to OpenTelemetry, counts
what it had to drop, and prints each error finding once to stderr so it stands out in
a server log. Every sink failure is counted and warned about once; the host program
never sees an exception from here.

    >>> recorder = Recorder(Settings.from_env(), directory="traces")
    >>> recorder.emit(finding("fc_bypass", "64-wide input, fc expects 192"))
    >>> recorder.close()
"""

from __future__ import annotations

import collections
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable

from . import __version__
from .records import RECORD_ADAPTER, Acceptance, Call, Counters, Coverage, Finding, Header
from .settings import Settings, warn
from .sinks.jsonl import JsonlSink, trace_file_name

# Non-call records (findings, capture, weights, ...) are few; they get their own, larger
# bound so a flood of calls can never push a finding out.
IMPORTANT_CAP = 50_000


REDACTED = "<redacted>"


def safe_argv(argv: list[str], keep_values: bool = False) -> list[str]:
    """The command line as the header stores it: program and option names, no values.

    A prompt, a token or a path passed on the command line would otherwise sit in every
    trace. ``argv[0]`` and ``--option`` names stay (they say how the server was started);
    every other token becomes ``<redacted>``. ``SPECTRACE_CAPTURE_VALUES=1`` keeps it all.

        >>> safe_argv(["serve.py", "--prompt=hi there", "--port", "30000", "-v"])
        ['serve.py', '--prompt=<redacted>', '--port', '<redacted>', '-v']
    """
    if keep_values:
        return list(argv)
    out = list(argv[:1])
    for token in argv[1:]:
        if token.startswith("--") and len(token) > 2:
            name, eq, _ = token.partition("=")
            out.append(name + (eq + REDACTED if eq else ""))
        elif token.startswith("-") and len(token) == 2 and not token[1].isdigit():
            out.append(token)
        else:
            out.append(REDACTED)
    return out


def _safe_settings(settings: Settings) -> dict[str, Any]:
    data = settings.as_dict()
    # An endpoint may carry credentials (http://user:token@host): keep scheme and host only.
    endpoint = data.get("otlp_endpoint") or ""
    data["otlp_endpoint"] = re.sub(r"(?<=://)[^/@]*@", REDACTED + "@", endpoint)
    return data


def _versions() -> dict[str, str]:
    found: dict[str, str] = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "sglang"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module else None
        if version:
            found[name] = str(version)
    return found


def _kind_of(message: str) -> str:
    """What a warning is about, without the parts that vary (counts, sizes, offsets)."""
    return re.sub(r"\d+", "#", message.split(":")[0].split(" (")[0])[:60]


class Recorder:
    """Collects records for one process (or one ``trace()`` context)."""

    def __init__(
        self,
        settings: Settings,
        *,
        directory: str | None = None,
        rank: int | None = None,
        name: str | None = None,
        otel: Any | None = None,
    ) -> None:
        self.settings = settings
        self.rank = rank
        self.directory = directory
        self.file_name = name
        self.sink: JsonlSink | None = None
        self.otel = otel
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
        self._pending: collections.deque[str] = collections.deque()
        self._lock = threading.RLock()
        # Sink errors arrive from the OpenTelemetry export thread too; counting and
        # warning take their own small lock so that thread never waits on a flush.
        self._warn_lock = threading.Lock()
        self._warned: set[str] = set()
        self._printed_codes: set[str] = set()
        self._coverage: dict[str, Coverage] = {}
        self._drains: list[Callable[[], None]] = []
        self._last_flush = time.monotonic()
        self._closed = False
        self.header = Header(
            spectrace_version=__version__,
            pid=os.getpid(),
            host=socket.gethostname(),
            rank=rank,
            argv=safe_argv(list(sys.argv), settings.capture_values),
            started_unix=time.time(),
            settings=_safe_settings(settings),
            versions=_versions(),
        )
        self._header_written = False

    # ----------------------------------------------------------------- intake
    def emit(self, record: Any) -> None:
        """Keep one non-call record (finding, capture, weights, acceptance, coverage, ...)."""
        try:
            with self._lock:
                text = record.model_dump_json() if isinstance(record, Acceptance) else None
                if len(self.important) < IMPORTANT_CAP:
                    self.important.append(text if text is not None else record)
                elif self.directory is None:
                    # Memory only and full: the record is gone, so count it.
                    self.counters.records_dropped += 1
                    return
                # With a file the cap only trims memory: a server's millionth acceptance
                # record still reaches the trace, as calls past the ring do.
                self._queue(record, text)
            if isinstance(record, Finding) and record.severity == "error":
                self._announce(record)
            if self.otel is not None:
                self._to_otel(lambda: self.otel.export_record(record, time.time_ns()))
            # Write-through for everything but the per-step records (acceptance; calls go
            # through emit_step): a header, a weights or capture record, a finding or a
            # coverage note is on disk before the engine's next action, so a server that
            # crashes or is SIGKILLed a moment later still leaves it. Per-step records wait
            # for the flush interval (a SIGKILL loses at most that much of them).
            if not isinstance(record, Acceptance) or time.monotonic() - self._last_flush >= self.settings.flush_seconds:
                self.flush()
        except Exception as exc:  # never into the host
            self.internal_error(f"emit failed: {type(exc).__name__}: {exc}")

    def emit_step(self, step: int, calls: list[Call], start_ns: int, end_ns: int, texts: list[str] | None = None) -> None:
        """Keep the call records of one step and mirror them as one step span.

        ``texts``: the calls already serialised (the record worker does it outside the lock);
        ``calls`` may then be empty, as they are only needed for OpenTelemetry.
        """
        try:
            if texts is None:
                texts = [call.model_dump_json() for call in calls]
            with self._lock:
                self.counters.bump("steps")
                for text in texts:
                    if len(self.calls) == self.calls.maxlen and self.directory is None:
                        # With a file, the ring only trims memory (the file keeps the call);
                        # without one the oldest call is gone, so count it.
                        self.counters.records_dropped += 1
                    self.calls.append(text)
                    self._calls_added += 1
                    self._queue_text(text)
            if self.otel is not None and calls:
                self._to_otel(lambda: self.otel.export_step(step, calls, start_ns, end_ns))
            if time.monotonic() - self._last_flush >= self.settings.flush_seconds:
                self.flush()
        except Exception as exc:
            self.internal_error(f"emit_step failed: {type(exc).__name__}: {exc}")

    def _queue(self, record: Any, text: str | None = None) -> None:
        if self.directory is None:
            return
        if text is None:
            if "t_unix" in type(record).model_fields and record.t_unix is None:
                # The file's copy says when (a trace cut by a crash shows its last record's
                # time); the caller's object stays as it was given.
                record = record.model_copy(update={"t_unix": time.time()})
            text = record.model_dump_json()
        self._queue_text(text)

    def _queue_text(self, text: str) -> None:
        if self.directory is None:
            return
        if len(self._pending) >= self.settings.record_cap:
            self._pending.popleft()
            self.counters.records_dropped += 1
        self._pending.append(text)

    # ---------------------------------------------------------------- problems
    def internal_error(self, message: str) -> None:
        """Count a failure inside spectrace; warn the first time each kind is seen."""
        with self._warn_lock:
            self.counters.internal_errors += 1
        # Keyed by the exception, not the site: one failing statistic or an unreadable
        # tensor kind hits every hook and every dtype, and is still one warning.
        cause = message.split(": ", 1)[1] if ": " in message else message
        self.warn_once("internal:" + _kind_of(cause.replace(": ", " ", 1)), f"internal error (counted, tracing continues): {message}")

    def sink_error(self, message: str) -> None:
        """Count a failing sink (disk, collector); warn once per kind, never per batch."""
        with self._warn_lock:
            self.counters.sink_errors += 1
        self.warn_once("sink:" + _kind_of(message), f"sink error (counted, the model is unaffected): {message}")

    def coverage(self, kind: str, detail: str, *, step: int | None = None) -> None:
        """Say once, loudly, what could not be seen; later repeats only count.

        The count reaches the file in the ``stats`` record at close (``coverage_counts``).
        """
        key = f"{kind}:{detail}"
        existing = self._coverage.get(key)
        if existing is not None:
            existing.bump("count")
            return
        record = Coverage(kind=kind, detail=detail, step=step)  # type: ignore[arg-type]
        self._coverage[key] = record
        self.warn_once("coverage:" + key, f"not covered: {detail}")
        self.emit(record)

    def warn_once(self, key: str, message: str) -> None:
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        if not self.settings.quiet:
            warn(message)

    def _announce(self, record: Finding) -> None:
        if record.code in self._printed_codes or self.settings.quiet:
            return
        self._printed_codes.add(record.code)
        where = f" at {record.module}" if record.module else ""
        block = (
            f"\n==== spectrace: ERROR {record.code}{where} ====\n"
            f"  cause: {record.message}\n"
            f"  fix:   {record.fix}\n"
            f"==== (written to the trace; repeats are counted, not printed) ====\n"
        )
        try:
            sys.stderr.write(block)
            sys.stderr.flush()
        except Exception:
            pass

    def _to_otel(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:
            self.sink_error(f"OpenTelemetry: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ output
    @property
    def path(self) -> str | None:
        return self.sink.path if self.sink else None

    def set_rank(self, rank: int) -> None:
        """Name the rank before the first flush (it goes in the file name and header)."""
        with self._lock:
            if self.rank == rank:
                return
            self.rank = rank
            self.header.rank = rank
            if self.sink is not None and not self._header_written:
                self.sink = None

    def flush(self) -> None:
        """Write queued records; a failing disk is counted and never raised."""
        with self._lock:
            self._last_flush = time.monotonic()
            if self.directory is None or not self._pending:
                return
            if self.sink is None:
                self.sink = JsonlSink(self.directory, self.file_name or trace_file_name(rank=self.rank))
            lines = list(self._pending)
            if not self._header_written:
                lines.insert(0, self.header.model_dump_json())
            try:
                self.sink.write_lines(lines)
                self._header_written = True
                self.counters.records_written += len(self._pending)
            except OSError as exc:
                self.counters.records_dropped += len(self._pending)
                self.sink_error(f"cannot write {self.sink.path}: {exc.strerror or exc}")
            self._pending.clear()

    def add_drain(self, drain: Callable[[], None]) -> None:
        """Register a producer that batches its records on a hot path (a serving engine's
        per-step hook): ``drain()`` emits what it holds, before every read and at close."""
        with self._lock:
            if drain not in self._drains:
                self._drains.append(drain)

    def _drain(self) -> None:
        for drain in list(self._drains):
            try:
                drain()
            except Exception as exc:
                self.internal_error(f"drain failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Flush, append the counters, and shut the OpenTelemetry sink down (bounded)."""
        if not self._closed:
            self._drain()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.flush()
            if self.directory is not None:
                repeated = {k: c.count for k, c in self._coverage.items() if c.count > 1}
                if repeated:
                    self.counters.coverage_counts = repeated  # type: ignore[attr-defined]
                self._pending.append(self.counters.model_dump_json())
                self.flush()
            if self.sink is not None:
                self.sink.close()
        if self.otel is not None:
            self._to_otel(lambda: self.otel.export_record(self.counters, time.time_ns()))
            self._to_otel(self.otel.shutdown)

    # ---------------------------------------------------------------- reading
    def call_records(self) -> list[Call]:
        """The kept calls, parsed once per change."""
        with self._lock:
            if self._parsed[0] != self._calls_added:
                self._parsed = (self._calls_added, [Call.model_validate_json(text) for text in self.calls])
            return list(self._parsed[1])

    def records(self) -> list[Any]:
        """Everything kept in memory: non-call records and the (bounded) calls."""
        self._drain()
        with self._lock:
            kept = [RECORD_ADAPTER.validate_json(r) if isinstance(r, str) else r for r in self.important]
            return [*kept, *self.call_records()]

    def findings(self) -> list[Finding]:
        self._drain()
        return [r for r in self.important if isinstance(r, Finding)]

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.emit(record)

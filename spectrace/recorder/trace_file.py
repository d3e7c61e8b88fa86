"""The trace file: one JSONL file per process (and rank), its header line first.

The recorder's own :class:`~spectrace.sinks.jsonl.JsonlSink`, made on the first flush so
the rank and the name may still change (:meth:`TraceFile.set_rank`). Every file it
creates (again, after a deletion) starts with the header line; records that went with a
deleted file are counted as dropped, not written.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..records import Counters, Header
from ..settings import Settings
from ..sinks.base import safe_value
from ..sinks.jsonl import JsonlSink, trace_file_name
from ..version import __version__
from .stderr import kind_of


def record_json(record: Any) -> str:
    """The JSON line of ``record``; a string no JSON encoder takes (a lone surrogate: a name
    that is not UTF-8, from argv, the environment, a path or a module) is written escaped
    (:func:`~spectrace.sinks.base.safe_text`) rather than costing the record. Raises only
    when the record cannot be written even so (the caller counts it)."""
    try:
        return str(record.model_dump_json())
    except Exception:  # pydantic's "surrogates not allowed", or a value it cannot write
        fields = safe_value(record.model_dump(mode="json"))
        return str(type(record).model_validate(fields).model_dump_json())


class TraceFile:
    """The trace file of a :class:`~.core.Recorder` (None without a ``directory``)."""

    settings: Settings
    directory: str | None
    file_name: str | None
    rank: int | None
    header: Header
    counters: Counters
    _file: JsonlSink | None
    _line_sinks: list[Any]
    _started: set[int]
    _lock: threading.RLock
    _write_lock: threading.RLock
    _count_lock: threading.Lock

    if TYPE_CHECKING:

        def _sink_failed(self, sink: Any, exc: BaseException) -> None: ...
        def warn_once(self, key: str, message: str) -> None: ...
        def internal_error(self, message: str) -> None: ...
        def count_dropped(self, n: int, reason: str) -> None: ...
        def coverage(self, kind: str, detail: str, *, step: int | None = None, times: int = 1) -> None: ...

    @property
    def sink(self) -> JsonlSink | None:
        """The trace file's sink, once the first flush opened it (None before, or without a folder)."""
        return self._file

    @property
    def path(self) -> str | None:
        """The trace file's path once it was created (None before, or when it could not be)."""
        return self._file.path if self._file is not None and self._file.created else None

    def open_file(self) -> str | None:
        """Create the trace file now (its header first) and return its path: a file that
        sits beside the trace takes its name from it. None without a folder, or when the
        file cannot be made (a sink error, counted)."""
        if self.directory is None:
            return None
        with self._write_lock:
            sink = self._line_outputs()[0]
            try:
                sink.start()  # the file and its header line (again, if it was deleted)
                self._started.add(id(sink))
            except Exception as exc:
                self._sink_failed(sink, exc)
                return None
            return self._file.path if self._file is not None else None

    def set_rank(self, rank: int) -> None:
        """Name the rank before the first flush (it goes in the file name and header)."""
        with self._write_lock, self._lock:
            if self.rank == rank:
                return
            self.rank = rank
            self.header.rank = rank
            if self._file is not None and not self._file.created:
                self._file = None

    def _line_outputs(self) -> list[Any]:
        outputs: list[Any] = []
        if self.directory is not None:
            if self._file is None:
                self._file = JsonlSink(
                    self.directory,
                    self.file_name or trace_file_name(rank=self.rank),
                    note=lambda message: self.warn_once("file:" + kind_of(message.split(" ", 1)[-1]), message),
                    header=self._header_line,
                    lost=self._file_lost,
                    max_bytes=self.settings.max_file_mb << 20,
                )
            outputs.append(self._file)
        return outputs + self._line_sinks

    def _header_line(self) -> str:
        """The header's JSON line (every file the trace's sink creates starts with it)."""
        try:
            return record_json(self.header)
        except Exception as exc:
            # Never without a header: the viewer needs one to read the file at all.
            self.internal_error(f"header: {type(exc).__name__}: {exc}")
            return Header(
                spectrace_version=__version__, pid=os.getpid(), host="", rank=self.rank, started_unix=time.time()
            ).model_dump_json()

    def _file_lost(self, lines: int, reason: str) -> None:
        """``lines`` records counted as written went with a deleted file: dropped, not written."""
        with self._count_lock:
            self.counters.bump("records_written", -min(lines, self.counters.records_written))
        self.count_dropped(lines, reason)

    def _file_capped(self, lines: int) -> None:
        """``lines`` per-step records left out of a file past SPECTRACE_MAX_FILE_MB: dropped
        and counted; said once (a coverage record, which the file still takes, and a warning)."""
        self.count_dropped(lines, "file size cap")
        if getattr(self, "_capped_said", False):
            return  # the count grows; the gap is said once
        self._capped_said = True
        self.coverage(
            "not_covered",
            f"SPECTRACE_MAX_FILE_MB: the trace file reached {self.settings.max_file_mb} MB; per-step records (calls, "
            "acceptance, fingerprints) after it are dropped and counted, findings, coverage and counters are still written",
        )

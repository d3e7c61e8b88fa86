"""The JSONL sink: one append-only file per process, written a whole line at a time.

The file is opened with ``O_APPEND`` and every batch goes out in ``os.write`` calls
that each carry whole lines, so a process killed with SIGKILL leaves a file whose
complete lines all load. Each process writes its own file (the name carries host, pid
and rank): O_APPEND keeps concurrent whole-line writes apart, but a writer killed in the
middle of a long write leaves a fragment that the next writer of a *shared* file would
extend (RELIABILITY.md measures it). A short write (disk full, file size limit) is cut
back off the file. The folder is created 0700 and the file 0600 (never
through a symlink): traces describe a user's model.

A line sink of the :class:`~spectrace.sinks.base.Sink` protocol: the recorder hands it
batches of JSON lines (header first) and counts what it raises.

    >>> sink = JsonlSink("traces", "trace-host-123.jsonl")
    >>> sink.write(['{"type": "counters"}'])
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Sequence

from .base import DEFAULT_TIMEOUT_S

MAX_WRITE = 1 << 20  # bytes per write() call; always a whole number of lines


def trace_file_name(pid: int | None = None, rank: int | None = None, host: str | None = None) -> str:
    """``trace-<host>-<pid>[-rank<r>].jsonl``"""
    host = (host or socket.gethostname() or "host").replace("/", "_")
    name = f"trace-{host}-{os.getpid() if pid is None else pid}"
    if rank is not None:
        name += f"-rank{rank}"
    return name + ".jsonl"


def ensure_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700 if it does not exist (existing folders keep theirs)."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)


class JsonlSink:
    """Appends JSON lines to ``directory/name``; opened on first write."""

    needs_objects = False  # the Sink protocol: write() gets JSON lines

    def __init__(self, directory: str, name: str) -> None:
        self.directory = directory
        self.name = name
        self._fd: int | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def _open(self) -> int:
        if self._fd is None:
            ensure_private_dir(self.directory)
            # Read access only to check a torn tail before cutting it (see _write_all).
            # O_NOFOLLOW: in a shared folder a planted symlink must not redirect the trace.
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(self.path, flags, 0o600)
        return self._fd

    def write(self, lines: Sequence[str]) -> None:
        """Write complete lines; raises OSError (the recorder counts it)."""
        if not lines:
            return
        fd = self._open()
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            data = (line + "\n").encode("utf-8")
            if chunk and size + len(data) > MAX_WRITE:
                _write_all(fd, b"".join(chunk))
                chunk, size = [], 0
            chunk.append(data)
            size += len(data)
        if chunk:
            _write_all(fd, b"".join(chunk))

    write_lines = write

    def flush(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Nothing is buffered here: a line is in the kernel once ``write`` returned
        (a SIGKILL keeps it; only a power loss could not)."""
        return True

    def shutdown(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        self.close()
        return True

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written != len(data):
        # A short write (disk full, file size limit) leaves half a line; the next write
        # that succeeds (space freed) would glue a whole line onto it. Cut the fragment.
        cut = _cut_torn_tail(fd, data[:written])
        raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes ({'torn line removed' if cut else 'torn line left'})")


def _cut_torn_tail(fd: int, fragment: bytes) -> bool:
    """Truncate ``fragment`` off the end of the file if it is still the file's tail."""
    if not fragment:
        return True
    try:
        size = os.fstat(fd).st_size
        if size >= len(fragment) and os.pread(fd, len(fragment), size - len(fragment)) == fragment:
            os.ftruncate(fd, size - len(fragment))
            return True
    except OSError:
        pass
    return False

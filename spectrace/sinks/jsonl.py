"""The JSONL sink: one append-only file per process, written a whole line at a time.

The file is opened with ``O_APPEND`` and every batch goes out in ``os.write`` calls
that each carry whole lines, so a process killed with SIGKILL leaves a file whose
complete lines all load. Each process writes its own file (the name carries host, pid
and rank): O_APPEND keeps concurrent whole-line writes apart, but a writer killed in the
middle of a long write leaves a fragment that the next writer of a *shared* file would
extend (RELIABILITY.md measures it). A short write (disk full, file size limit) is cut
back off the file. Traces describe a user's model, and the file name is predictable, so
the file is one spectrace made itself, now:

- it is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (and ``O_NONBLOCK``), mode 0600,
  inside the folder opened once: a FIFO, a symlink, or a file someone else made (another
  user's, a 0666 one, an earlier process's with the same pid) at that name is never
  opened, so never appended to and never waited on. The next free name is used instead
  (``trace-<host>-<pid>.2.jsonl``, ...) and a warning says so once.
- ``fstat`` then checks it is a regular, empty file owned by this user with one link.
- missing folders, parents included, are created 0700 whatever the umask (existing
  folders keep their mode).
- a file that disappears while written is noticed before each batch: deleted (a tmp
  cleaner, ``rm -rf`` of the folder, a pod volume gone) or renamed away, a new file is
  created at the name (folders again 0700), header first, and a warning says so once;
  the lines the deleted file held are reported to ``lost`` (the recorder moves them from
  ``records_written`` to ``records_dropped``: a count never calls a record written that
  no file holds). A file renamed away still holds its lines: nothing is lost then.
- when the name and every numbered one are taken (a container restarted again and again
  with pid 1 and one host name), a name with a random part is created, exclusively too.
- the way to the folder may pass symlinks owned by this user or root only: a symlink
  planted by another user (``SPECTRACE_DIR=/shared/traces`` with ``traces -> /etc``) is
  refused with one sink error, and the trace stays in memory. The kernel's
  ``fs.protected_symlinks`` does the same in sticky folders such as ``/tmp``; this holds
  everywhere.

A line sink of the :class:`~spectrace.sinks.base.Sink` protocol: the recorder hands it
batches of JSON lines (header first) and counts what it raises.

    >>> sink = JsonlSink("traces", "trace-host-123.jsonl")
    >>> sink.write(['{"type": "counters"}'])
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
import socket
import stat
from collections.abc import Callable, Sequence

from ..safe_files import make_private_dirs
from ..settings import warn
from .base import DEFAULT_TIMEOUT_S, safe_text

MAX_WRITE = 1 << 20  # bytes per write() call; always a whole number of lines
# What a file past its size cap (SPECTRACE_MAX_FILE_MB) no longer takes: the per-step
# records. The header, findings, coverage, counters and the rest stay (they say what the
# run found and what it lost, and are few).
CAPPED_KINDS = ('{"type":"call"', '{"type":"acceptance"', '{"type":"fingerprint"')
MAX_NAME_TRIES = 16  # taken numbered names tried (each is one failed open, no wait)
RANDOM_NAME_TRIES = 8  # then names with a random part (a clash of 32 random bits: never, in practice)
MAX_SYMLINKS = 40  # as the kernel's own bound (ELOOP)
_O = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def trace_file_name(pid: int | None = None, rank: int | None = None, host: str | None = None) -> str:
    """``trace-<host>-<pid>[-rank<r>].jsonl``"""
    host = (host or socket.gethostname() or "host").replace("/", "_")
    name = f"trace-{host}-{os.getpid() if pid is None else pid}"
    if rank is not None:
        name += f"-rank{rank}"
    return name + ".jsonl"


def check_symlinks(path: str) -> None:
    """Raise PermissionError when the way to ``path`` passes a symlink owned by another
    user (neither this one nor root); the rest of the way may not exist yet."""
    me = os.geteuid() if hasattr(os, "geteuid") else 0
    todo = [p for p in os.path.abspath(path).split(os.sep) if p]
    current = os.sep
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            return  # spectrace creates the rest itself
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if st.st_uid not in (me, 0):
            raise PermissionError(
                errno.EPERM,
                f"the way to the trace folder passes {candidate}, a symlink owned by uid {st.st_uid} (not you, not root): refused",
            )
        hops += 1
        if hops > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, f"too many symlinks on the way to {path}")
        target = os.readlink(candidate)
        if os.path.isabs(target):
            current = os.sep
        todo = [p for p in target.split(os.sep) if p] + todo


def ensure_private_dir(path: str) -> None:
    """Create ``path`` and its missing parents, each 0700 whatever the umask (existing
    folders keep theirs), after :func:`check_symlinks`."""
    absolute = os.path.abspath(path)
    check_symlinks(absolute)
    make_private_dirs(absolute)
    if not os.path.isdir(absolute):
        raise NotADirectoryError(errno.ENOTDIR, f"{path} is not a folder")


def numbered_name(name: str, n: int | str) -> str:
    """The ``n``-th name to try when ``name`` is taken: ``trace-h-1.jsonl`` -> ``trace-h-1.2.jsonl``."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.{n}.{ext}" if dot else f"{name}.{n}"


class JsonlSink:
    """Appends JSON lines to ``directory/name``; created (never reopened) on first write.

    ``note`` is told, once, when the name was taken and another one is used, and when the
    file disappeared and a new one is made (the recorder passes its warn-once; default: a
    warning line). ``header``: the first line of every file this sink creates (a file
    made again after a deletion starts with it too). ``lost(n, reason)``: told that ``n``
    lines written before are gone with a deleted file.
    """

    needs_objects = False  # the Sink protocol: write() gets JSON lines

    def __init__(
        self,
        directory: str,
        name: str,
        note: Callable[[str], None] | None = None,
        *,
        header: Callable[[], str] | None = None,
        lost: Callable[[int, str], None] | None = None,
        max_bytes: int = 0,
    ) -> None:
        self.directory = directory
        self.name = name
        self.note = note or warn
        self.header = header
        self.lost = lost
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file created
        self._headless = False  # a file created whose header line is not written yet
        self.lines_in_file = 0  # lines but the header in the current file
        self.files_made = 0
        self.max_bytes = max_bytes  # 0: no cap; past it, CAPPED_KINDS lines are not written
        self.bytes_in_file = 0

    @property
    def created(self) -> bool:
        """Whether a file was created (its name is then settled)."""
        return self._identity is not None

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def _open(self) -> int:
        if self._fd is None and self._identity is not None:
            self._fd = self._reopen()
        if self._fd is None:
            ensure_private_dir(self.directory)
            folder = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            try:
                self._fd = self._create(folder)
            finally:
                os.close(folder)
        return self._fd

    def _create(self, folder: int) -> int:
        """A new file of our own under ``folder`` (a descriptor: the folder cannot be swapped meanwhile)."""
        # Read access only to check a torn tail before cutting it (see _write_all).
        # O_EXCL: whatever already sits at the name (FIFO, symlink, someone's file) is
        # not opened at all. O_NONBLOCK: no open here may ever wait.
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NONBLOCK", 0) | _O
        first = self.name
        fd, name = create_own_file(folder, first, flags, self.directory)
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)
        self._headless = self.header is not None
        self.lines_in_file = 0
        self.bytes_in_file = 0
        self.files_made += 1
        if name != first:
            self.note(f"{os.path.join(self.directory, first)} already exists (an earlier process's, or planted): writing {name} instead")
        self.name = name
        return fd

    def _reopen(self) -> int:
        """The file created before, written again after a close (a record emitted at exit
        after the counters): the same file, or an error, never what replaced it."""
        flags = os.O_RDWR | os.O_APPEND | getattr(os, "O_NONBLOCK", 0) | _O
        fd = os.open(self.path, flags)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise PermissionError(errno.EPERM, f"{self.path} was replaced since spectrace created it: not written")
        return fd

    def check(self) -> None:
        """Notice a file deleted or renamed away since the last write: forget it (the next
        write creates a new one, header first), say so, and report the lines a deleted
        file took with it. Cheap (one ``fstat``, one ``lstat``); never raises."""
        fd = self._fd
        if fd is None or self._identity is None:
            return
        try:
            st = os.fstat(fd)
            if st.st_nlink > 0:
                try:
                    here = os.lstat(self.path)
                    if (here.st_dev, here.st_ino) == self._identity:
                        return  # still ours, at its name
                except OSError:
                    pass  # gone from its name (the folder renamed, or the file)
        except OSError:
            return  # cannot tell: keep writing where we write
        deleted = st.st_nlink == 0
        lost = self.lines_in_file if deleted else 0
        self._fd = None
        self._identity = None
        self.lines_in_file = 0
        try:
            os.close(fd)
        except OSError:
            pass
        if deleted:
            what = f"was deleted while tracing ({lost} record{'s' if lost != 1 else ''} lost with it, counted as dropped)"
        else:
            what = "was renamed or moved away while tracing (its records stay in it)"
        self.note(safe_text(f"{self.path} {what}: writing a new file there, header first"))
        if lost and self.lost is not None:
            self.lost(lost, "file deleted")

    def start(self) -> str:
        """Create the file now, its header written; returns its path. Raises OSError."""
        self.check()
        fd = self._open()
        if self._headless and self.header is not None:
            data = (self.header() + "\n").encode("utf-8")
            _write_all(fd, data)
            self.bytes_in_file += len(data)
            self._headless = False
        return self.path

    def write(self, lines: Sequence[str]) -> int:
        """Write complete lines; raises OSError (the recorder counts it). Returns how many
        per-step lines were left out for the size cap (``max_bytes``)."""
        if not lines:
            return 0
        self.check()
        fd = self._open()
        if self._headless and self.header is not None:
            lines = [self.header(), *lines]
            own = len(lines) - 1
        else:
            own = len(lines)
        chunk: list[bytes] = []
        size = capped = 0
        for line in lines:
            data = (line + "\n").encode("utf-8")
            if self.max_bytes and self.bytes_in_file + size + len(data) > self.max_bytes and line.startswith(CAPPED_KINDS):
                capped += 1
                continue
            if chunk and size + len(data) > MAX_WRITE:
                _write_all(fd, b"".join(chunk))
                self._headless = False  # the header went with the first chunk
                self.bytes_in_file += size
                chunk, size = [], 0
            chunk.append(data)
            size += len(data)
        if chunk:
            _write_all(fd, b"".join(chunk))
            self.bytes_in_file += size
        self._headless = False
        self.lines_in_file += own - capped
        return capped

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


def create_own_file(folder: int, first: str, flags: int, shown: str) -> tuple[int, str]:
    """A new file of this user's under the folder descriptor ``folder``: ``first``, or the
    next free numbered name; returns (descriptor, name). ``flags`` include O_CREAT | O_EXCL:
    whatever sits at a name already is never opened. ``shown``: the folder, for the error."""
    # The name, its numbered ones, then (every numbered name taken: a pid and host that
    # repeat across restarts) names with a random part, still created exclusively, so a
    # trace is never lost for want of a name.
    numbered = (first if n == 1 else numbered_name(first, n) for n in range(1, MAX_NAME_TRIES + 1))
    random = (numbered_name(first, secrets.token_hex(4)) for _ in range(RANDOM_NAME_TRIES))
    for name in itertools.chain(numbered, random):
        try:
            fd = os.open(name, flags, 0o600, dir_fd=folder)
        except FileExistsError:
            continue
        try:
            _check_own_file(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return fd, name
    raise FileExistsError(errno.EEXIST, f"{first}, {MAX_NAME_TRIES - 1} numbered and {RANDOM_NAME_TRIES} random names are taken in {shown}")


def _check_own_file(fd: int, name: str) -> None:
    """The file just created is what O_EXCL promised: regular, empty, ours, one link."""
    st = os.fstat(fd)
    me = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_nlink != 1 or st.st_size != 0:
        raise PermissionError(errno.EPERM, f"{name} is not a new regular file of this user's: not written")


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

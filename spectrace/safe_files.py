"""Reading and writing files a user names, without hanging, flooding or following a link.

A path in a setting (``SPECTRACE_CONTROL``, ``SPECTRACE_FINGERPRINT``) or on a command line
(``--out``) may name anything: a FIFO (a plain ``open`` blocks until a writer comes, on a
server's hot path or at start-up), a device (``/dev/zero`` reads until memory runs out),
a symlink planted at the name (a write through it lands in someone else's file). Both
helpers here refuse those with one line of text, and never block.

- :func:`open_regular` opens ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY``
  and checks with ``fstat`` *after* the open (no window between a check and the open) that
  it is a regular file; it returns the descriptor and the size.
- :func:`read_regular` reads such a file whole, refusing one larger than a bound.
- :func:`write_private` writes a new 0600 file beside the name (``O_CREAT | O_EXCL |
  O_NOFOLLOW``) and renames it over the name: a symlink already there is replaced, its
  target never opened; a half-written file never shows under the name.

This module imports nothing of spectrace and no torch (the checks and viewers use it too).

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> write_private(os.path.join(folder, "a", "fp.json"), b"{}")
    >>> read_regular(os.path.join(folder, "a", "fp.json"), max_bytes=1024)
    b'{}'
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_READ_CHUNK = 1 << 20


class SafeFileError(OSError):
    """A path that cannot be used, with a one-line reason naming it (its text is the message)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unusable file"


class NotRegularFile(SafeFileError):
    """Not a regular file: ``kind`` says what it is ("a FIFO", "a device", ...)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class FileMissing(SafeFileError):
    """Nothing at the path (a caller may take that as "not set yet")."""


class FileTooLarge(SafeFileError):
    """A regular file larger than the reader's bound."""


def shown(path: str | os.PathLike[str]) -> str:
    """A path as one line of ASCII text may show it: as it is when plain, else escaped
    (a newline or a terminal escape in a name must not forge or colour a line)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        return ascii(text)
    if text.isascii() and text.isprintable() and "'" not in text:
        return text
    return ascii(text)


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = False) -> tuple[int, int]:
    """Open ``path`` for reading if it is a regular file: ``(fd, size)``; the caller closes fd.

    Never blocks (a FIFO opens at once under ``O_NONBLOCK``, and is then refused), never
    follows a symlink at the last component unless ``follow_links``; raises
    :class:`SafeFileError` (:class:`NotRegularFile` for a FIFO, device, socket or folder)
    with a one-line message. The descriptor is blocking again when returned."""
    name = shown(path)
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | _NOCTTY | (0 if follow_links else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise NotRegularFile(f"{name} is a symbolic link (not followed): name the file itself", "a symbolic link") from None
        if exc.errno == errno.ENOENT:
            raise FileMissing(f"no file at {name}") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise NotRegularFile(f"{name} is not a regular file (a socket)", "a socket") from None
        raise SafeFileError(f"cannot open {name}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = kind_of(info.st_mode)
            raise NotRegularFile(f"{name} is not a regular file ({kind})", kind)
        if _NONBLOCK:
            os.set_blocking(fd, True)  # a regular file never blocks anyway; callers may wrap it
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; :class:`SafeFileError` otherwise.

    The bound is checked on the size before reading and again while reading (a file that
    grows meanwhile is refused, never read past the bound)."""
    fd, size = open_regular(path)
    try:
        if size > max_bytes:
            raise FileTooLarge(f"{shown(path)} is {size} bytes; at most {max_bytes} are read")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise FileTooLarge(f"{shown(path)} grew past {max_bytes} bytes while read")
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, SafeFileError):
            raise
        raise SafeFileError(f"cannot read {shown(path)}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def make_private_dirs(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` and its missing parents, each 0700 whatever the umask;
    folders that exist keep their mode."""
    directory = os.path.abspath(os.fspath(directory))
    missing: list[str] = []
    current = directory
    while not os.path.lexists(current):  # a file or a link at a name is not ours to replace
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, left as it is
        # The umask may have taken bits off: set 0700 through a descriptor of the folder
        # itself (O_NOFOLLOW: a link swapped in since is refused, never chmod-ed through).
        fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` at ``path`` as a 0600 file of this user's, replacing what is there.

    The bytes go into a new temporary file in the same folder (``O_CREAT | O_EXCL |
    O_NOFOLLOW``, 0600), then ``os.replace`` puts it at the name: a symlink planted at the
    name is replaced, its target never written; a reader never sees half a file. Missing
    folders are created 0700. Raises :class:`SafeFileError` with a one-line message."""
    target = os.path.abspath(os.fspath(path))
    folder, base = os.path.split(target)
    if not base:
        raise SafeFileError(f"{shown(path)} names a folder, not a file")
    try:
        make_private_dirs(folder)
        dir_fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise SafeFileError(f"cannot create the folder of {shown(path)}: {exc.strerror or exc}") from None
    try:
        temp = f".{base[:200]}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise SafeFileError(f"cannot write {shown(path)}: {exc.strerror or exc}") from None
        try:
            try:
                os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask left
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    if written <= 0:
                        raise OSError(errno.ENOSPC, "short write")
                    view = view[written:]
                os.fsync(fd)  # the rename below must not publish an empty file after a crash
            finally:
                os.close(fd)
            os.replace(temp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException as exc:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                reason = "a folder is there" if isinstance(exc, IsADirectoryError) else (exc.strerror or str(exc))
                raise SafeFileError(f"cannot write {shown(path)}: {reason}") from None
            raise
    finally:
        os.close(dir_fd)

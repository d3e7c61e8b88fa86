"""Pause and resume spectrace's per-step work at run time: ``SPECTRACE_CONTROL=PATH``.

A file whose first word is ``off`` pauses the per-step work (graph read-backs, and the
in-graph statistics kernels then read no rows); anything else, or no file, resumes it.
The file is looked at no more than every quarter second, so a hot path pays a clock read.
This is how a benchmark measures spectrace's cost inside one server: the same process,
GPU and KV state, with the work switched on and off in alternating windows.

Keep the file in a folder only you can write (not ``/tmp``): whoever can write it pauses
the statistics. It is read as a regular file only, never through a symlink, at most
:data:`MAX_BYTES`: a FIFO, a device or a link there is one warning and "not paused", never
a read that blocks the server.

    $ SPECTRACE=1 SPECTRACE_CONTROL=$HOME/spectrace.ctl python -m sglang.launch_server ...
    $ echo off > $HOME/spectrace.ctl    # paused within 0.25 s
"""

from __future__ import annotations

import time
from typing import Any

from .safe_files import FileMissing, SafeFileError, read_regular
from .settings import control_path, warn

CHECK_EVERY_S = 0.25
MAX_BYTES = 4096  # "off\n" is four: a larger file is not a control file
_state: dict[str, Any] = {"path": None, "next": 0.0, "paused": False, "read": False, "said": set()}


def _path() -> str:
    if not _state["read"]:
        _state["read"] = True
        _state["path"] = control_path() or None
    return _state["path"] or ""


def paused() -> bool:
    """Whether per-step work is paused now (cheap: a clock read between file checks).

    Never raises and never blocks: a file that cannot be read is "not paused"."""
    try:
        path = _path()
        if not path:
            return False
        now = time.monotonic()
        if now < _state["next"]:
            return bool(_state["paused"])
        _state["next"] = now + CHECK_EVERY_S
        _state["paused"] = _read_paused(path)
        return bool(_state["paused"])
    except Exception:  # a control file must never break the host's step
        return False


def _read_paused(path: str) -> bool:
    try:
        words = read_regular(path, MAX_BYTES).decode("utf-8", errors="replace").split()
    except FileMissing:
        return False  # no file (yet): per-step work runs, as documented
    except SafeFileError as exc:
        _say_once(f"SPECTRACE_CONTROL: {exc}; per-step work is not paused")
        return False
    except OSError as exc:
        _say_once(f"SPECTRACE_CONTROL: cannot read it ({exc.strerror or type(exc).__name__}); per-step work is not paused")
        return False
    return bool(words) and words[0].lower() == "off"


def _say_once(message: str) -> None:
    """One warning per distinct problem, not one every quarter second."""
    said: set[str] = _state["said"]
    if message not in said and len(said) < 16:
        said.add(message)
        warn(message)


def reset() -> None:
    """Read ``SPECTRACE_CONTROL`` again (tests)."""
    _state.update(path=None, next=0.0, paused=False, read=False, said=set())

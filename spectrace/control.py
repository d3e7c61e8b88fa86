"""Pause and resume spectrace's per-step work at run time: ``SPECTRACE_CONTROL=PATH``.

A file whose first word is ``off`` pauses the per-step work (graph read-backs, and the
in-graph statistics kernels then read no rows); anything else, or no file, resumes it.
The file is looked at no more than every quarter second, so a hot path pays a clock read.
This is how a benchmark measures spectrace's cost inside one server: the same process,
GPU and KV state, with the work switched on and off in alternating windows.

    $ SPECTRACE=1 SPECTRACE_CONTROL=/tmp/spectrace.ctl python -m sglang.launch_server ...
    $ echo off > /tmp/spectrace.ctl    # paused within 0.25 s
"""

from __future__ import annotations

import os
import time

CHECK_EVERY_S = 0.25
_state = {"path": None, "next": 0.0, "paused": False, "read": False}


def _path() -> str:
    if not _state["read"]:
        _state["read"] = True
        _state["path"] = os.environ.get("SPECTRACE_CONTROL", "").strip() or None
    return _state["path"] or ""


def paused() -> bool:
    """Whether per-step work is paused now (cheap: a clock read between file checks)."""
    path = _path()
    if not path:
        return False
    now = time.monotonic()
    if now < _state["next"]:
        return bool(_state["paused"])
    _state["next"] = now + CHECK_EVERY_S
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            words = handle.read(64).split()
        _state["paused"] = bool(words) and words[0].lower() == "off"
    except OSError:
        _state["paused"] = False
    return bool(_state["paused"])


def reset() -> None:
    """Read ``SPECTRACE_CONTROL`` again (tests)."""
    _state.update(path=None, next=0.0, paused=False, read=False)

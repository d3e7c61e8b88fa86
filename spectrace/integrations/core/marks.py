"""The mark a spectrace wrapper carries: which points it holds.

A wrapper's mark (an engine's own attribute name, e.g. ``__spectrace_vllm__``) is the set
of point keys on it and on everything it wraps. ``functools.wraps`` copies the mark onto any
wrapper an engine puts around ours, so a function already holding a point is seen as such
whichever route got there first, and is never patched twice.
"""

from __future__ import annotations

from typing import Any

# How far down a chain of ``__wrapped__`` to look: deep enough for any real stack of
# decorators, and bounded against a cycle.
MAX_DEPTH = 32
HOOK_ATTR = "__spectrace_hook__"  # on a guarded hook: the key of the point it serves


def keys_on(fn: Any, mark: str) -> set[str]:
    """Point keys already on ``fn`` or anything it wraps."""
    found: set[str] = set()
    depth = 0
    while fn is not None and depth < MAX_DEPTH:
        found |= set(getattr(fn, mark, ()) or ())
        fn = getattr(fn, "__wrapped__", None)
        depth += 1
    return found


def holds(fn: Any, mark: str, key: str) -> bool:
    """Is the point ``key`` on ``fn``: by mark (a direct patch), or as a guarded hook in the
    closure of a wrapper that is not ours (SGLang's HookRegistry keeps no mark)?"""
    depth = 0
    while fn is not None and depth < MAX_DEPTH:
        if key in set(getattr(fn, mark, ()) or ()):
            return True
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if getattr(cell.cell_contents, HOOK_ATTR, None) == key:
                    return True
            except ValueError:  # an empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        depth += 1
    return False

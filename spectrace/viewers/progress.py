"""Progress of long work on stderr, with rich's progress display, on a terminal only.

A piped or redirected stderr gets nothing at all (a log or a CI run keeps only the
command's own lines); so does ``TERM=dumb``. The display is transient: it is drawn while
the work runs and erased when it ends, so the screen afterwards is the command's output.
Loading a trace shows a bar only when the trace is large enough to take a moment.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .terminal import printable

# Below this many bytes a trace loads in a blink: no bar to flash and erase.
LARGE_TRACE_BYTES = 4 << 20


def on_terminal() -> bool:
    """Whether stderr is a terminal that can be redrawn (``FORCE_COLOR`` does not count)."""
    try:
        return os.isatty(sys.stderr.fileno()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):  # a replaced or closed stderr
        return False


def _progress(*columns: Any) -> Any:
    """A transient display on stderr. Its descriptions name files: every caller passes them
    through ``printable`` and shows them with ``markup=False``."""
    from rich.console import Console
    from rich.progress import Progress

    return Progress(*columns, console=Console(stderr=True), transient=True)


@contextlib.contextmanager
def load_progress(description: str, threshold: int = LARGE_TRACE_BYTES) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(bytes read, total bytes)`` callback for the trace loader, or None off a
    terminal. The bar appears at the first call for a load of at least ``threshold`` bytes."""
    if not on_terminal():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn

    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            if total < threshold:
                return
            bar = _progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(), TimeRemainingColumn())
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task(printable(description), total=total)
        state["bar"].update(state["task"], completed=done, total=total)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


@contextlib.contextmanager
def spinner(description: str) -> Iterator[None]:
    """A spinner and the time spent, for work whose length is unknown (loading a model)."""
    if not on_terminal():
        yield
        return
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    with _progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn()) as bar:
        bar.add_task(printable(description), total=None)
        yield


@contextlib.contextmanager
def counter(description: str) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a bar of steps, or None off a terminal."""
    if not on_terminal():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    with _progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task(printable(description), total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update

"""``spectrace view --follow``: the trace re-read as it grows, shown until Ctrl-C.

On a terminal, one screen redrawn in place (:class:`.follow.LiveScreen`: the status line,
what is new, the live findings, then acceptance and the data path cut to fit). Into a pipe
or with ``--json``, each new state printed after the last, never redrawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

from .follow import LiveScreen
from .loader import TraceFollower
from .model import TraceView, ViewBuilder, ViewFilter
from .notices import ProblemNotes
from .render import make_console, render_view


def follow(
    path: str,
    flt: ViewFilter,
    *,
    modules: bool,
    all_layers: bool,
    json: bool,
    interval: float,
    warn: Callable[[str], None],
) -> None:
    """Show ``path`` as it grows until Ctrl-C; ``warn`` says a problem in one line (stderr)."""
    follower = TraceFollower(path)
    console = make_console()
    seen: set[str] = set()
    follower.poll()
    builder = ViewBuilder(flt)  # folds in only what was appended since the last refresh
    screen = LiveScreen(path, flt, modules=modules)  # the live checks and what changed
    if json or not console.is_terminal:
        _stream(builder, follower, console, seen, screen, modules=modules, all_layers=all_layers, json=json, interval=interval, warn=warn)
        return
    live = Live(console=console, screen=True, auto_refresh=False, vertical_overflow="crop")
    view = None
    try:
        with live:
            changed = True
            while True:
                if changed:
                    # No stderr under the live screen: its banner shows each problem's
                    # count in place, redrawn as it grows.
                    _notices(follower, seen, warn=None)
                    view = builder.build(follower.trace_set)
                    screen.update(view, follower.notices)
                if changed or screen.due():
                    live.update(screen.frame(), refresh=True)
                time.sleep(max(0.05, interval))
                changed = follower.poll()
    except KeyboardInterrupt:
        pass
    if view is not None:  # leave the last state in the scrollback, as a plain view would
        console.print(render_view(view, modules=modules, all_layers=all_layers))


def _stream(
    builder: ViewBuilder,
    follower: TraceFollower,
    console: Console,
    seen: set[str],
    screen: LiveScreen,
    *,
    modules: bool,
    all_layers: bool,
    json: bool,
    interval: float,
    warn: Callable[[str], None],
) -> None:
    """Into a pipe or with --json: print each new state, separated, never redraw."""
    changed = True
    notes = ProblemNotes()  # a growing count of bad lines: said once a minute, not per poll
    try:
        while True:
            if changed:
                ts = follower.trace_set
                for msg in notes.due(ts.problems):
                    warn(msg)
                _notices(follower, seen, warn=warn)
                view = builder.build(ts)
                screen.update(view, follower.notices)
                if json:
                    sys.stdout.write(_json_line(view, screen) + "\n")
                    sys.stdout.flush()
                else:
                    console.rule(f"{sum(f.lines_read for f in ts.files)} lines read")
                    console.print(screen.status_line(view))
                    for found in screen.live_findings():
                        console.print(Text(f"live {found.severity}: {found.code}: {found.message}", style="bold yellow"))
                    console.print(render_view(view, modules=modules, all_layers=all_layers))
            time.sleep(max(0.05, interval))
            changed = follower.poll()
    except KeyboardInterrupt:
        return


def _json_line(view: TraceView, screen: LiveScreen) -> str:
    """One ``--follow --json`` line: the view model, and the live findings the screen shows
    above it (``live_findings``: found by the viewer, not yet written by the traced process)."""
    live = ",".join(f.model_dump_json() for f in screen.live_findings())
    text = view.model_dump_json()
    return f'{text[:-1]},"live_findings":[{live}]}}'


def _notices(follower: TraceFollower, seen: set[str], *, warn: Callable[[str], None] | None) -> None:
    """A file read again from the start (rotated, truncated): said once. On the live screen
    (``warn`` None) the status line says it (stderr would tear the screen); in a pipe, stderr does."""
    for i, notice in enumerate(follower.notices):
        key = f"\0notice {i}"
        if key not in seen:
            seen.add(key)
            if warn is not None:
                warn(notice)

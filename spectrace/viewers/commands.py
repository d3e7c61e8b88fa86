"""``spectrace view`` and ``spectrace diff``: argument parsing, paging, live follow, exit codes.

``view`` exits 0 when something was shown (partly bad input is a warning on stderr, one
line each); 1 when ``--fail-on`` is given and a finding at or above that severity is
shown; 2 when nothing was readable, the arguments are wrong, or a filter (``--module``,
``--rank``, ``--step``, ``--finding``) matches nothing in the trace (one line naming the
filter and what the trace holds). ``diff`` exits like diff(1). 1 is also a bug of ours.
Never a traceback (``SPECTRACE_DEBUG=1`` shows one). Every line on stderr is escaped like
the view itself (:func:`.terminal.printable`): a file name cannot drive the terminal.

    >>> view_main(["traces/", "--finding", "fc_bypass", "--no-pager"])
    0
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

from spectrace.records import SEVERITY_RANK

from .diff import DEFAULT_RTOL, diff_traces, render_diff
from .follow import LiveScreen
from .loader import TraceFollower, TraceSet, load_traces, shown_path
from .model import DEFAULT_WINDOW, TraceView, ViewBuilder, ViewFilter, build_view
from .notices import ProblemNotes
from .render import iter_lines, make_console, render_view
from .terminal import write_line

FOLLOW_INTERVAL_S = 0.5
FAIL_ON = ("error", "warning")

VIEW_EXAMPLES = """examples:
  spectrace view traces/                      every process of one run
  spectrace view traces/trace-h-42-rank0.jsonl --finding fc_bypass
  spectrace view traces/ --rank 1 --step 10:20 --modules --module '*fc'
  spectrace view traces/ --follow             a live screen while the server writes
  spectrace view traces/ --window 128         data path: recent span of 128 steps
  spectrace view traces/ --json | jq .findings
  spectrace view traces/ --fail-on error      in CI: exit 1 on an error finding
  spectrace view traces/ --calls --step 12    every call of step 12, each tensor's statistics
  spectrace view traces/ --jsonl --module '*fc' | jq .outputs   the raw call records

exit status:
  0  the view was shown (with --fail-on: and no finding at or above that severity)
  1  --fail-on: a finding at or above that severity is shown
  2  nothing readable, a bad argument, or a filter that matches nothing
"""

DIFF_EXAMPLES = """examples:
  spectrace diff trained/ served/             what changed between two runs
  spectrace diff a.jsonl b.jsonl --rtol 0.1   tighter statistics tolerance
  spectrace diff trained/ served/ --json

The data path, the capture, acceptance and findings come first, then other modules; shapes
are compared with the batch and token dimensions set aside (docs/diff.md).
exit status: 0 the traces agree, 1 they differ, 2 bad input
"""


class _Usage(Exception):
    """A bad argument value: one line, exit 2."""


def _step_range(text: str) -> tuple[int | None, int | None]:
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            return (int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)
        n = int(text)
        return n, n
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step wants N or A:B, got {text!r}") from None


def add_trace_filters(p: argparse.ArgumentParser, module_help: str = "only modules matching GLOB (full name or dotted suffix)") -> None:
    """The filters every trace reader takes: ``--module``, ``--rank``, ``--step``."""
    p.add_argument("--module", metavar="GLOB", help=module_help)
    p.add_argument("--rank", type=int, metavar="N", help="only the process of this rank")
    p.add_argument("--step", type=_step_range, metavar="N|A:B", help="only these steps (A: or :B leave one end open)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 1, got {text!r}")
    return n


def _view_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spectrace view",
        description="Show a spectrace trace: findings, the EAGLE-3 data path, acceptance, modules.",
        epilog=VIEW_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a trace-*.jsonl file or a folder of them")
    add_trace_filters(p, "only modules matching GLOB (full name or dotted suffix): findings, data path, module table")
    p.add_argument("--finding", metavar="CODE", help="only findings with this code")
    p.add_argument("--modules", action="store_true", help="show the per-module table")
    p.add_argument(
        "--all-layers", action="store_true", help="one module row per layer (repeated layers are folded into one row by default)"
    )
    p.add_argument(
        "--window",
        type=_positive,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"the data path's recent span: the last N traced steps (default {DEFAULT_WINDOW})",
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="a live screen as lines are appended: status, what is new, live findings (docs/follow.md; Ctrl-C quits)",
    )
    p.add_argument("--json", action="store_true", help="print the view model as JSON")
    p.add_argument(
        "--calls", action="store_true", help="every selected call, with each tensor's shape, dtype and statistics (as spectrace calls)"
    )
    p.add_argument("--jsonl", action="store_true", help="the selected call records as written, one JSON object per line, for jq")
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        metavar="{error,warning}",
        help="exit 1 when a finding of this severity or worse is shown (error; warning: warnings and errors)",
    )
    p.add_argument("--no-pager", action="store_true", help="never page long output")
    p.add_argument("--interval", type=float, default=FOLLOW_INTERVAL_S, help=argparse.SUPPRESS)
    return p


def _diff_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spectrace diff",
        description="Compare two traces: shapes, dtypes, statistics, capture boundaries, per-chunk fingerprints, acceptance and findings.",
        epilog=DIFF_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", help="trace file or folder (reference)")
    p.add_argument("b", help="trace file or folder (compared)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance for statistics (default {DEFAULT_RTOL})")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    return p


def _guard(prog: str, body: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a command body; every failure becomes one line on stderr and an exit status."""
    try:
        return body(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    except _Usage as exc:
        _err(f"{prog}: error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `spectrace view ... | head`
        _silence_stdout()
        return 0
    except Exception as exc:  # noqa: BLE001 - the user gets one line, not a traceback
        if os.environ.get("SPECTRACE_DEBUG"):
            traceback.print_exc()
        _err(f"{prog}: error: internal error ({type(exc).__name__}: {exc}); SPECTRACE_DEBUG=1 shows the traceback")
        return 1


def _err(line: str) -> None:
    write_line(sys.stderr, line)


def _silence_stdout() -> None:
    # Python flushes stdout at exit; after EPIPE that would print a second error.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except Exception:  # noqa: BLE001
        pass


def _warn_problems(prog: str, ts: TraceSet, seen: set[str] | None = None) -> None:
    for problem in ts.problems:
        msg = problem.message
        if seen is not None:
            if msg in seen:
                continue
            seen.add(msg)
        _err(f"{prog}: warning: {msg}")


def _nothing_readable(ts: TraceSet) -> str:
    problems = ts.problems
    if problems:
        first = problems[0].message
        return first if len(problems) == 1 else f"{first} (and {len(problems) - 1} more problems)"
    return f"{shown_path(ts.source)}: no readable records"


# ------------------------------------------------------------------------------- view
def view_main(argv: list[str]) -> int:
    """Entry point of ``spectrace view``; returns the exit status."""
    return _guard("spectrace view", _view, argv)


def _view(argv: list[str]) -> int:
    args = _view_parser().parse_args(argv)
    lo, hi = args.step if args.step else (None, None)
    flt = ViewFilter(module=args.module, rank=args.rank, step_min=lo, step_max=hi, finding=args.finding, window_steps=args.window)
    if args.calls or args.jsonl:
        # The per-call drill-down lives in spectrace calls (calls.py); the same filters.
        from .calls import calls_main

        step = None if args.step is None else f"{'' if lo is None else lo}:{'' if hi is None else hi}"
        given = [("--module", args.module), ("--rank", args.rank), ("--step", step)]
        return calls_main([args.path, *[a for k, v in given if v is not None for a in (k, str(v))], *(["--jsonl"] if args.jsonl else [])])
    if args.follow:
        return _follow(args, flt)
    ts = load_traces(args.path)
    if not ts.readable:
        _err(f"spectrace view: error: {_nothing_readable(ts)}")
        return 2
    _warn_problems("spectrace view", ts)
    view = build_view(ts, flt)
    if view.filter_problem:
        _err(f"spectrace view: error: {view.filter_problem}")
        return 2
    status = _fail_on_status(view, args.fail_on)
    if args.json:
        sys.stdout.write(view.model_dump_json(indent=2) + "\n")
        return status
    console = make_console()
    renderable = render_view(view, modules=args.modules, all_layers=args.all_layers)
    if not args.no_pager and console.is_terminal:
        if len(list(iter_lines(renderable, console.width))) > console.height:
            os.environ.setdefault("LESS", "-R")  # let less pass colours through
            with console.pager(styles=True):
                console.print(renderable)
            return status
    console.print(renderable)
    return status


def _fail_on_status(view: TraceView, fail_on: str | None) -> int:
    """1 when a shown finding is at least as severe as ``--fail-on``: CI gates on the exit."""
    if fail_on is None:
        return 0
    worst = SEVERITY_RANK[fail_on]
    return 1 if any(SEVERITY_RANK.get(f.severity, 9) <= worst for f in view.findings) else 0


def _follow(args: argparse.Namespace, flt: ViewFilter) -> int:
    follower = TraceFollower(args.path)
    console = make_console()
    seen: set[str] = set()
    follower.poll()
    builder = ViewBuilder(flt)  # folds in only what was appended since the last refresh
    screen = LiveScreen(args.path, flt, modules=args.modules)  # the live checks and what changed
    if args.json or not console.is_terminal:
        return _follow_stream(args, builder, follower, console, seen, screen)
    # On a terminal: one screen, redrawn in place (follow.py): the status line, what is
    # new, the findings one line each, then acceptance and the data path cut to fit.
    live = Live(console=console, screen=True, auto_refresh=False, vertical_overflow="crop")
    view = None
    try:
        with live:
            changed = True
            while True:
                if changed:
                    # No stderr under the live screen: its banner shows each problem's
                    # count in place, redrawn as it grows.
                    _warn_notices(follower, seen, screen=True)
                    view = builder.build(follower.trace_set)
                    screen.update(view, follower.notices)
                if changed or screen.due():
                    live.update(screen.frame(), refresh=True)
                time.sleep(max(0.05, args.interval))
                changed = follower.poll()
    except KeyboardInterrupt:
        pass
    if view is not None:  # leave the last state in the scrollback, as a plain view would
        console.print(render_view(view, modules=args.modules, all_layers=args.all_layers))
    return 0


def _follow_stream(
    args: argparse.Namespace, builder: ViewBuilder, follower: TraceFollower, console: Console, seen: set[str], screen: LiveScreen
) -> int:
    """--follow into a pipe or with --json: print each new state, separated, never redraw."""
    changed = True
    notes = ProblemNotes()  # a growing count of bad lines: said once a minute, not per poll
    try:
        while True:
            if changed:
                ts = follower.trace_set
                for msg in notes.due(ts.problems):
                    _err(f"spectrace view: warning: {msg}")
                _warn_notices(follower, seen, screen=False)
                view = builder.build(ts)
                screen.update(view, follower.notices)
                if args.json:
                    sys.stdout.write(_follow_json(view, screen) + "\n")
                    sys.stdout.flush()
                else:
                    console.rule(f"{sum(f.lines_read for f in ts.files)} lines read")
                    console.print(screen.status_line(view))
                    for found in screen.live_findings():
                        console.print(Text(f"live {found.severity}: {found.code}: {found.message}", style="bold yellow"))
                    console.print(render_view(view, modules=args.modules, all_layers=args.all_layers))
            time.sleep(max(0.05, args.interval))
            changed = follower.poll()
    except KeyboardInterrupt:
        return 0


def _follow_json(view: TraceView, screen: LiveScreen) -> str:
    """One ``--follow --json`` line: the view model, and the live findings the screen shows
    above it (``live_findings``: found by the viewer, not yet written by the traced process)."""
    live = ",".join(f.model_dump_json() for f in screen.live_findings())
    text = view.model_dump_json()
    return f'{text[:-1]},"live_findings":[{live}]}}'


def _warn_notices(follower: TraceFollower, seen: set[str], *, screen: bool) -> None:
    """A file read again from the start (rotated, truncated): said once. On the live screen
    the status line says it (stderr would tear the screen); in a pipe, stderr does."""
    for i, notice in enumerate(follower.notices):
        key = f"\0notice {i}"
        if key not in seen:
            seen.add(key)
            if not screen:
                _err(f"spectrace view: warning: {notice}")


# ------------------------------------------------------------------------------- diff
def diff_main(argv: list[str]) -> int:
    """Entry point of ``spectrace diff``; like diff(1): 0 the traces agree, 1 they differ, 2 trouble."""
    return _guard("spectrace diff", _diff, argv)


def _diff(argv: list[str]) -> int:
    args = _diff_parser().parse_args(argv)
    if not args.rtol >= 0:
        raise _Usage(f"--rtol must be >= 0, got {args.rtol}")
    sets = [load_traces(args.a), load_traces(args.b)]
    for label, ts in zip("AB", sets):
        if not ts.readable:
            _err(f"spectrace diff: error: {label}: {_nothing_readable(ts)}")
            return 2
        _warn_problems("spectrace diff", ts)
    result = diff_traces(sets[0], sets[1], rtol=args.rtol)
    status = 1 if result.differences else 0  # scripts can gate on "train and serve agree"
    if args.json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return status
    make_console().print(render_diff(result))
    return status

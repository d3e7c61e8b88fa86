"""``spectrace view``: findings first, then the data path; ``--follow`` for a live screen.

Exits 0 when something was shown (partly bad input is a warning on stderr, one line
each); 1 when ``--fail-on`` is given and a finding at or above that severity is shown; 2
when nothing was readable, the arguments are wrong, or a filter (``--module``, ``--rank``,
``--step``, ``--finding``) matches nothing in the trace (one line naming the filter and
what the trace holds). ``--follow`` ends with 0 at Ctrl-C: that is how it is quit.

    >>> main(["traces/", "--finding", "fc_bypass", "--no-pager"])
    0
"""

from __future__ import annotations

import argparse
import os
import sys

from ..records import SEVERITY_RANK
from ..viewers.model import DEFAULT_WINDOW, TraceView, build_view
from ..viewers.render import iter_lines, make_console, render_view
from .errors import FOUND, OK, UsageError, parser, run, say
from .traces import add_trace_filters, load, positive, trace_filter

PROG = "spectrace view"
FOLLOW_INTERVAL_S = 0.5
FAIL_ON = ("error", "warning")

EXAMPLES = """examples:
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
  1  --fail-on: a finding at or above that severity is shown (a closing line on stderr names them)
  2  nothing readable, a bad argument, or a filter that matches nothing
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "Show a spectrace trace: findings, the EAGLE-3 data path, acceptance, modules.", EXAMPLES)
    p.add_argument("path", help="a trace-*.jsonl file or a folder of them")
    add_trace_filters(p, "only modules matching GLOB (full name or dotted suffix): findings, data path, module table")
    p.add_argument("--finding", metavar="CODE", help="only findings with this code")
    p.add_argument("--modules", action="store_true", help="show the per-module table")
    p.add_argument(
        "--all-layers", action="store_true", help="one module row per layer (repeated layers are folded into one row by default)"
    )
    p.add_argument(
        "--window",
        type=positive,
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


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace view``; returns the exit status."""
    return run(PROG, _view, argv)


def _view(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    flt = trace_filter(args, finding=args.finding, window_steps=args.window)
    if args.calls or args.jsonl:
        # The per-call drill-down is spectrace calls (cli/calls.py), with the same filters.
        from .calls import main as calls_main

        lo, hi = args.step if args.step else (None, None)
        step = None if args.step is None else f"{'' if lo is None else lo}:{'' if hi is None else hi}"
        given = [("--module", args.module), ("--rank", args.rank), ("--step", step)]
        return calls_main([args.path, *[a for k, v in given if v is not None for a in (k, str(v))], *(["--jsonl"] if args.jsonl else [])])
    if args.follow:
        from ..viewers.live import follow

        follow(args.path, flt, modules=args.modules, all_layers=args.all_layers, json=args.json, interval=args.interval, warn=_warn)
        return OK  # Ctrl-C is how a live view is quit
    ts = load(PROG, args.path)
    view = build_view(ts, flt)
    if view.filter_problem:
        raise UsageError(view.filter_problem)
    status = fail_on_status(view, args.fail_on)
    if args.json:
        sys.stdout.write(view.model_dump_json(indent=2) + "\n")
        return _said_why(view, args.fail_on, status)
    console = make_console()
    renderable = render_view(view, modules=args.modules, all_layers=args.all_layers)
    if not args.no_pager and console.is_terminal:
        if len(list(iter_lines(renderable, console.width))) > console.height:
            os.environ.setdefault("LESS", "-R")  # let less pass colours through
            with console.pager(styles=True):
                console.print(renderable)
            return _said_why(view, args.fail_on, status)
    console.print(renderable)
    return _said_why(view, args.fail_on, status)


def _said_why(view: TraceView, fail_on: str | None, status: int) -> int:
    """The closing line of a run that --fail-on fails (stderr: stdout stays the view): a CI
    log that ends in exit 1 says which findings did it."""
    if status == FOUND and fail_on is not None:
        worst = SEVERITY_RANK[fail_on]
        codes = list(dict.fromkeys(f.code for f in view.findings if SEVERITY_RANK.get(f.severity, 9) <= worst))
        shown = ", ".join(codes[:4]) + (f" (+{len(codes) - 4} more)" if len(codes) > 4 else "")
        said = "an error" if fail_on == "error" else f"a {fail_on} or worse"
        say(f"{PROG}: exit 1 (--fail-on {fail_on}): {len(codes)} finding code{'s' if len(codes) != 1 else ''} at {said}: {shown}")
    return status


def _warn(message: str) -> None:
    say(f"{PROG}: warning: {message}")


def fail_on_status(view: TraceView, fail_on: str | None) -> int:
    """1 when a shown finding is at least as severe as ``--fail-on``: CI gates on the exit."""
    if fail_on is None:
        return OK
    worst = SEVERITY_RANK[fail_on]
    return FOUND if any(SEVERITY_RANK.get(f.severity, 9) <= worst for f in view.findings) else OK

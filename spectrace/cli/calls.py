"""``spectrace calls``: a trace's calls one by one, every tensor's shape, dtype and statistics.

The filters are ``view``'s plus ``--role``; one that matches nothing is one line on stderr
and exit 2, worded as ``view`` words it.

    >>> main(["spectrace-demo/fc_bypass", "--role", "draft.fc", "--limit", "2"])
    0
"""

from __future__ import annotations

import argparse
import os

from rich.console import Group

from ..viewers.calls import DEFAULT_LIMIT, render_calls, select_calls, selection_problem, write_json_array, write_jsonl
from ..viewers.render import make_console
from .errors import OK, UsageError, parser, run
from .traces import add_trace_filters, load, trace_filter

PROG = "spectrace calls"

EXAMPLES = """examples:
  spectrace calls traces/ --step 12             every call of step 12, every tensor
  spectrace calls traces/ --role draft.fc       the draft's fc, call by call
  spectrace calls traces/ --module '*layers.0' --step 10:20 --limit 5
  spectrace calls traces/ --role 'target.layer[*]' --rank 1
  spectrace calls traces/ --jsonl | jq -c 'select(.outputs[0].stats.nan > 0)'
  spectrace calls traces/ --role draft.fc --json | jq '.[0].inputs'

--module and --role are globs: * stays within one dotted part, ** crosses dots.
Statistics are mean, std and absmax; nan and inf counts show when they are not zero.
exit status: 0 calls shown, 2 nothing readable, a bad argument or a filter that matches nothing
"""


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 0 (0: no limit), got {text!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Print a trace's calls one by one: step, call, module, role, forward mode, and every "
        "argument's and output's shape, dtype and statistics.",
        EXAMPLES,
    )
    p.add_argument("path", help="a trace-*.jsonl file or a folder of them")
    add_trace_filters(p)
    p.add_argument("--role", metavar="GLOB", help="only calls whose role matches GLOB (draft.fc, 'target.layer[*]', 'draft.*')")
    p.add_argument(
        "--limit",
        type=_limit,
        metavar="N",
        help=f"at most N calls (0: all; text shows the first {DEFAULT_LIMIT} unless told, --jsonl and --json all)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--jsonl", action="store_true", help="print the selected call records, one JSON object per line, as written")
    out.add_argument("--json", action="store_true", help="print the selected call records as one JSON array")
    p.add_argument("--no-pager", action="store_true", help="never page long output")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace calls``; returns the exit status."""
    return run(PROG, _calls, argv)


def _calls(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    flt = trace_filter(args)
    ts = load(PROG, args.path)
    selected = select_calls(ts, flt, args.role)
    if not selected:
        raise UsageError(selection_problem(ts, flt, args.role))
    limit = args.limit or None  # 0 and unset: no limit, but text has its default
    if args.jsonl or args.json:
        chosen = selected if limit is None else selected[:limit]
        (write_jsonl if args.jsonl else write_json_array)(chosen)
        return OK
    if args.limit is None:
        limit = DEFAULT_LIMIT
    console = make_console()
    lines = list(render_calls(selected, limit, console.width))
    text = Group(*lines)  # each line is cut to the width, never wrapped: one line each
    if not args.no_pager and console.is_terminal and len(lines) > console.height:
        os.environ.setdefault("LESS", "-R")  # let less pass colours through
        with console.pager(styles=True):
            console.print(text)
        return OK
    console.print(text)
    return OK

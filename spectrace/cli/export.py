"""``spectrace export``: a trace as Chrome / Perfetto trace JSON (``viewers/export.py``).

Exit 0 when written; 2 when nothing was readable, an argument is wrong, a filter matches
nothing, or the path cannot be written (an existing file needs ``--force``).

    >>> main(["spectrace-demo/fc_bypass", "-o", "fc_bypass.json"])
    0
"""

from __future__ import annotations

import argparse
import sys

from ..viewers.calls import select_calls, selection_problem
from ..viewers.export import WriteRefused, build_timeline, not_drawn_lines, refuse_to_clobber, write_new_file
from ..viewers.loader import shown_path
from ..viewers.render import plural
from ..viewers.terminal import write_line
from .errors import OK, UsageError, parser, run, say
from .traces import add_trace_filters, load, trace_filter

PROG = "spectrace export"

EXAMPLES = """examples:
  spectrace export traces/ -o run.json              every process of one run
  spectrace export traces/ -o run.json --step 100:140 --rank 0
  spectrace export spectrace-demo/fc_bypass -o - | gzip > fc_bypass.json.gz
  spectrace export traces/ -o run.json --force      replace run.json

Open the file at https://ui.perfetto.dev (Open trace file) or in chrome://tracing.
Calls are drawn from the end of the call before them to their own time stamp: the
records say when a call returned, not when it began (docs/export.md).
exit status: 0 written, 2 nothing readable, a bad argument, a filter that matches nothing,
or a path that cannot be written (an existing file needs --force)
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Write a trace as Chrome Trace Event Format JSON: steps, module calls with their tensors, "
        "findings and accept length on a timeline (ui.perfetto.dev, chrome://tracing).",
        EXAMPLES,
    )
    p.add_argument("path", help="a trace-*.jsonl file or a folder of them")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the JSON file to write ('-': standard output)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    add_trace_filters(p)
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace export``; returns the exit status."""
    return run(PROG, _export, argv)


def _export(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    flt = trace_filter(args)
    try:
        if args.output != "-":
            refuse_to_clobber(args.output, force=args.force)  # before any work; checked again when writing
        ts = load(PROG, args.path)
        selected = select_calls(ts, flt)
        filtered = any(x is not None for x in (args.module, args.rank, flt.step_min, flt.step_max))
        if filtered and not selected:
            raise UsageError(selection_problem(ts, flt, None))
        trace = build_timeline(ts, flt, selected)
        text = trace.model_dump_json(exclude_none=True)
        if args.output == "-":
            sys.stdout.write(text + "\n")
        else:
            write_new_file(args.output, text + "\n", force=args.force)
    except WriteRefused as exc:
        raise UsageError(str(exc)) from None
    for line in not_drawn_lines(trace.otherData.not_drawn):
        say(f"{PROG}: warning: {line}")
    n = trace.otherData.counts
    write_line(
        sys.stderr if args.output == "-" else sys.stdout,
        f"wrote {shown_path(args.output) if args.output != '-' else 'standard output'}: "
        f"{plural(n.processes, 'process', 'processes')}, {plural(n.steps, 'step')}, {plural(n.calls, 'call')}, "
        f"{plural(n.findings, 'finding')}, {plural(n.acceptance_points, 'accept-length point')}; "
        "open it at https://ui.perfetto.dev or chrome://tracing",
    )
    return OK

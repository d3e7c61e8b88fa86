"""``spectrace diff A B``: what changed between two traces; exits like diff(1).

0 the traces agree, 1 they differ, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import sys

from ..viewers.diff import DEFAULT_RTOL, diff_traces, render_diff
from ..viewers.render import make_console
from .errors import FOUND, OK, USAGE, UsageError, parser, run
from .traces import load

PROG = "spectrace diff"

EXAMPLES = """examples:
  spectrace diff trained/ served/             what changed between two runs
  spectrace diff a.jsonl b.jsonl --rtol 0.1   tighter statistics tolerance
  spectrace diff trained/ served/ --json

The data path, the capture, acceptance and findings come first, then other modules; shapes
are compared with the batch and token dimensions set aside (docs/diff.md).
exit status: 0 the traces agree, 1 they differ, 2 bad input
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Compare two traces: shapes, dtypes, statistics, capture boundaries, per-chunk fingerprints, acceptance and findings.",
        EXAMPLES,
    )
    p.add_argument("a", help="trace file or folder (reference)")
    p.add_argument("b", help="trace file or folder (compared)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance for statistics (default {DEFAULT_RTOL})")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace diff``: 0 the traces agree, 1 they differ, 2 trouble."""
    return run(PROG, _diff, argv, internal=USAGE)


def _diff(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.rtol >= 0:
        raise UsageError(f"--rtol must be >= 0, got {args.rtol}")
    a = load(PROG, args.a, "A")
    b = load(PROG, args.b, "B")
    result = diff_traces(a, b, rtol=args.rtol)
    status = FOUND if result.differences else OK  # scripts can gate on "train and serve agree"
    if args.json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return status
    make_console().print(render_diff(result))
    return status

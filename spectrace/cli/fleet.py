"""``spectrace fleet``: which instances report which root causes, from Prometheus (``spectrace/fleet.py``).

Exit 0; 1 with ``--fail-on`` when a root cause of that severity or worse is reported; 2 when
Prometheus could not be asked or an argument is wrong.
"""

from __future__ import annotations

import argparse

from ..fleet import TIMEOUT_S, FleetError, collect, render, worst
from .errors import FOUND, OK, UsageError, parser, run

PROG = "spectrace fleet"
FAIL_ON = {"error": 0, "warning": 1, "info": 2, "never": -1}  # the worst severity rank that fails

EXAMPLES = """examples:
  spectrace fleet --prometheus http://prometheus:9090                  root causes by instance, accept length, who is silent
  spectrace fleet --prometheus http://prometheus:9090 --job sglang --json | jq '.instances[]'
  spectrace fleet --prometheus http://prometheus:9090 --fail-on error  exit 1 on an error root cause (CI, alerts)

Exit codes: 0, 1 (--fail-on), 2 (Prometheus could not be asked, or a usage error).
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "Which instances of a fleet report which root causes, and their accept length, from a Prometheus server.", EXAMPLES)
    p.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus server, e.g. http://prometheus:9090")
    p.add_argument("--job", default=None, help="only the targets of this scrape job")
    p.add_argument("--json", action="store_true", help="print the fleet as JSON, for scripts")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, metavar="S", help=f"seconds for all the queries together (default {TIMEOUT_S:g})"
    )
    p.add_argument(
        "--fail-on", choices=list(FAIL_ON), default="never", help="exit 1 when a root cause of this severity or worse is reported"
    )
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace fleet``; returns the exit status."""
    return run(PROG, _fleet, argv)


def _fleet(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.timeout <= 3600:
        raise UsageError(f"--timeout {args.timeout:g}: give 0 < S <= 3600 seconds")
    try:
        fleet = collect(args.prometheus, args.job, args.timeout)
    except FleetError as exc:
        raise UsageError(str(exc)) from None
    print(fleet.model_dump_json(indent=2) if args.json else render(fleet))
    level, found = FAIL_ON[args.fail_on], worst(fleet)
    return FOUND if level >= 0 and found is not None and found <= level else OK

"""``spectrace demo``: the EAGLE-3 reference pipeline healthy and under every bug switch, traced.

Runs every scenario of ``spectrace/demo.py``, one progress line per scenario on stderr,
then the report on stdout; exit 1 when the healthy scenario produced an error finding (a
false positive of ours).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .errors import FOUND, OK, parser, run
from .invocation import invocation

EXAMPLES = """
examples:
  spectrace demo                          every scenario, into ./spectrace-demo
  spectrace demo --bug fc_bypass --out d  one scenario, into ./d/fc_bypass"""


def build_parser() -> argparse.ArgumentParser:
    from ..demo import DEFAULT_OUT
    from ..eagle3.bugs import BUGS

    p = parser(
        "spectrace demo",
        "Run the tiny EAGLE-3 pipeline healthy and under every bug switch, traced.",
        "scenarios: " + ", ".join(BUGS) + "\nthen: spectrace view DIR/<scenario>\n" + EXAMPLES,
    )
    p.add_argument("--bug", action="append", choices=list(BUGS), help="run only this scenario (repeatable)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the traces (default: ./{DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--details", action="store_true", help="every finding under its scenario: what was seen, the cause, the fix")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace demo``; returns the exit status."""
    return run("spectrace demo", _demo, argv)


def _demo(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..demo import reference_fingerprint, report_lines, run_scenario
    from ..eagle3.bugs import BUGS

    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    import torch

    # The pair is 64 wide: one thread is faster than torch's pool, and two demos side by side
    # on two cores no longer fight (95 s each with the pool, 23 s with one thread).
    torch.set_num_threads(1)
    started = time.perf_counter()
    names = args.bug or list(BUGS)
    reference = reference_fingerprint()
    results = []
    for n, name in enumerate(names, 1):
        # Progress on stderr, so that --json and a pipe still get only the results.
        sys.stderr.write(f"[{n}/{len(names)}] {name} ...")
        sys.stderr.flush()
        result = run_scenario(name, args.out, reference)
        results.append(result)
        sys.stderr.write(f" accept {result.accept_length:.2f}, {result.seconds:.1f} s\n")
    total = time.perf_counter() - started
    if args.json:
        scenarios = [
            {
                "name": r.name,
                "accept_length": round(r.accept_length, 3),
                "steps": r.steps,
                "trace_dir": r.trace_dir,
                "findings": [f.model_dump(mode="json") for f in r.findings],
            }
            for r in results
        ]
        print(json.dumps({"seconds": round(total, 2), "scenarios": scenarios}, indent=2))
        return OK
    from rich.console import Console

    console = Console(highlight=False)
    width = min(console.width, 100)  # wider lines read worse; 80 columns fit every line
    for line in report_lines(results, width, details=args.details):
        console.print(line, overflow="fold")
    pattern = os.path.join(args.out, "<scenario>")
    how = invocation()  # the commands below as this shell can run them (demo.sh: the venv not activated)
    if how.hint:
        console.print(how.hint, overflow="fold")
    console.print(
        f"{len(results)} scenario{'s' if len(results) != 1 else ''} in {total:.1f} s. Read one: {how.command} view {pattern}",
        overflow="fold",
    )
    if not args.details:
        console.print(f"Every finding, its cause and fix: {how.command} demo --details, or {how.command} view.", overflow="fold")
    healthy = [r for r in results if r.name == "healthy"]
    if healthy and healthy[0].errors:
        sys.stderr.write("spectrace demo: the healthy scenario produced an error finding (a false positive)\n")
        return FOUND
    return OK

"""``spectrace demo`` and ``spectrace fingerprint``: the reference pipeline, from the command line.

``demo`` runs every scenario of ``spectrace/demo.py`` (healthy and each bug switch), one
progress line per scenario on stderr, then the report on stdout; exit 1 when the healthy
scenario produced an error finding (a false positive of ours). ``fingerprint`` writes the
healthy pipeline's fused-input fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .errors import FOUND, OK, parser, run

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
    console.print(
        f"{len(results)} scenario{'s' if len(results) != 1 else ''} in {total:.1f} s. Read one: spectrace view {pattern}", overflow="fold"
    )
    if not args.details:
        console.print("Every finding, its cause and fix: spectrace demo --details, or spectrace view.", overflow="fold")
    healthy = [r for r in results if r.name == "healthy"]
    if healthy and healthy[0].errors:
        sys.stderr.write("spectrace demo: the healthy scenario produced an error finding (a false positive)\n")
        return FOUND
    return OK


def fingerprint_parser() -> argparse.ArgumentParser:
    p = parser(
        "spectrace fingerprint",
        "Record per-chunk statistics of the fused draft input cat(hs[b0], hs[b1], hs[b2]) "
        "from the healthy reference pipeline. In your own data generation, use "
        "spectrace.eagle3.fingerprint.FingerprintCollector on the fused states and save_fingerprint().",
        "example: spectrace fingerprint --out reference.json, then SPECTRACE_FINGERPRINT=reference.json "
        "compares a traced run's fused input with it",
        raw=False,
    )
    p.add_argument("--out", required=True, help="where to write the fingerprint JSON")
    return p


def fingerprint_main(argv: list[str]) -> int:
    """Entry point of ``spectrace fingerprint``: record the reference pipeline's fused-input fingerprint."""
    return run("spectrace fingerprint", _fingerprint, argv)


def _fingerprint(argv: list[str]) -> int:
    args = fingerprint_parser().parse_args(argv)
    from ..demo import reference_fingerprint
    from ..eagle3.fingerprint import save_fingerprint

    fp = reference_fingerprint()
    save_fingerprint(fp, args.out)
    print(f"wrote {args.out}: {len(fp.chunks)} chunks of {fp.chunk_width}, boundaries {fp.boundaries}")
    return OK

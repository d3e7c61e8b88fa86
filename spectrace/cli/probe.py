"""``spectrace probe TRACE --draft DRAFT_DIR``: which setting the served draft agrees best with its target under.

Exit 0 when the draft as served wins (no variant agrees measurably better), 1 when a
variant does (its Wilson interval lies wholly above the served one), 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import json

from ..probe.run import ProbeInputError, probe, render
from .errors import FOUND, OK, UsageError, parser, run, say

PROG = "spectrace probe"

EXAMPLES = """examples:
  SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_REPLAY_ROWS=64 SPECTRACE_DIR=traces python -m sglang.launch_server ...
  spectrace probe traces --draft ./my-draft           exit 0: served as trained; 1: a variant wins; 2: bad input
  spectrace probe traces --draft ./my-draft --json    every variant's agreement, interval and accept estimate"""


def _steps(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"--steps takes a number of draft steps from 1 to 64, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Measure the served draft's top-1 agreement with its target's own choices, as served and under each candidate "
        "setting (rotary base and style, norm flags, embedding, vocabulary map); say which one the draft was trained with.",
        EXAMPLES,
    )
    p.add_argument("trace", help="a trace file or folder holding a .replay.safetensors file (SPECTRACE_REPLAY=1)")
    p.add_argument("--draft", required=True, help="the draft checkpoint folder (config.json and weights)")
    p.add_argument(
        "--target",
        default=None,
        help="the target's folder (config.json, safetensors): adds each reading of the capture ids and the target's head",
    )
    p.add_argument("--steps", type=_steps, default=None, help="draft steps k for the accept estimate (default: the trace's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace probe``; returns the exit status."""
    return run(PROG, _probe, argv)


def _probe(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = probe(args.trace, args.draft, args.steps, warn=lambda line: say(f"{PROG}: warning: {line}"), target=args.target)
    except ProbeInputError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    print(json.dumps(result.model_dump(), indent=2) if args.json else render(result))
    return OK if result.served_wins else FOUND

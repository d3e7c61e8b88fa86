"""``spectrace replay TRACE --draft DRAFT_DIR``: the served draft against its checkpoint.

Exit 0 when every module agrees, 1 on a divergence, 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import json

from ..replay.run import REFERENCES, ReplayInputError, render, replay
from .errors import FOUND, OK, UsageError, parser, run, say

PROG = "spectrace replay"

EXAMPLES = """examples:
  SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_DIR=traces python -m sglang.launch_server ...   keep the inputs
  spectrace replay traces --draft ./my-draft           exit 0: matches; 1: a module diverges; 2: bad input
  spectrace replay traces --draft ./my-draft --json    the comparison, module by module"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Feed the served draft's kept inputs to a reference draft loaded from its checkpoint; "
        "name the first module that computes something else.",
        EXAMPLES,
    )
    p.add_argument("trace", help="a trace file or folder holding a .replay.safetensors file (SPECTRACE_REPLAY=1)")
    p.add_argument("--draft", required=True, help="the draft checkpoint folder (config.json and weights)")
    p.add_argument("--reference", choices=list(REFERENCES), default="auto")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace replay``; returns the exit status."""
    return run(PROG, _replay, argv)


def _replay(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = replay(args.trace, args.draft, args.reference, warn=lambda line: say(f"{PROG}: warning: {line}"))
    except ReplayInputError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    print(json.dumps(result.model_dump(), indent=2) if args.json else render(result))
    return OK if result.agree else FOUND

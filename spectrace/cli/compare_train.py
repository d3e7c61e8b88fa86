"""``spectrace compare-train TRACE --target HF_MODEL_DIR --draft-config CONFIG``: provenance by value.

The work is ``spectrace/compare_train.py``'s. On a terminal, stderr shows the target's load
and one step of progress per recomputed forward (minutes for a large target on a CPU).

Exit status: 0 every chunk is the boundary the draft was trained on, 1 an error finding,
2 unusable input (one line on stderr).
"""

from __future__ import annotations

import argparse

from ..compare_train import InputError, compare, load_target, read_draft_config, report_lines, to_json, values_records
from ..viewers.progress import counter, spinner
from .errors import FOUND, OK, UsageError, parser, run

PROG = "spectrace compare-train"

EXAMPLES = """examples:
  SPECTRACE=1 SPECTRACE_CAPTURE_VALUES=32 SPECTRACE_DIR=traces python serve.py
  spectrace compare-train traces --target ./tiny-llama --draft-config ./tiny-eagle3/config.json
  spectrace compare-train traces/trace-host-42.jsonl --target meta-llama/Llama-3.1-8B-Instruct --draft-config ./eagle3/config.json

The values file holds rows of the user's run and their token ids: keep it private.
Exit status: 0 every chunk is the boundary the draft was trained on, 1 an error finding,
2 bad input.
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        PROG,
        "Recompute the target's hidden states for the token ids kept beside a trace (SPECTRACE_CAPTURE_VALUES) "
        "and say which boundary each chunk of the served fused draft input really is.",
        EXAMPLES,
    )
    p.add_argument("trace", metavar="TRACE", help="a trace file or folder written with SPECTRACE_CAPTURE_VALUES=N")
    p.add_argument(
        "--target", required=True, metavar="HF_MODEL_DIR", help="the target model as transformers loads it (a folder or a hub name)"
    )
    p.add_argument("--draft-config", required=True, metavar="CONFIG", help="the draft's config.json (or its folder)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype the target is recomputed in on the CPU (default float32; bfloat16 halves the memory of a large target)",
    )
    p.add_argument("--json", action="store_true", help="print the cosines and the findings as JSON")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace compare-train``; returns the exit status."""
    return run(PROG, _compare_train, argv)


def _compare_train(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        found = values_records(args.trace)
        draft_config = read_draft_config(args.draft_config)
        with spinner(f"loading the target {args.target}"):
            model = load_target(args.target, args.dtype)
        results = []
        for path, captured, rule in found:
            with counter("recomputing the target's hidden states, step") as progress:
                results.append(compare(path, model, draft_config, captured, rule, progress=progress))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(to_json(results))
    else:
        for c in results:
            print("\n".join(report_lines(c)))
    return FOUND if any(f.severity == "error" for c in results for f in c.findings) else OK

"""``spectrace doctor --draft DIR --target DIR_OR_CONFIG``: the engine's own code runs the pair, shrunk, on the CPU.

    $ spectrace doctor --draft ./my-draft --target ./target/config.json
    $ spectrace doctor --draft ./my-draft --target ./target --json

Before a GPU is rented: the engine's own (SGLang's or vLLM's) config loading, class selection, loaders, capture
set-up and forward run on the user's configs at tiny widths, traced by spectrace as under
``SPECTRACE=1``. Exit status: 0 no error finding, 1 an error finding (or the engine failed
on the pair), 2 bad input or the engine not installed (one line saying how to get its
CPU build), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .errors import FOUND, OK, OneLineParser, UsageError, run, silence_stdout

PROG = "spectrace doctor"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Run the engine's own classes on the draft and target configs, shrunk, on the CPU, traced: "
        "what a live server would build, capture and load, before a GPU is rented.",
        epilog="examples: spectrace doctor --draft ./my-draft --target ./target/config.json; "
        "spectrace doctor --draft ./my-draft --target ./target --json. "
        "Exit status: 0 no error finding, 1 an error finding, 2 bad input or no engine installed.",
    )
    p.add_argument("--draft", required=True, metavar="DIR", help="the draft checkpoint directory (config.json + safetensors)")
    p.add_argument("--target", required=True, metavar="DIR_OR_CONFIG", help="the target's directory or its config.json")
    p.add_argument(
        "--engine",
        default="sglang",
        choices=("sglang", "vllm"),
        help="the engine whose CPU build runs the pair: sglang (0.5.23, the default) or vllm (0.32)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: list[str]) -> int:
    return run(PROG, _doctor, argv)


def _doctor(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..doctor import DoctorInputError, EngineMissing, diagnose
    from ..doctor.report import lines

    try:
        report = diagnose(Path(args.draft), Path(args.target), args.engine)
    except (DoctorInputError, EngineMissing) as err:
        raise UsageError(str(err)) from None
    try:
        if args.json:
            print(json.dumps(report.model_dump(mode="json"), indent=1), flush=True)
        else:
            from ..viewers.terminal import safe_console

            console = safe_console()
            for line in lines(report, max(console.width, 60)):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    except (BrokenPipeError, SystemExit):  # rich turns a broken pipe into SystemExit(1)
        silence_stdout()
        raise UsageError("stdout was closed before the whole report was written") from None
    return FOUND if report.errors() or report.failure else OK

"""``spectrace replay TRACE --draft DRAFT_DIR``: the served draft against its checkpoint.

Exit 0 when every module agrees, 1 on a divergence, 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from ..audit.checkpoint import AuditInputError
from .file import REPLAY_SUFFIX, RESULT_SUFFIX, ReplayFileError, find_replay_files, read_replay
from .reference import Reference, ReferenceError
from .weights import load_draft

HOW_TO_KEEP = "run the server with SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_DIR=<folder> to keep them"
TRAINERS = {"speculators": "speculators", "specforge": "specforge"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spectrace replay",
        description="Feed the served draft's kept inputs to a reference draft loaded from its checkpoint; "
        "name the first module that computes something else.",
        epilog="examples:\n"
        "  SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_DIR=traces python -m sglang.launch_server ...   keep the inputs\n"
        "  spectrace replay traces --draft ./my-draft           exit 0: matches; 1: a module diverges; 2: bad input\n"
        "  spectrace replay traces --draft ./my-draft --json    the comparison, module by module",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="a trace file or folder holding a .replay.safetensors file (SPECTRACE_REPLAY=1)")
    p.add_argument("--draft", required=True, help="the draft checkpoint folder (config.json and weights)")
    p.add_argument("--reference", choices=["auto", "speculators", "specforge", "builtin"], default="auto")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _fail(message: str) -> int:
    sys.stderr.write(f"spectrace replay: {' '.join(message.split())}\n")
    return 2


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not os.path.exists(args.trace):
        return _fail(f"{args.trace}: no such file or folder")
    if args.reference in TRAINERS:
        if importlib.util.find_spec(TRAINERS[args.reference]) is None:
            return _fail(f"--reference {args.reference}: the package is not installed (pip install {TRAINERS[args.reference]})")
        return _fail(f"--reference {args.reference}: this spectrace runs its built-in reference only; use --reference builtin")
    files = find_replay_files(args.trace)
    if not files:
        return _fail(f"{args.trace}: no kept draft inputs ({REPLAY_SUFFIX}); {HOW_TO_KEEP}")
    try:
        meta, forwards = read_replay(files[-1])
        ckpt, raw, tensors = load_draft(Path(args.draft))
        ref = Reference.build(ckpt, raw, tensors)
    except (ReplayFileError, AuditInputError, ReferenceError) as exc:
        return _fail(str(exc))
    if not forwards:
        return _fail(f"{files[-1]}: no kept forwards; {HOW_TO_KEEP}")
    fc = ref.w.get("fc.weight")
    width = next((f.tensors["hidden_in"].shape[-1] for f in forwards if "hidden_in" in f.tensors), None)
    hidden = next((f.tensors["layer_in"].shape[-1] for f in forwards if "layer_in" in f.tensors), None)
    if hidden is not None and hidden != ref.hidden:
        return _fail(f"the checkpoint's hidden size is {ref.hidden}, the trace's draft ran {hidden}: not this trace's draft")
    if fc is not None and width not in (None, fc.shape[1], ref.hidden):
        return _fail(f"the checkpoint's fc reads {fc.shape[1]} wide, the trace's fused input is {width}: not this trace's draft")
    from .compare import compare

    result = compare(ref, forwards, meta.dtype)
    result.trace, result.replay_file, result.draft, result.engine = meta.trace, os.path.basename(files[-1]), str(args.draft), meta.engine
    if args.reference == "auto":
        result.notes.append("reference: spectrace's built-in EAGLE-3 draft (the trainers' own modelling code is not used)")
    _save(files[-1], result)
    if args.json:
        print(json.dumps(result.model_dump(), indent=2))
    else:
        print(render(result))
    return 0 if result.agree else 1


def _save(replay_file: str, result: object) -> None:
    """The result beside the trace (its name: the replay file's, ``.replay.json``); a failure to write is said, not fatal."""
    from ..values_file import write_private
    from .compare import ReplayResult

    assert isinstance(result, ReplayResult)
    folder, name = os.path.split(replay_file)
    try:
        write_private(folder or ".", name[: -len(REPLAY_SUFFIX)] + RESULT_SUFFIX, result.model_dump_json(indent=2).encode())
    except OSError as exc:
        sys.stderr.write(f"spectrace replay: the result was not written beside the trace ({exc.strerror or exc})\n")


def render(result: object) -> str:
    from .compare import ReplayResult

    assert isinstance(result, ReplayResult)
    lines = [f"replay: {result.forwards} forward(s), {result.rows} row(s), {result.dtype or 'unknown dtype'}, draft {result.draft}"]
    for check in result.modules:
        if not check.compared:
            state = f"not compared ({check.note})" if check.note else "not compared"
        else:
            err = f"max error {check.max_error:.3g} (tolerance {check.tolerance:.3g})" if check.max_error is not None else check.note
            state = ("agrees" if check.agrees else "DIVERGES") + f": {err}"
        lines.append(f"  {check.module:<15} {state}")
    if result.agree:
        lines.append("the served draft matches its checkpoint")
    else:
        lines.append(f"first divergence: {result.first_divergence}")
        lines.append(f"  served:    {result.served}")
        lines.append(f"  reference: {result.expected}")
        lines.append("  causes that fit:")
        lines += [f"    - {c}" for c in result.causes]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)

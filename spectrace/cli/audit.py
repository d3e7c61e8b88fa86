"""``spectrace audit DRAFT_DIR``: check a draft checkpoint against the serving engine before launch.

    $ spectrace audit tests/fixtures/speculators_tiny --target-config tests/fixtures/target_llama_config.json
    $ spectrace audit ./my-draft --target-config ./target/config.json --engine sglang==0.5.17

Exit status: 0 no error finding, 1 at least one error finding, 2 unusable input (one
line on stderr, never a traceback: a bug of ours is one ``internal error`` line, exit 2,
as the audit has always promised), 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..audit.checkpoint import AuditInputError, DraftCheckpoint, TargetConfig, read_checkpoint, read_target_config
from ..audit.report import MAX_TABLE_FINDINGS, render, report, summary, to_json
from ..checks.checkpoint import AuditResult, audit
from ..rules.engines import get_engine, parse_engine
from .errors import FOUND, OK, OneLineParser, UsageError, run, silence_stdout

PROG = "spectrace audit"
CLOSED = "stdout was closed before the whole report was written (e.g. piped into head)"

__all__ = ["MAX_TABLE_FINDINGS", "build_parser", "main", "run_audit"]


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Audit an EAGLE-3 draft checkpoint against the serving engine before launch.",
        epilog="examples: spectrace audit ./my-draft --target-config ./target/config.json (SGLang 0.5.23's rules); "
        "spectrace audit ./my-draft --engine sglang==0.5.17 --json; "
        "spectrace audit ./my-draft --engine vllm==0.32.0. "
        "Exit status: 0 no error finding, 1 an error finding, 2 bad input.",
    )
    p.add_argument("draft_dir", metavar="DRAFT_DIR", help="the draft checkpoint directory (config.json + weights)")
    p.add_argument(
        "--engine", default="sglang", metavar="ENGINE",
        help="sglang, sglang==VERSION (e.g. sglang==0.5.17; default sglang = 0.5.23; a release before 0.5.14, "
        "e.g. sglang==0.5.13, is its midlayer-only loader), vllm==VERSION (e.g. vllm==0.32.0), or vllm (best effort)",
    )  # fmt: skip
    p.add_argument(
        "--engine-version", default=None, metavar="VERSION",
        help="the SGLang release alone, kept for old scripts: prefer --engine sglang==VERSION "
        "('older' means any release before 0.5.14)",
    )  # fmt: skip
    p.add_argument("--target-config", metavar="PATH", help="the target's config.json (or its directory)")
    p.add_argument("--json", action="store_true", help="print findings and a checkpoint summary as JSON")
    p.add_argument(
        "--trained-with", choices=("specforge", "speculators"), default=None,
        help="the trainer that wrote the draft, when you know it (or SPECTRACE_TRAINED_WITH): settles how its ids read",
    )  # fmt: skip
    return p


def run_audit(
    draft_dir: Path, engine_name: str, engine_version: str | None, target_path: str | None, trained_with: str | None = None
) -> tuple[DraftCheckpoint, TargetConfig | None, AuditResult]:
    """The engine the arguments name, the checkpoint and target read, the checks run;
    :class:`AuditInputError` for unusable input."""
    try:
        name, pinned = parse_engine(engine_name)
    except ValueError as err:
        raise AuditInputError(f"argument --engine: {err}") from None
    if name == "vllm" and engine_version is not None:
        raise AuditInputError("--engine-version applies to --engine sglang only (for vLLM: --engine vllm==VERSION)")
    if pinned is not None and engine_version is not None and pinned != engine_version:
        raise AuditInputError(f"--engine {engine_name} and --engine-version {engine_version} disagree: give one")
    try:
        engine = get_engine(name, pinned or engine_version)
    except ValueError as err:
        raise AuditInputError(str(err)) from None
    ckpt = read_checkpoint(draft_dir, trained_with)
    target = read_target_config(Path(target_path)) if target_path else None
    return ckpt, target, audit(ckpt.config, ckpt.tensors, engine, target, ckpt.maps)


def main(argv: list[str]) -> int:
    """Run the audit; every failure becomes one stderr line and exit status 2."""
    return run(PROG, _audit, argv)


def _audit(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        ckpt, target, result = run_audit(Path(args.draft_dir), args.engine, args.engine_version, args.target_config, args.trained_with)
        info = summary(ckpt, target, result)
        try:
            if args.json:
                print(to_json(report(result.findings, info)), flush=True)
            else:
                render(result.findings, info)
        except (BrokenPipeError, SystemExit):  # rich turns a broken pipe into SystemExit(1)
            silence_stdout()
            raise UsageError(CLOSED) from None
        return FOUND if any(f.severity == "error" for f in result.findings) else OK
    except AuditInputError as err:
        raise UsageError(str(err)) from None
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the audit's promise: exit 2, one line, never a traceback
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise UsageError(f"internal error: {type(err).__name__}" + (f": {first}" if first else "")) from None

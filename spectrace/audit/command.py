"""``spectrace audit DRAFT_DIR``: check a draft checkpoint against the serving engine before launch.

    $ spectrace audit tests/fixtures/speculators_tiny --target-config tests/fixtures/target_llama_config.json
    $ spectrace audit ./my-draft --target-config ./target/config.json --engine sglang==0.5.17

Exit status: 0 no error finding, 1 at least one error finding, 2 unusable input (one
line on stderr, never a traceback).

The text report shows at most :data:`MAX_TABLE_FINDINGS` findings (each as stacked seen /
cause / fix / applies-to lines) and says how many it left
out; ``--json`` lists every one. A name that is not valid Unicode (a file name's
undecodable bytes, held as ``\\udcXX`` by Python's surrogateescape, or a lone surrogate
from a header) is written as its ``\\uXXXX`` escape: the JSON stays valid and
``json.loads`` gives back the very string (``os.fsencode`` of it, the file name's bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel

from ..checks.checkpoint import AuditResult, audit
from ..records import Finding, Severity
from ..rules.catalogue import CATALOGUE
from .checkpoint import AuditInputError, DraftCheckpoint, TargetConfig, read_checkpoint, read_target_config
from .engines import get_engine, parse_engine
from .text import applies_to, finding_lines, notes

PROG = "spectrace audit"
# Rows of the findings table; a checkpoint of 10,000 decoder layers missing would
# otherwise print 10,000 rows.
MAX_TABLE_FINDINGS = 40
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class _Parser(argparse.ArgumentParser):
    # argparse prints usage and exits; the audit promises one error line instead.
    def error(self, message: str) -> NoReturn:
        raise AuditInputError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
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


def summary(ckpt: DraftCheckpoint, target: TargetConfig | None, result: AuditResult) -> dict[str, Any]:
    total = sum(_nbytes(t.shape, t.dtype) for t in ckpt.tensors.values())
    return {
        "path": ckpt.path,
        "format": ckpt.config.format,
        "files": ckpt.files,
        "num_tensors": len(ckpt.tensors),
        "approx_bytes": total,
        "tensors": {name: {"shape": t.shape, "dtype": t.dtype} for name, t in sorted(ckpt.tensors.items())},
        "config": ckpt.config.model_dump(),
        "target": target.model_dump() if target else None,
        **result.summary,
    }


def _nbytes(shape: list[int], dtype: str) -> int:
    from .checkpoint import DTYPE_BITS

    n = 1
    for d in shape:
        n *= d
    bits = DTYPE_BITS.get(dtype.upper()) or {"float32": 32, "float16": 16, "bfloat16": 16, "int64": 64, "bool": 8}.get(dtype, 0)
    return (n * bits + 7) // 8


class ReportFinding(BaseModel):
    code: str
    severity: Severity
    message: str
    evidence: dict[str, Any]
    fix: str
    module: str | None
    cause: str = ""  # the catalogue's meaning of the code
    applies_to: str = ""  # the engine releases the finding holds for


class AuditReport(BaseModel):
    """What ``--json`` prints: the findings and a summary of the checkpoint and the engine's view of it."""

    findings: list[ReportFinding]
    checkpoint: dict[str, Any]


def report(findings: list[Finding], info: dict[str, Any]) -> AuditReport:
    return AuditReport(
        findings=[
            ReportFinding(
                code=f.code,
                severity=f.severity,
                message=f.message,
                evidence=f.evidence,
                fix=f.fix,
                module=f.module,
                cause=CATALOGUE[f.code].meaning if f.code in CATALOGUE else "",
                applies_to=applies_to(f, info),
            )  # fmt: skip
            for f in findings
        ],
        checkpoint=info,
    )


def to_json(model: BaseModel) -> str:
    """``model`` as indented JSON, lone surrogates written as ``\\uXXXX`` escapes (pydantic's
    own encoder refuses them; a surrogate can only sit inside a JSON string)."""
    text = json.dumps(model.model_dump(), indent=2, ensure_ascii=False, default=_jsonable)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


@contextlib.contextmanager
def _stdout_escaping_unencodable() -> Iterator[None]:
    """Text output: a character stdout cannot encode (a lone surrogate) is printed as a
    backslash escape instead of failing the whole report."""
    out = sys.stdout
    before = getattr(out, "errors", None)
    reconfigure = getattr(out, "reconfigure", None)
    if reconfigure is None or before is None:
        yield
        return
    reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            reconfigure(errors=before)


def render(findings: list[Finding], info: dict[str, Any]) -> None:
    """The text report: a header, then one stacked block per finding (seen / cause / fix /
    applies to, as ``spectrace view`` draws them), wrapped at spaces to the terminal's width."""
    from ..viewers.terminal import safe_console

    console = safe_console()  # escapes the control characters a checkpoint's strings carry
    width = max(console.width, 40)
    engine = info["engine"]
    cap = info["engine_capture"]

    def say(line: str, style: str = "") -> None:
        # Plain text, never wrapped by rich: text.stack has wrapped it at spaces already.
        console.print(line, style=style or None, markup=False, highlight=False, soft_wrap=True)

    head = (
        f"spectrace audit {info['path']}  format={info['format']}  tensors={info['num_tensors']}  "
        f"engine={engine.get('spec') or engine['name'] + '==' + engine['version']}"
    )
    for line in textwrap.wrap(head, width, break_long_words=False, break_on_hyphens=False):
        say(line, "bold")
    trained = "; ".join(f"{r['trainer']}: {r['boundaries']}" for r in info["trained_readings"]) or "unknown"
    captured = cap["boundaries"] if cap["boundaries"] is not None else "unknown (no --target-config)"
    # The capture rule and the releases it holds for: a rule is a fact of some releases only.
    rule = f" ({cap['rule']} rule" + (f", {cap['rule_releases']})" if cap.get("rule_releases") else ")")
    for line in textwrap.wrap(f"trained boundaries: {trained}   engine captures: {captured}{rule}", width, break_long_words=False):
        say(line)
    if not findings:
        say("no findings", "green")
    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in findings[:MAX_TABLE_FINDINGS]:
        say("")
        for line in finding_lines(f, info, width):
            say(line, "" if line.startswith(" ") else f"bold {colour[f.severity]}")
    if len(findings) > MAX_TABLE_FINDINGS:
        say("")
        say(f"{len(findings) - MAX_TABLE_FINDINGS} more findings left out of the table; --json lists all {len(findings)}")
    shown = notes(info)
    if shown:
        say("")
    for note in shown:
        for i, line in enumerate(textwrap.wrap(note, width - 9, break_long_words=False, break_on_hyphens=False)):
            say(("assumed: " if i == 0 else " " * 9) + line, "dim")


class _OutputClosed(Exception):
    """The reader of stdout went away mid-report."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's exit flush cannot fail a second time."""
    with contextlib.suppress(Exception):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str]) -> int:
    """Run the audit; every failure becomes one stderr line and exit status 2."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as stop:  # --help
            return int(stop.code or 0)
        ckpt, target, result = run_audit(Path(args.draft_dir), args.engine, args.engine_version, args.target_config, args.trained_with)
        info = summary(ckpt, target, result)
        try:
            if args.json:
                print(to_json(report(result.findings, info)), flush=True)
            else:
                with _stdout_escaping_unencodable():
                    render(result.findings, info)
        except (BrokenPipeError, SystemExit):  # rich turns a broken pipe into SystemExit(1)
            _silence_stdout()
            raise _OutputClosed from None
        return 1 if any(f.severity == "error" for f in result.findings) else 0
    except AuditInputError as err:
        reason = str(err)
    except _OutputClosed:
        reason = "stdout was closed before the whole report was written (e.g. piped into head)"
    except KeyboardInterrupt:
        reason = "interrupted"
    except BaseException as err:  # noqa: BLE001 - the promise is: no traceback, ever
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        reason = f"internal error: {type(err).__name__}" + (f": {first}" if first else "")
    from ..viewers.terminal import write_line

    write_line(sys.stderr, f"{PROG}: error: {reason}")  # escaped; never raises (stderr closed)
    return 2

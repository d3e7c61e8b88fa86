"""The audit's report: a checkpoint summary, the findings as JSON or as text.

``spectrace audit`` (``cli/audit.py``) reads the checkpoint, runs the checks and hands the
result here. The text report shows at most :data:`MAX_TABLE_FINDINGS` findings (each as stacked seen /
cause / fix / applies-to lines) and says how many it left
out; ``--json`` lists every one. A name that is not valid Unicode (a file name's
undecodable bytes, held as ``\\udcXX`` by Python's surrogateescape, or a lone surrogate
from a header) is written as its ``\\uXXXX`` escape: the JSON stays valid and
``json.loads`` gives back the very string (``os.fsencode`` of it, the file name's bytes).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from ..checks.checkpoint import AuditResult
from ..records import Finding, Severity
from ..rules.catalogue import CATALOGUE
from .checkpoint import DraftCheckpoint, TargetConfig
from .text import applies_to, finding_lines, notes

# Rows of the findings table; a checkpoint of 10,000 decoder layers missing would
# otherwise print 10,000 rows.
MAX_TABLE_FINDINGS = 40
_SURROGATE = re.compile(r"[\ud800-\udfff]")


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
    with _stdout_escaping_unencodable():
        _render(findings, info)


def _render(findings: list[Finding], info: dict[str, Any]) -> None:
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

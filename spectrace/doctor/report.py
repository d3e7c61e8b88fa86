"""The doctor's report: what the engine built and did, the records, the findings; text and JSON.

Findings come from spectrace's checks through the integration's records, exactly as a
traced server makes them, and are worded by the one presenter (:mod:`spectrace.present`).
The facts are printed as the engine built them: the rotary a draft's attention got is a
fact here, whether it is right is the checks' call.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from ..present import findings_headline, ranked, stacked_lines, to_dicts
from ..records import Capture, Finding, Weights
from .facts import EngineFacts, Rotary
from .shrink import HEADS, HIDDEN

LIMITS = (
    f"shrunk to hidden {HIDDEN} and {HEADS} heads, random weights, on the CPU: it shows what the engine builds and "
    "wires from these configs, not numerics at full width, the GPU kernels, CUDA graphs, tensor or expert parallelism, "
    "quantization, or acceptance on real text"
)
MAX_NAMES = 6


class DoctorReport(BaseModel):
    """Everything ``spectrace doctor`` found; ``--json`` writes it."""

    draft: str
    target: str
    engine: str
    limits: str = LIMITS
    facts: EngineFacts | None = None
    failure: str | None = Field(None, description="the engine's error on the shrunk pair, when it failed")
    engine_log: list[str] = Field(default=[], description="the engine's last output lines, when it failed")
    captures: list[Capture] = []
    weights: list[Weights] = []
    findings: list[dict[str, Any]] = Field(default=[], description="every finding, judged, as spectrace view --json gives them")

    @classmethod
    def build(
        cls, *, draft: str, target: str, engine: str, facts: EngineFacts | None, records: Sequence[Any], failure: str | None,
        engine_log: list[str],
    ) -> DoctorReport:  # fmt: skip
        found = [r for r in records if isinstance(r, Finding)]
        return cls(
            draft=draft, target=target, engine=engine, facts=facts, failure=failure, engine_log=engine_log,
            captures=[r for r in records if isinstance(r, Capture)], weights=[r for r in records if isinstance(r, Weights)],
            findings=to_dicts(found),
        )  # fmt: skip

    def finding_records(self) -> list[Finding]:
        return [Finding.model_validate({k: v for k, v in d.items() if k in Finding.model_fields}) for d in self.findings]

    def errors(self) -> list[str]:
        return [f["code"] for f in self.findings if f["severity"] == "error"]


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _rotary(r: Rotary) -> str:
    factor = f" factor {r.factor:g}" if r.factor is not None else ""
    style = "NeoX" if r.neox else "GPT-J"
    return f"{r.cls} base {r.base:g} ({r.rope_type}{factor}, rotary dim {r.rotary_dim}, {style} style)"


def fact_lines(report: DoctorReport) -> list[tuple[str, str]]:
    """(label, value) rows: what the engine built, captured, handed over and loaded."""
    rows: list[tuple[str, str]] = []
    f = report.facts
    if f is not None:
        rows.append(("target", f"{', '.join(f.target.architectures)} -> built {f.target.cls}"))
    for cap in report.captures:
        ids = "none (the engine passed None: its default)" if cap.requested_ids is None else str(cap.requested_ids)
        extra = cap.model_extra or {}
        rows.append(
            (
                "captures",
                f"ids {ids} -> boundaries {cap.boundaries} of {cap.num_layers} layers ({cap.rule} rule, {extra.get('target_class', '')})".replace(
                    ", )", ")"
                ),
            )
        )
    if f is not None:
        if f.capture_ids is None and not report.captures:
            rows.append(("captures", "nothing: the engine resolved no aux-layer ids (the target hands the draft its last hidden state)"))
        if f.fused_width is not None:
            chunks = f"{f.fused_width // f.tiny_hidden} x {f.tiny_hidden}" if f.fused_width % f.tiny_hidden == 0 else str(f.fused_width)
            fc = f"; the draft's fc reads {f.fc_in_features}" if f.fc_in_features is not None else ""
            rows.append(("fused width", f"{f.fused_width} = {chunks} handed to the draft{fc} (shrunk widths)"))
        renamed = f.draft.config_architectures and f.draft.config_architectures != f.draft.architectures
        via = f" -> renamed by the engine to {', '.join(f.draft.architectures)}" if renamed else ""
        rows.append(("draft", f"{', '.join(f.draft.config_architectures or f.draft.architectures)}{via} -> built {f.draft.cls}"))
        if f.draft.rotaries:
            rows.append(("draft rotary", "; ".join(_rotary(r) for r in f.draft.rotaries)))
        if f.target.rotaries:
            rows.append(
                (
                    "target rotary",
                    _rotary(f.target.rotaries[0]) + (f" (+{len(f.target.rotaries) - 1} more)" if len(f.target.rotaries) > 1 else ""),
                )
            )
        if f.flags_set:
            unread = [k for k in f.flags_set if k not in f.flags_read]
            rows.append(("flags", f"set: {_names(f.flags_set)}; never read by {f.draft.cls}: {_names(unread) if unread else 'none'}"))
    for w in report.weights:
        dropped = f"; dropped: {_names(w.ignored)}" if w.ignored else ""
        missing = f"; left unloaded: {_names(w.missing)}" if w.missing else ""
        rows.append(("weights", f"{len(w.offered)} offered, {len(w.written)} written{dropped}{missing}"))
    if f is not None:
        if f.embed_head:
            what = "embedding and head" if f.embed_head == "set_embed_and_head" else "embedding"
            rows.append(("shared", f"the worker gave the draft the target's {what} ({f.embed_head})"))
        if f.hot_token_ids is not None:
            rows.append(("vocab map", f"hot_token_id {f.hot_token_ids}... ({f.hot_token_count} draft ids)"))
        for note in f.notes:
            rows.append(("note", note))
    return rows


def lines(report: DoctorReport, width: int) -> list[str]:
    """The text report: header and limits first (the first screen), the facts, then each finding."""
    version = f" {report.facts.engine_version}" if report.facts is not None else ""
    head = f"spectrace doctor: draft {report.draft}, target {report.target}, {report.engine}{version}'s own classes on the CPU"
    out = textwrap.wrap(head, width, break_long_words=False)
    out += textwrap.wrap("cannot show: " + report.limits, width, subsequent_indent="  ")
    out.append("")
    label_w = max((len(label) for label, _ in fact_lines(report)), default=8)
    for label, value in fact_lines(report):
        wrapped = textwrap.wrap(value, max(width - label_w - 2, 30), break_long_words=False) or [""]
        out.append(f"{label:<{label_w}}  {wrapped[0]}")
        out += [" " * (label_w + 2) + w for w in wrapped[1:]]
    if report.failure:
        out.append("")
        out += textwrap.wrap(f"{report.engine} failed on the shrunk pair: {report.failure}", width)
        out += ["  " + line for line in report.engine_log[-5:]]
    found = report.finding_records()
    out.append("")
    if not found:
        out.append("no findings")
        return out
    shown = ranked(found)
    for e in shown:
        follows = [("follows", f"from {e.root}: its fix clears this one")] if e.root else []
        out += stacked_lines(e.finding, width, follows)
        out.append("")
    out.append(findings_headline(shown))
    return out

"""The audit's text report: one stacked block per finding (seen / cause / fix / applies to),
as ``spectrace view`` draws its findings, wrapped at spaces to the terminal's width.

An identifier (``eagle_config.use_aux_hidden_state=true``) is never cut: a word longer
than the line stands whole on a line of its own, so a fix can be copied as printed.

The block itself is the findings presenter's (:func:`spectrace.present.findings.stacked_lines`);
this module adds what only the audit knows: which engine releases a finding holds for.
"""

from __future__ import annotations

from typing import Any

from ..present.findings import stacked_lines
from ..records import Finding

# Codes whose truth depends on the target's capture rule, which holds for some releases only.
CAPTURE_CODES = frozenset({"aux_layers_mismatch", "short_capture", "capture_unsupported", "fc_bypass"})


def engine_label(engine: dict[str, Any]) -> str:
    """``SGLang 0.5.23`` / ``vLLM 0.33.0``, as the audit was told to model it."""
    name = {"sglang": "SGLang", "vllm": "vLLM"}.get(engine.get("name", ""), engine.get("name", "?"))
    version = engine.get("version") or "?"
    return f"{name} {'(best effort)' if version == 'recent' else version}"


def applies_to(f: Finding, info: dict[str, Any]) -> str:
    """Which engine releases a finding holds for: the release audited, and for a capture
    finding the releases whose capture rule it was judged by."""
    engine = info.get("engine") or {}
    text = f"{engine_label(engine)}, the release audited (--engine names another)"
    releases = (info.get("engine_capture") or {}).get("rule_releases")
    if f.code in CAPTURE_CODES and releases:
        text += f"; the capture rule used holds for {releases}"
    if f.code == "weights_dropped" and engine.get("name") == "sglang":
        text += "; SGLang before 0.5.14 drops layers.0.* (it loads midlayer.*), later releases map midlayer.* to layers.0.*"
    return text


def finding_lines(f: Finding, info: dict[str, Any], width: int) -> list[str]:
    """One finding as stacked lines: the presenter's seen / cause / fix, then applies-to."""
    return stacked_lines(f, width, extra=[("applies", applies_to(f, info))])


def notes(info: dict[str, Any]) -> list[str]:
    """The engine's assumptions that concern this checkpoint: the note on the target's
    default capture only when the config gives no ids."""
    cfg = info.get("config") or {}
    # SGLang reads eagle_config only; vLLM reads the top level too.
    read = ("eagle_config_ids",) if (info.get("engine") or {}).get("name") == "sglang" else ("top_level_ids", "eagle_config_ids")
    has_ids = any(cfg.get(key) for key in read)
    out = []
    for note in (info.get("engine") or {}).get("assumptions", []):
        if has_ids and "captures its defaults" in note:
            continue
        out.append(note)
    return out

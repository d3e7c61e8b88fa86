"""The findings of a ``spectrace probe`` result, and the warnings its evidence settles.

The probe (``spectrace.probe``) measures the served draft's top-1 agreement with its
target as served and under each candidate setting, and writes ``<stem>.probe.json``
beside the trace. Here that result becomes one finding: ``probe_better_variant`` when a
variant agrees measurably better (its fix is the variant's), else
``probe_served_as_trained`` (info). A config rule that cannot tell a healthy draft from a
broken one says so as a *warning*; once the probe has measured the axis it is about and
the served draft won, that warning is withdrawn (:func:`withdraw`). A warning names its
axis by its code (:data:`AXIS_OF`) or by ``evidence["probe_axis"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding

PROBE_SUFFIX = ".probe.json"  # what spectrace probe writes beside the trace (spectrace.probe.run)
MAX_RESULT_BYTES = 1 << 20
# The warnings the probe decides, by code: the axis it must have measured.
AXIS_OF = {"rope_mismatch": "rope"}
# unsupported_config_flag is about one flag: decided where the probe measured that flag.
FLAG_AXES = ("norm_before_residual",)


def _variant(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next((v for v in raw.get("variants") or [] if isinstance(v, Mapping) and v.get("name") == name), {})


def _said(v: Mapping[str, Any]) -> str:
    return f"{v.get('agreement', 0):.3f} [{v.get('low', 0):.3f}, {v.get('high', 0):.3f}] (accept ~{v.get('chain', 0):.2f})"


def probe_findings(raw: Any) -> list[Finding]:
    """The finding of one probe result (parsed ``<stem>.probe.json``); none for what is not one."""
    if not isinstance(raw, Mapping) or not str(raw.get("format", "")).startswith("spectrace.probe-result/"):
        return []
    served = _variant(raw, "as served")
    if not served:
        return []
    rows = f"{raw.get('rows', 0)} {raw.get('rows_used', 'rows')}"
    evidence = {
        "probe_rows": raw.get("rows"),
        "probe_rows_used": raw.get("rows_used"),
        "probe_steps": raw.get("steps"),
        "probe_served": {k: served.get(k) for k in ("agreement", "low", "high", "chain")},
        "probe_decided": list(raw.get("decided") or []),
        "probe_file": raw.get("replay_file"),
    }
    if raw.get("served_wins", True):
        return [
            finding(
                "probe_served_as_trained",
                f"the draft is served as trained: as served it agrees with its target's own top-1 on {_said(served)} of "
                f"{rows}, and no variant ({', '.join(raw.get('decided') or [])}) agrees measurably better",
                module="draft",
                evidence=evidence,
                source="spectrace probe",
            )
        ]
    win = _variant(raw, str(raw.get("winner")))
    return [
        finding(
            "probe_better_variant",
            f"as served the draft agrees with its target's own top-1 on {_said(served)} of {rows}; with {raw.get('winner')}: {_said(win)}",
            module="draft",
            evidence={
                **evidence,
                "probe_winner": raw.get("winner"),
                "probe_winner_axis": win.get("axis"),
                "probe_winner_agreement": {k: win.get(k) for k in ("agreement", "low", "high", "chain")},
            },
            fix=str(win.get("fix") or "") or None,
            source="spectrace probe",
        )  # fmt: skip
    ]


def _axis(found: Finding) -> str | None:
    axis = found.evidence.get("probe_axis") if isinstance(found.evidence, dict) else None
    if isinstance(axis, str):
        return axis
    if found.code == "unsupported_config_flag":
        return next((flag for flag in FLAG_AXES if flag in (found.module or "")), None)
    return AXIS_OF.get(found.code)


def withdraw(findings: list[Finding], raw: Any) -> list[Finding]:
    """``findings`` without the warnings a probe that the served draft won has settled (errors are kept)."""
    if not isinstance(raw, Mapping) or not raw.get("served_wins", False) or not _variant(raw, "as served"):
        return findings
    decided = set(raw.get("decided") or [])
    return [f for f in findings if not (f.severity == "warning" and _axis(f) in decided)]

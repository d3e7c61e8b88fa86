"""What an audit returns: its findings, and the summary of what it replayed (the engine,
the trained readings, the capture, the rotary embedding, the maps, where each tensor went).

Both audits build their summary here (the engine-model audit in
:mod:`spectrace.checks.checkpoint`, a vLLM release's in :mod:`spectrace.checks.vllm_audit`),
so neither calls the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..records import Finding
from ..rules.engines import Engine
from .draft_config import rotary_summary
from .engine_capture import engine_capture, trained_readings
from .facts import DraftConfigFile, TargetConfig, TensorInfo, VocabMaps
from .load_replay import LoadReplay
from .trainer import recognition


@dataclass
class AuditResult:
    findings: list[Finding]
    summary: dict[str, Any] = field(default_factory=dict)


def audit_summary(
    cfg: DraftConfigFile,
    tensors: dict[str, TensorInfo],
    engine: Engine,
    target: TargetConfig | None,
    maps: VocabMaps | None,
    replay: LoadReplay,
) -> dict[str, Any]:
    """The summary of auditing ``cfg`` against ``engine``, whose load of ``tensors`` is ``replay``."""
    n = target.num_hidden_layers if target else None
    cap = engine_capture(cfg, engine, target)
    not_loaded = {*replay.dropped, *replay.specials, *replay.skipped}  # a set: one lookup per tensor
    return {
        "engine": {
            "name": engine.name,
            "version": engine.version,
            "spec": engine.spec,
            "draft_class": engine.draft_class,
            "assumptions": engine.assumptions_for(cfg),
        },  # fmt: skip
        "trainer": recognition(cfg, tensors).summary(),
        "trained_readings": [
            {"trainer": r.convention, "ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in trained_readings(cfg, n)
        ],
        "engine_capture": {
            "ids": cap.ids,
            "source": cap.source,
            "rule": cap.rule,
            "rule_releases": cap.releases,
            "boundaries": cap.boundaries,
        },  # fmt: skip
        "rotary": rotary_summary(cfg, engine, target),
        "vocab_maps": {
            "d2t_entries": len(maps.d2t) if maps and maps.d2t is not None else None,
            "t2d_entries": len(maps.t2d) if maps and maps.t2d is not None else None,
            "notes": list(maps.notes) if maps else ["values not read"],
        },
        "weights": {
            "loaded": sorted(name for name in tensors if name not in not_loaded),
            "dropped": replay.dropped,
            "special": replay.specials,
            "skipped": replay.skipped,
        },
    }

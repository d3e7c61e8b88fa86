"""The pre-launch checks: config + tensor names/shapes [+ target config] -> findings.

Pure functions, no I/O: each check replays what the engine will do with this draft
(name mapping, id convention, flags it reads) and reports where that differs from what
the trainer did (the trainer known from a record or recognised from the layout,
:mod:`.trainer`). Layer positions are reported as canonical boundaries
(b = Hugging Face ``hidden_states[b]``, 0 = embedding output). The checks are split by
job: the weight load (:mod:`.load_replay`), the captured layers (:mod:`.engine_capture`),
the config's widths, flags, rotary and maps (:mod:`.draft_config`); a vLLM release read
from its source has its own audit (:mod:`.vllm_audit`). The facts come from
:mod:`spectrace.audit.checkpoint`, which reads the untrusted files.

    >>> ckpt = read_checkpoint(Path("tests/fixtures/specforge_tiny"))
    >>> [f.code for f in audit(ckpt.config, ckpt.tensors, get_engine("sglang"), None).findings]
    []
"""

from __future__ import annotations

from ..records import SEVERITY_RANK, Finding
from ..rules.engines import Engine, dims_of
from .audit_summary import AuditResult, audit_summary
from .draft_class import check_draft_class
from .draft_config import check_aux_enabled, check_fc_width, check_flags, check_maps, check_null_keys, check_rotary, last_state_draft
from .engine_capture import check_aux_layers, check_capture_support, check_short_capture
from .facts import DraftConfigFile, TargetConfig, TensorInfo, VocabMaps
from .load_replay import check_dropped, check_missing, check_tensor_shapes, replay_load
from .trainer import with_roots
from .vllm_audit import audit_vllm

__all__ = ["AuditResult", "audit"]


def audit(
    cfg: DraftConfigFile,
    tensors: dict[str, TensorInfo],
    engine: Engine,
    target: TargetConfig | None = None,
    maps: VocabMaps | None = None,
) -> AuditResult:
    """Every check, findings sorted by severity, plus the replay summary.

    ``maps``: the values of the checkpoint's d2t/t2d (``read_vocab_maps``); without them the
    maps are checked by name and shape only."""
    cfg = with_roots(cfg, tensors)
    if engine.name == "vllm" and engine.version != "recent":  # a vLLM release read from its source
        return audit_vllm(cfg, tensors, engine, target, maps)
    dims = dims_of(cfg)
    replay = replay_load(tensors, engine, dims)
    findings: list[Finding] = []
    findings += check_dropped(replay, engine, dims)
    missing = check_missing(replay, cfg, engine, target)
    if last_state_draft(cfg, tensors, target) is not None:  # fc is built but never applied: its input is as wide as the embedding
        missing = [f for f in missing if not any(p.endswith("fc.weight") for p in f.evidence.get("parameters", []))]
    findings += missing
    findings += check_tensor_shapes(replay, engine, cfg)
    findings += check_null_keys(cfg, engine)
    findings += check_fc_width(cfg, tensors, engine, target)
    findings += check_aux_enabled(cfg, engine, tensors, target)
    if engine.name == "sglang":
        has_ids = bool(cfg.top_level_ids or cfg.eagle_config_ids)
        findings += check_draft_class(
            cfg.architectures,
            tensors,
            has_ids,
            target_architectures=target.architectures if target else None,
            layers=cfg.num_hidden_layers,
            target_layers=target.num_hidden_layers if target else None,
        )
    findings += check_aux_layers(cfg, engine, target)
    findings += check_short_capture(cfg, engine, target)
    findings += check_capture_support(cfg, engine, target)
    findings += check_flags(cfg, engine)
    findings += check_rotary(cfg, tensors, engine, target)
    findings += check_maps(cfg, tensors, maps, target)
    for f in findings:
        f.source = "audit"
    findings.sort(key=lambda f: SEVERITY_RANK[f.severity])
    return AuditResult(findings, audit_summary(cfg, tensors, engine, target, maps, replay))

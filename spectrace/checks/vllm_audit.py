"""``spectrace audit --engine vllm==VERSION``: the pre-launch checks under vLLM's rules.

The shared checks (``checks.load_replay``, ``checks.engine_capture``, ``checks.draft_config``)
replay the load and compare the capture; where
vLLM's own code differs from the engine-neutral model, the vLLM rules
(:mod:`spectrace.rules.vllm`) and findings (:mod:`spectrace.checks.vllm`) take over, the
very functions the runtime hooks call:

- a ``.bias`` tensor with no parameter is dropped without a word (not a load error);
- Model Runner V2, what a CUDA server runs, reads no ids nested as
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` and captures its defaults;
- ``use_aux_hidden_state`` false is ``fc_bypass`` (vLLM builds no fc);
- ``fc_norm`` and ``norm_output`` are implemented in the releases read.

``checks.checkpoint.audit`` hands an engine from ``get_engine("vllm", VERSION)`` here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..records import SEVERITY_RANK, Capture, Finding
from ..rules.catalogue import finding
from ..rules.engines import Engine, dims_of
from ..rules.vllm import IDS_KEY, default_ids, draft_class_for, ignored_nested_ids, vllm_boundaries, vllm_release
from .audit_summary import AuditResult, audit_summary
from .capture import check_capture
from .draft_config import check_fc_width, check_maps, check_rotary, last_state_draft
from .engine_capture import check_aux_layers, check_short_capture
from .facts import DraftConfigFile, TargetConfig, TensorInfo, VocabMaps
from .load_replay import check_dropped, check_missing, check_tensor_shapes, listing, replay_load
from .trainer import with_roots
from .vllm import check_vllm_class_flags, check_vllm_fc_bypass, check_vllm_runner_ids

RUNNER = "mrv2"  # what a CUDA server of the releases read runs unless VLLM_USE_V2_MODEL_RUNNER=0


def config_view(cfg: DraftConfigFile) -> dict[str, Any]:
    """The keys vLLM's runners and draft class read, as a config.json mapping."""
    view: dict[str, Any] = {}
    if cfg.top_level_ids:
        view[IDS_KEY] = list(cfg.top_level_ids)
    eagle: dict[str, Any] = {}
    if cfg.eagle_config_ids:
        eagle[IDS_KEY] = list(cfg.eagle_config_ids)
    if cfg.use_aux_hidden_state is not None:
        eagle["use_aux_hidden_state"] = cfg.use_aux_hidden_state
    for flag, value in cfg.flags.items():
        view[flag] = value
    if eagle:
        view["eagle_config"] = eagle
    if cfg.stated is not None:
        view["trained_aux_boundaries"] = list(cfg.stated.boundaries)
        view["trainer_convention"] = cfg.stated.convention
    return view


def _biases_dropped(names: list[str], engine: Engine) -> list[Finding]:
    if not names:
        return []
    return [
        finding(
            "weights_dropped",
            f"{len(names)} bias tensor(s) match no vLLM {engine.version} parameter: {listing(names)}; vLLM's "
            "AutoWeightsLoader ignores unexpected '.bias' tensors without a word (the draft serves without them)",
            module=names[0].rsplit(".", 1)[0],
            evidence={"tensors": names},
            fix="vLLM's Eagle3 draft builds fc and its projections with bias=False: retrain with bias=False, or fold "
            "the bias away before serving",
        )
    ]


def _ignored_ids(cfg: DraftConfigFile, view: dict[str, Any], target: TargetConfig | None) -> list[Finding]:
    """Model Runner V2 skips the nested ids: the mismatch, and a short capture if its defaults collide."""
    n = target.num_hidden_layers if target else None
    if ignored_nested_ids(view, RUNNER) is None:
        return []
    if n is None:
        return [
            finding(
                "aux_layers_mismatch",
                f"the draft config nests its ids in eagle_config.{IDS_KEY} {cfg.eagle_config_ids}, which vLLM's Model "
                "Runner V2 does not read: the target captures its defaults (2, n//2, n-3); pass --target-config for the "
                "boundaries",
                module="config.json",
                evidence={"runner": RUNNER, "nested_ids": cfg.eagle_config_ids},
                fix=f"write {IDS_KEY} at the top level of config.json (id k = boundary k, 0 = the embedding)",
            )
        ]
    defaults = default_ids(n)
    captured = vllm_boundaries(defaults, n)
    out = check_vllm_runner_ids(view, RUNNER, captured=captured, num_layers=n, module="config.json")
    capture = Capture(module="config.json", requested_ids=defaults, boundaries=captured, num_layers=n, hidden_size=0, rule="vllm")
    out += [f for f in check_capture(capture, None) if f.code == "short_capture"]
    return out


def audit_vllm(
    cfg: DraftConfigFile, tensors: dict[str, TensorInfo], engine: Engine, target: TargetConfig | None, maps: VocabMaps | None = None
) -> AuditResult:
    cfg = with_roots(cfg, tensors)
    dims = dims_of(cfg)
    replay = replay_load(tensors, engine, dims)
    biases = [n for n in replay.dropped if n.endswith(".bias")]
    loud = replace(replay, dropped=[n for n in replay.dropped if not n.endswith(".bias")])
    view = config_view(cfg)
    ignored = ignored_nested_ids(view, RUNNER) is not None
    findings: list[Finding] = []
    findings += check_dropped(loud, engine, dims)
    findings += _biases_dropped(biases, engine)
    missing = check_missing(replay, cfg, engine, target)
    if cfg.use_aux_hidden_state is False:  # vLLM builds no fc and drops fc.weight
        missing = [f for f in missing if "model.fc.weight" not in f.evidence.get("parameters", [])]
    findings += missing
    findings += check_tensor_shapes(replay, engine, cfg)
    # A last-state draft is served as trained, unless Model Runner V2 (before 0.33.0) still feeds it aux states.
    if last_state_draft(cfg, tensors, target) is None or not vllm_release(engine.version).mrv2_reads_use_aux:
        findings += check_vllm_fc_bypass(view, module="config.json", version=engine.version, runner=RUNNER)
    draft_class = draft_class_for(cfg.architectures)
    findings += check_vllm_class_flags(view, draft_class)
    if ignored:
        findings += _ignored_ids(cfg, view, target)
    else:
        findings += check_aux_layers(cfg, engine, target)
        findings += check_short_capture(cfg, engine, target)
        if cfg.use_aux_hidden_state is not False:
            findings += check_fc_width(cfg, tensors, engine, target)
    # vLLM builds the draft's rotary from the same transformers config and uses d2t as SGLang does.
    findings += check_rotary(cfg, tensors, engine, target)
    findings += check_maps(cfg, tensors, maps, target)
    for f in findings:
        f.source = "audit"
    findings.sort(key=lambda f: SEVERITY_RANK[f.severity])
    # The summary of the engine-neutral audit, with this release's engine and capture.
    neutral = generic_engine(engine)
    summary = audit_summary(cfg, tensors, neutral, target, maps, replay_load(tensors, neutral, dims))
    summary["engine"] = {
        "name": engine.name,
        "version": engine.version,
        "draft_class": engine.draft_class,
        "built_class": draft_class,
        "assumptions": list(engine.assumptions),
    }
    if ignored and target is not None:
        defaults = default_ids(target.num_hidden_layers)
        summary["engine_capture"] = {
            "ids": defaults,
            "source": "defaults (2, n//2, n-3): Model Runner V2 reads no eagle_config ids",
            "rule": "vllm",
            "boundaries": vllm_boundaries(defaults, target.num_hidden_layers),
        }
    summary["runner"] = RUNNER
    release = vllm_release(engine.version)
    summary["vllm_release"] = {"read": release.read, "mrv2_reads_use_aux_hidden_state": release.mrv2_reads_use_aux}
    return AuditResult(findings, summary)


def generic_engine(engine: Engine) -> Engine:
    """The engine-neutral vLLM model, for the parts of the summary that do not depend on the release."""
    return replace(engine, version="recent")

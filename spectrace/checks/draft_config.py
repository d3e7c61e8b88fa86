"""The draft config's widths, switches, training flags, rotary embedding and vocabulary
maps, each as the engine reads it.

Pure functions over facts (:mod:`spectrace.checks.facts`) and the engine models.
"""

from __future__ import annotations

from typing import Any

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.conventions import SGLangDraftFlag, first_sglang_implementing, sglang_flag_applies
from ..rules.engines import Engine, dims_of
from ..rules.trainers import TRAINERS
from .engine_capture import engine_capture
from .facts import DraftConfigFile, TargetConfig, TensorInfo, VocabMaps
from .rope import effective_rotary
from .rope_trained import check_trained_rope
from .trainer import recognition
from .vocab_map import check_vocab_map


def check_fc_width(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """fc.in_features against num_aux x target hidden (what the target delivers and what the engine builds)."""
    out: list[Finding] = []
    label = engine.label
    cfg_target_hidden = cfg.target_hidden_size or cfg.hidden_size
    if target is not None and target.hidden_size != cfg_target_hidden:
        key = "target_hidden_size" if cfg.target_hidden_size else "hidden_size (no target_hidden_size)"
        out.append(
            finding(
                "shape_mismatch",
                f"the draft config's {key} is {cfg_target_hidden} but the target's hidden_size is {target.hidden_size}",
                module="config.json",
                evidence={"draft_target_hidden": cfg_target_hidden, "target_hidden": target.hidden_size},
                fix=f"set target_hidden_size={target.hidden_size} in the draft config (or audit against the right target)",
            )
        )
    name = next((k for k in ("fc.weight", "model.fc.weight") if k in tensors), None)
    if name is None or len(tensors[name].shape) != 2:
        return out
    fc_in = tensors[name].shape[1]
    hidden = target.hidden_size if target else cfg_target_hidden
    cap = engine_capture(cfg, engine, target)
    delivered = len(cap.boundaries) if cap.boundaries is not None else 3
    built_aux = engine.fc_aux(dims_of(cfg))
    built = built_aux * cfg_target_hidden
    problems = []
    if fc_in != delivered * hidden:
        problems.append(f"the target delivers {delivered} x {hidden} = {delivered * hidden}")
    if fc_in != built:
        problems.append(f"{label} builds fc for {built_aux} x {cfg_target_hidden} = {built}")
    if problems:
        why = (
            " A fused input as wide as the draft's hidden size skips fc silently (fc bypass)."
            if delivered * hidden == cfg.hidden_size
            else ""
        )
        out.append(
            finding(
                "shape_mismatch",
                f"fc.weight takes {fc_in} input features, but " + " and ".join(problems) + "." + why,
                module="model.fc",
                evidence={
                    "fc_in_features": fc_in,
                    "delivered": delivered * hidden,
                    "engine_fc_in": built,
                    "num_aux": delivered,
                    "target_hidden": hidden,
                },  # fmt: skip
            )
        )
    return out


def check_null_keys(cfg: DraftConfigFile, engine: Engine) -> list[Finding]:
    """A key written as null that the engine reads as a value: the draft fails to build."""
    if engine.name != "sglang" or "target_hidden_size" not in cfg.null_keys:
        return []
    return [
        finding(
            "shape_mismatch",
            f"config.json sets target_hidden_size to null: {engine.label}'s draft class takes it as fc's input "
            "size whenever the key exists (hasattr(config, 'target_hidden_size')), so building fc fails "
            "(TypeError on None x num_aux) before the server serves",
            module="config.json",
            evidence={"target_hidden_size": None, "hidden_size": cfg.hidden_size},
            fix="set target_hidden_size to the target's hidden size, or delete the key (the draft's hidden_size is then used)",
        )
    ]


FC_NAMES = ("fc.weight", "model.fc.weight")


def last_state_draft(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], target: TargetConfig | None) -> str | None:
    """Why this draft is legitimately served on the target's last hidden state, or None.

    A draft trained on the last state (``use_aux_hidden_state`` false; ModelOpt's default,
    eagle/default_config.py) has no fc: nothing fuses aux states. The engine then hands it the
    last state as trained (SGLang skips fc when the input is as wide as the embedding; vLLM
    builds none). Not legitimate: a checkpoint with a trained fc (it was trained on fused aux
    states), a trainer that never trains last-state drafts, a target whose width differs from
    the draft's (SGLang would then apply its untrained fc)."""
    if cfg.use_aux_hidden_state is not False or any(name in tensors for name in FC_NAMES):
        return None
    trainer = recognition(cfg, tensors)
    if trainer.known and not any(TRAINERS[t].last_state_ok for t in trainer.trainers):
        return None
    if target is not None and target.hidden_size != cfg.hidden_size:
        return None
    who = trainer.label if trainer.known else "its trainer"
    return (
        f"a last-state draft: use_aux_hidden_state is false and the checkpoint has no fc, so {who} trained it on "
        "the target's last hidden state, which the engine hands it" + (f" ({trainer.why})" if trainer.known else "")
    )


def check_aux_enabled(
    cfg: DraftConfigFile, engine: Engine, tensors: dict[str, TensorInfo] | None = None, target: TargetConfig | None = None
) -> list[Finding]:
    if cfg.use_aux_hidden_state is not False:
        return []
    if tensors is not None and last_state_draft(cfg, tensors, target) is not None:
        return []
    trained_fc = tensors is not None and any(name in tensors for name in FC_NAMES)
    return [
        finding(
            "aux_capture_disabled",
            "eagle_config.use_aux_hidden_state is false: the target captures no aux hidden states and "
            + (
                "the draft gets the final hidden state, fc is skipped (fc bypass)"
                if engine.name == "sglang"
                else "vLLM builds the draft without fc"
            )
            + ("; the checkpoint holds a trained fc, so the draft was trained on fused aux states" if trained_fc else ""),
            module="config.json",
            evidence={"use_aux_hidden_state": False, "checkpoint_has_fc": trained_fc},
            fix="set eagle_config.use_aux_hidden_state=true (and launch with --speculative-algorithm EAGLE3)",
        )
    ]


VLLM_UNVERIFIED_FLAGS = ("fc_norm", "norm_output")


def _sglang_flag(flag: str, row: SGLangDraftFlag, cfg: DraftConfigFile, engine: Engine) -> Finding | None:
    """The finding for a flag the config sets, as this release's draft class treats it (None: honoured)."""
    label = engine.label
    if row.support == "implemented":
        return None
    head_from_target = cfg.draft_vocab_size is None and not cfg.tie_word_embeddings
    if row.support == "ignored" and not sglang_flag_applies(
        row, cfg.hidden_size, cfg.target_hidden_size, head_from_target=head_from_target
    ):
        return None
    evidence: dict[str, Any] = {
        flag: True, "engine": "sglang", "engine_version": engine.version, "releases": row.span,
        "read_in": list(row.read_in),
    }  # fmt: skip
    since = first_sglang_implementing(flag)
    if row.support == "unknown":
        return finding(
            "unsupported_config_flag",
            f"{flag}=true: {label}'s draft class was not read, so whether it implements the flag is not known "
            f"({row.how}). If it ignores it: {row.effect}",
            severity="warning",
            module="config.json",
            evidence=evidence,
            fix=(f"serve with SGLang {since} or newer, which implements it" if since
                 else f"check that release's models/llama_eagle3.py for {flag}, or retrain with {flag}=false"),
        )  # fmt: skip
    unread = "" if row.read(engine.version) else (
        f"; {engine.version} itself was not read, the rule is that of the releases read in {row.span}"
    )  # fmt: skip
    return finding(
        "unsupported_config_flag",
        f"{flag}=true is ignored by {label}: {row.effect} ({row.how}{unread})",
        severity=row.severity,  # type: ignore[arg-type]
        module="config.json",
        evidence=evidence,
        fix=f"retrain with {flag}=false, or serve with "
        + (f"SGLang {since} or newer, which implements it" if since else "an engine that implements it")
        + " (vLLM reads norm_before_residual and norm_before_fc)",
    )


def check_flags(cfg: DraftConfigFile, engine: Engine) -> list[Finding]:
    """Training flags the config sets that this engine release does not implement."""
    out = []
    for flag, value in cfg.flags.items():
        if not value:
            continue
        row = engine.draft_flag(flag)
        if row is not None:
            found = _sglang_flag(flag, row, cfg, engine)
            if found is not None:
                out.append(found)
        elif engine.name == "vllm" and flag in VLLM_UNVERIFIED_FLAGS:
            out.append(
                finding(
                    "unsupported_config_flag",
                    f"{flag}=true: spectrace has not verified that vLLM implements it",
                    severity="info",
                    module="config.json",
                    evidence={flag: True},
                    fix=f"check vLLM's llama_eagle3.py for {flag} before relying on it",
                )
            )
    return out


def check_rotary(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """The draft's rotary embedding as the engine builds it against the one its trainer trained
    with (:mod:`.rope_trained`): the trainer known from a record or recognised from the layout."""
    return check_trained_rope(
        cfg.rope,
        target.rope if target else None,
        recognition(cfg, tensors),
        trained_base=cfg.trained_rope_theta,
        trained_base_source=cfg.trained_rope_source,
        engine=engine.name,
        label=engine.label,
    )


def check_maps(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], maps: VocabMaps | None, target: TargetConfig | None) -> list[Finding]:
    """The checkpoint's d2t/t2d by value (when read) against the draft and target vocabularies."""
    if maps is None:
        return []
    name = next((n for n in sorted(tensors) if n.rsplit(".", 1)[-1] == "d2t"), "d2t")
    target_vocab = target.vocab_size if target and target.vocab_size else cfg.vocab_size
    return check_vocab_map(maps.d2t, maps.t2d, draft_vocab_size=cfg.draft_vocab_size, target_vocab=target_vocab, module=name)


def rotary_summary(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> dict[str, Any]:
    out: dict[str, Any] = {"draft": effective_rotary(cfg.rope, engine=engine.name).summary()}
    if target is not None and target.rope is not None:
        out["target"] = effective_rotary(target.rope, one_rotary=False, engine=engine.name).summary()
    return out

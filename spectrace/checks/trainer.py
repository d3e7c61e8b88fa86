"""The trainer of a draft checkpoint, from the audit's facts (known from a record, or
recognised from its layout: :func:`spectrace.rules.trainers.recognise`), and the id reading
it settles.

    >>> from spectrace.checks.facts import DraftConfigFile
    >>> cfg = DraftConfigFile(format="sglang", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    ...                       head_dim=16, intermediate_size=128, vocab_size=256, architectures=["LlamaForCausalLMEagle3"],
    ...                       eagle_config_keys=["use_aux_hidden_state"], tensor_roots=["midlayer."])
    >>> recognition(cfg).why
    'SpecForge: midlayer.* tensors and eagle_config'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..rules.readings import SPECULATORS_FLAGS, Reading, trained_with
from ..rules.trainers import TRAINERS, Recognition, recognise
from .facts import DraftConfigFile

_ROOTS = ("model.layers.", "midlayer.", "layers.")


def tensor_roots(names: Iterable[str]) -> list[str]:
    """The decoder-layer prefixes among a checkpoint's tensor names (what signs a layout)."""
    found = {next((r for r in _ROOTS if n.startswith(r)), "") for n in names}
    return sorted(found - {""})


def _signature(cfg: DraftConfigFile) -> dict[str, Any]:
    """The config keys :func:`recognise` reads, rebuilt from the parsed facts."""
    out: dict[str, Any] = {"architectures": list(cfg.architectures)}
    if cfg.eagle_config_keys:
        out["eagle_config"] = dict.fromkeys(cfg.eagle_config_keys, True)
    for key in ("speculators_model_type", "transformer_layer_config", *SPECULATORS_FLAGS):
        if key in cfg.speculators_traces:
            out[key] = True
    if cfg.stated is not None and cfg.stated.source == "trained_aux_boundaries":
        out["trainer_convention"] = cfg.stated.convention
        out["trained_aux_boundaries"] = list(cfg.stated.boundaries)
    return out


def recognition(cfg: DraftConfigFile, tensors: Mapping[str, Any] | None = None) -> Recognition:
    """Which trainer wrote this checkpoint, and how spectrace knows (``tensors``: its names, when
    the facts lack ``tensor_roots``)."""
    roots = cfg.tensor_roots or (tensor_roots(tensors) if tensors else [])
    return recognise(roots, _signature(cfg), cfg.trained_with, cfg.trained_with_source)


def recognition_from_config(config: Mapping[str, Any] | None) -> Recognition:
    """The trainer a live engine's draft config names or signs (its tensors were renamed by the
    engine: the config's keys alone are read)."""
    if not config:
        return Recognition((), "unknown", "no draft config")
    named = trained_with(config)
    return recognise((), config, named, "config.json (spectrace_trained_with)" if named else "")


def settled(readings: list[Reading], trainer: Recognition) -> list[Reading]:
    """The one reading of the ids a trainer's own layout settles (all of them otherwise)."""
    convention = trainer.convention
    if convention is None:
        return readings
    return [r for r in readings if r.convention == convention][:1] or readings


def with_roots(cfg: DraftConfigFile, tensors: Mapping[str, Any]) -> DraftConfigFile:
    """``cfg`` with the checkpoint's layout filled in, for the checks that read its trainer."""
    return cfg if cfg.tensor_roots else cfg.model_copy(update={"tensor_roots": tensor_roots(tensors)})


def stated_trained_base(config: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """The base a draft config states it was trained with (``trained_rope_theta``, which
    spectrace's pipeline stamps beside its other provenance keys), and what said so."""
    value = (config or {}).get("trained_rope_theta")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value), "config.json (trained_rope_theta)"
    return None, ""


def last_state_by_config(config: Mapping[str, Any] | None) -> str | None:
    """Why a served draft is legitimately fed the target's last hidden state, from its config
    alone (a live engine renamed its tensors): ``use_aux_hidden_state`` false, no aux ids, and a
    config signed by a trainer that trains such drafts (ModelOpt's default). None otherwise."""
    eagle = (config or {}).get("eagle_config")
    if not isinstance(eagle, Mapping) or eagle.get("use_aux_hidden_state") is not False or eagle.get("eagle_aux_hidden_state_layer_ids"):
        return None
    trainer = recognition_from_config(config)
    if not trainer.known or not all(TRAINERS[t].last_state_ok for t in trainer.trainers):
        return None
    return f"a last-state draft: {trainer.why}, use_aux_hidden_state false and no aux ids; it was trained on the target's last hidden state"

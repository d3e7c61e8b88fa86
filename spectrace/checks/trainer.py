"""The trainer of a draft checkpoint, from the audit's facts: known from a record, or
recognised from its layout (:func:`spectrace.rules.trainers.recognise`).

    >>> from spectrace.checks.facts import DraftConfigFile
    >>> cfg = DraftConfigFile(format="sglang", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    ...                       head_dim=16, intermediate_size=128, vocab_size=256, eagle_config_keys=["use_aux_hidden_state"])
    >>> recognition(cfg, {"midlayer.self_attn.q_proj.weight": None}).why
    'SpecForge: midlayer.* tensors and eagle_config'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rules.trainers import Recognition, recognise
from .facts import DraftConfigFile


def _signature(cfg: DraftConfigFile) -> dict[str, Any]:
    """The config keys :func:`recognise` reads, rebuilt from the parsed facts."""
    out: dict[str, Any] = {"architectures": list(cfg.architectures)}
    if cfg.eagle_config_keys:
        out["eagle_config"] = dict.fromkeys(cfg.eagle_config_keys, True)
    for key in ("speculators_model_type", "transformer_layer_config"):
        if key in cfg.speculators_traces:
            out[key] = True
    if cfg.stated is not None and cfg.stated.source == "trained_aux_boundaries":
        out["trainer_convention"] = cfg.stated.convention
        out["trained_aux_boundaries"] = list(cfg.stated.boundaries)
    return out


def recognition(cfg: DraftConfigFile, tensors: Mapping[str, Any]) -> Recognition:
    """Which trainer wrote this checkpoint, and how spectrace knows."""
    return recognise(tensors.keys(), _signature(cfg), cfg.trained_with, cfg.trained_with_source)

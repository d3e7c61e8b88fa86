"""What a draft's config.json says it was trained on, under each plausible reading.

A speculators config names its ids at the top level in the speculators convention
(boundary = id). An SGLang-format config (``eagle_config``) may come from SpecForge
(boundary = id + 1) or be converted by hand from speculators (boundary = id): the file
alone cannot tell, so both readings are returned, the likelier first.

    >>> readings({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}, 8)[0].boundaries
    [2, 4, 6]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .conventions import TRAINER_CONVENTIONS, default_ids, trainer_boundaries

# Flags only the speculators trainer writes, and its own keys. SpecForge writes none of
# them: left in an SGLang-format config, they say it was converted by hand from a
# speculators checkpoint, so its ids most likely follow speculators' convention.
SPECULATORS_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "embed_requires_grad")
SPECULATORS_TRACES = (
    "speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config", *SPECULATORS_FLAGS,
)  # fmt: skip


@dataclass(frozen=True)
class Reading:
    """One plausible meaning of a draft's ids: the trainer convention and the boundaries it trained on."""

    convention: str
    ids: list[int] | None  # None: no ids in the config, the trainer's default boundaries
    boundaries: list[int]
    source: str  # where the ids came from: "eagle_config", "top-level", "default", a provenance key


def speculators_traces(config: Mapping[str, Any]) -> list[str]:
    """The speculators-only keys present in ``config``."""
    return [key for key in SPECULATORS_TRACES if key in config]


def aux_ids(config: Mapping[str, Any]) -> tuple[list[int] | None, str]:
    """The layer ids in the config and where they sit (SGLang reads only eagle_config)."""
    eagle = config.get("eagle_config") or {}
    if isinstance(eagle, Mapping) and eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        return [int(i) for i in eagle["eagle_aux_hidden_state_layer_ids"]], "eagle_config"
    if config.get("eagle_aux_hidden_state_layer_ids") is not None:
        return [int(i) for i in config["eagle_aux_hidden_state_layer_ids"]], "top-level"
    return None, "default"


IDS_KEY = "eagle_aux_hidden_state_layer_ids"


def readings(config: Mapping[str, Any], num_layers: int | None) -> list[Reading]:
    """Trained boundaries under each plausible trainer convention, likeliest first."""
    eagle = config.get("eagle_config") or {}
    eagle_ids = eagle.get(IDS_KEY) if isinstance(eagle, Mapping) else None
    top_ids = config.get(IDS_KEY)
    return trained_readings(
        stated=provenance(config),
        top_level_ids=[int(i) for i in top_ids] if top_ids else None,
        eagle_config_ids=[int(i) for i in eagle_ids] if eagle_ids else None,
        speculators_hints=bool(speculators_traces(config)),
        num_layers=num_layers,
    )


def trained_readings(
    *,
    stated: Reading | None,
    top_level_ids: list[int] | None,
    eagle_config_ids: list[int] | None,
    speculators_hints: bool,
    num_layers: int | None,
) -> list[Reading]:
    """The one reading of a draft's training, for the runtime check and the audit alike.

    - A config that states its training (``trainer_convention`` + ``trained_aux_*``) has
      one reading.
    - Top-level ids are the trainer's own (only speculators writes them; SGLang never
      reads them): one speculators reading.
    - ``eagle_config`` ids may come from SpecForge or a hand conversion from speculators:
      both readings, the speculators one first when the file carries speculators' keys;
      only one when the other names a boundary below 0 (id -1 exists under SpecForge only).
    - No ids: both trainers' defaults name the same boundaries, one reading.
    """
    if stated is not None:
        return [stated]
    if top_level_ids:
        ids = list(top_level_ids)
        return [Reading("speculators", ids, trainer_boundaries(ids, "speculators"), f"top-level {IDS_KEY}")]
    if eagle_config_ids:
        ids = list(eagle_config_ids)
        order = ["speculators", "specforge"] if speculators_hints else ["specforge", "speculators"]
        both = [Reading(t, ids, trainer_boundaries(ids, t), f"eagle_config.{IDS_KEY}") for t in order]
        # A reading that names a boundary below 0 is no reading: id -1 is the embedding
        # under SpecForge's convention and names nothing under speculators' (0 is the
        # embedding there), so [-1, 1, 3] can only be SpecForge's.
        possible = [r for r in both if min(r.boundaries) >= 0]
        return possible or both
    if num_layers:
        return [Reading("trainer default", None, default_ids("speculators", num_layers), "no ids in the config: the trainer's default")]
    return []


def provenance(config: Mapping[str, Any]) -> Reading | None:
    """The trained boundaries a config states outright, if it does.

    A trainer (or the team converting a checkpoint) can stamp ``trainer_convention``
    plus ``trained_aux_boundaries`` (or ``trained_aux_layer_ids``) into config.json; the
    engines ignore unknown keys, and the ambiguity of the ids goes away.
    """
    convention = config.get("trainer_convention")
    boundaries = config.get("trained_aux_boundaries")
    ids = config.get("trained_aux_layer_ids")
    if boundaries is not None:
        return Reading(
            str(convention or "stated"), [int(i) for i in (ids or boundaries)], [int(b) for b in boundaries], "trained_aux_boundaries"
        )
    if ids is not None and convention in TRAINER_CONVENTIONS:
        return Reading(str(convention), [int(i) for i in ids], trainer_boundaries(ids, str(convention)), "trained_aux_layer_ids")
    return None


TRAINED_WITH_ENV = "SPECTRACE_TRAINED_WITH"
# Where the audit puts what the checkpoint folder's own record says (audit.trainer_record):
# the engines ignore unknown keys, and the runtime check reads the same key.
TRAINED_WITH_KEY = "spectrace_trained_with"


def trained_with(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The trainer that wrote this draft, when something says so for certain (None: unknown).

    In order: ``SPECTRACE_TRAINED_WITH`` (the user's word), the trainer's record the audit
    found in the checkpoint folder (:data:`TRAINED_WITH_KEY`), a stated ``trainer_convention``.
    A value other than ``specforge`` / ``speculators`` counts as unknown.
    """
    import os

    env = os.environ if env is None else env
    for value in (env.get(TRAINED_WITH_ENV), config.get(TRAINED_WITH_KEY), config.get("trainer_convention")):
        if isinstance(value, str) and value.strip().lower() in TRAINER_CONVENTIONS:
            return value.strip().lower()
    return None


def uses_aux_hidden_state(config: Mapping[str, Any]) -> bool:
    eagle = config.get("eagle_config") or {}
    if isinstance(eagle, Mapping) and "use_aux_hidden_state" in eagle:
        return bool(eagle["use_aux_hidden_state"])
    return True


def is_eagle3_architecture(config: Mapping[str, Any]) -> bool:
    archs = config.get("architectures") or []
    return any("Eagle3" in str(a) for a in archs) or config.get("speculators_model_type") == "eagle3"

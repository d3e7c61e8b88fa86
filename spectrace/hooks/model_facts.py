"""What the models handed to ``spectrace.trace()`` say about their EAGLE-3 wiring.

A trace made from Python sees no engine start-up: no weight load, no capture set-up. What
the models themselves hold still tells a lot, and the checks that run on a server run on
it too: the target's capture list (which boundaries it concatenates, whether capture is on
at all) and the draft's config (its aux ids, training flags, vocabulary sizes).

Read by attribute only, never by calling the model: the reference pipeline's target
(``capture``, ``aux_enabled``), an engine's target class built without a server (SGLang's
``model.layers_to_capture`` and ``capture_aux_hidden_states``) and any draft whose
``config`` is a Hugging Face config or a dataclass that kept its ``config.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..records import Capture
from ..rules.conventions import engine_rule
from ..rules.readings import is_eagle3_architecture


def config_dict(model: Any) -> dict[str, Any] | None:
    """The model's config as ``config.json`` holds it, or None when it keeps none."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    raw = getattr(config, "raw", None)  # the reference draft keeps its whole config.json
    if isinstance(raw, Mapping) and raw:
        return dict(raw)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        try:
            out = to_dict()
        except Exception:
            return None
        return dict(out) if isinstance(out, Mapping) else None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, Mapping) else None


def draft_config(model: Any) -> dict[str, Any] | None:
    """The config of an EAGLE-3 draft (its architecture or an ``eagle_config`` says so), else None."""
    config = config_dict(model)
    if not config:
        return None
    if "eagle_config" in config or config.get("speculators_model_type") == "eagle3" or is_eagle3_architecture(config):
        return config
    return None


def engine_of(model: Any) -> str:
    """Which engine's draft rules apply to ``model``: its class's package says (the reference
    pipeline mirrors SGLang)."""
    return "vllm" if type(model).__module__.split(".", 1)[0] == "vllm" else "sglang"


def capture_of(model: Any, name: str) -> Capture | None:
    """The capture a target is set up for, as a ``capture`` record; None for a model that
    holds no capture list (not an EAGLE-3 target, or one whose class this does not know)."""
    capture = getattr(model, "capture", None)
    if capture is not None and hasattr(capture, "boundaries") and hasattr(model, "aux_enabled"):
        # The reference pipeline's target: ids asked, boundaries the engine's rule captures.
        enabled = bool(model.aux_enabled)
        return Capture(
            module=name,
            requested_ids=list(getattr(capture, "ids", []) or []),
            boundaries=list(capture.boundaries) if enabled else [],
            num_layers=int(model.num_layers),
            hidden_size=int(model.hidden_size),
            rule=str(getattr(model, "convention", "")),
            enabled=enabled,
        )
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers_to_capture", None)
    if layers is None or not hasattr(model, "capture_aux_hidden_states"):
        return None
    # An SGLang target class: ``layers_to_capture`` holds the layer indices whose input is
    # captured, which are boundaries (the +1 of its rule is already applied).
    config = config_dict(model) or {}
    num_layers, hidden = config.get("num_hidden_layers"), config.get("hidden_size")
    archs = config.get("architectures") or [type(model).__name__]
    if not isinstance(num_layers, int) or not isinstance(hidden, int):
        return None
    enabled = bool(model.capture_aux_hidden_states)
    return Capture(
        module=name,
        requested_ids=None,
        boundaries=[int(b) for b in layers] if enabled else [],
        num_layers=num_layers,
        hidden_size=hidden,
        rule=engine_rule(archs),
        enabled=enabled,
    )


def hot_map_loaded(model: Any) -> bool | None:
    """Whether the draft holds a draft-to-target id map (SGLang's ``hot_token_id``); None
    when its class keeps no such attribute."""
    getter = getattr(model, "get_hot_token_id", None)
    if callable(getter):
        try:
            return getter() is not None
        except Exception:
            return None
    if hasattr(model, "hot_token_id"):
        return model.hot_token_id is not None
    return None

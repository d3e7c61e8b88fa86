"""A model's config as the dict the checks read, and the rotary keys in it, for either engine.

Both engines hand their models a transformers config object (or a plain dict from a test or
a script); the checks read dicts. The rotary keys are read as the audit reads them, so a
runtime ``rope_mismatch`` names the same key an offline ``spectrace audit`` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_to_dict(config: Any) -> dict[str, Any] | None:
    """A transformers config object (or a mapping) as a dict; None when there is none."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return dict(config)
    try:
        return dict(config.to_dict())
    except Exception:
        try:
            return {k: v for k, v in vars(config).items() if not k.startswith("_")}
        except TypeError:
            return None  # an object without a __dict__: nothing to read


def rope_keys_of(config: dict[str, Any] | None, draft: bool) -> Any:
    """The config's rotary keys as the audit reads them (None when unreadable)."""
    if not config:
        return None
    # Lazily: the audit's reader is only needed once a config is known.
    from ...audit.checkpoint import parse_draft_config, rope_keys

    try:
        if draft:
            return parse_draft_config(config).rope
        inner = config.get("text_config")
        if isinstance(inner, dict):  # a multimodal target: its language model's config
            return rope_keys(inner, "text_config.")
        return rope_keys(config, "")
    except Exception:
        return None  # an odd config: the live rotaries still compare

"""The draft side: its config.json (for the capture join and fc_bypass) and its fc input.

- AFTER a draft class's ``__init__(self, *, vllm_config, prefix="")``: the raw config.json
  of ``speculative_config.model`` is read (it keeps the keys vLLM's parsed config drops),
  else the parsed config; a config with ``use_aux_hidden_state`` false gets ``fc_bypass``.
- AFTER ``SpeculatorsConfig.extract_transformers_pre_trained_config(config_dict)``: the
  speculators-format config as the checkpoint wrote it.
- BEFORE ``combine_hidden_states(self, hidden_states)`` (eager, once per propose): the
  width of what fc receives against ``fc_input_size``; shapes only, no device sync.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping
from typing import Any

from ...checks.vllm import check_vllm_fc_bypass, check_vllm_fc_width
from ..core.configs import config_to_dict
from . import capture, state

_paths: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def draft_path(model: Any) -> str | None:
    try:
        return _paths.get(model)
    except TypeError:
        return None


def _spec_config(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    vllm_config = kwargs.get("vllm_config")
    if vllm_config is None:
        vllm_config = next((a for a in args[1:] if hasattr(a, "speculative_config")), None)
    return getattr(vllm_config, "speculative_config", None)


def read_config_json(path: str | None) -> dict[str, Any] | None:
    """A local checkpoint's config.json, or None (a hub id, unreadable, or too large)."""
    if not path:
        return None
    file = os.path.join(path, "config.json")
    try:
        if os.path.getsize(file) > MAX_CONFIG_BYTES:
            return None
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def note_draft_config(config: Mapping[str, Any] | None, source: str) -> None:
    """The draft's config; the raw file is preferred over a parsed object."""
    if not config:
        return
    with state.lock():
        st = state.STATE
        if st.draft_config is not None and st.draft_config_source.endswith("config.json") and not source.endswith("config.json"):
            return
        st.draft_config = dict(config)
        st.draft_config_source = source
    for found in check_vllm_fc_bypass(config):
        state.emit_finding(found)
    capture.run()


def after_draft_init(result: Any, *args: Any, **kwargs: Any) -> None:
    model = args[0] if args else None
    spec = _spec_config(args, kwargs)
    draft_model_config = getattr(spec, "draft_model_config", None)
    path = getattr(spec, "model", None) or getattr(draft_model_config, "model", None)
    if model is not None and isinstance(path, str):
        _paths[model] = path
    raw = read_config_json(path if isinstance(path, str) else None)
    if raw is not None:
        note_draft_config(raw, f"{path}/config.json")
    else:
        note_draft_config(config_to_dict(getattr(model, "config", None)), f"{type(model).__name__}.config")
    # Synthetic rejection sampling makes every acceptance figure synthetic: said once.
    from .acceptance import note_speculative_config

    note_speculative_config(spec)
    _keep_replay(model)
    return None


def _keep_replay(model: Any) -> None:
    """SPECTRACE_REPLAY: keep the draft's inputs and module outputs of a few eager forwards
    (hooks/replay_capture.py); vLLM's fc runs in combine_hidden_states, before the forward."""
    rec = state.recorder()
    settings = getattr(rec, "settings", None)
    if model is None or not getattr(settings, "replay", False):
        return
    from ...hooks.replay_capture import draft_parts, keep_replay

    with state.lock():  # one capture per draft (hooks registered once)
        if draft_parts(model) is None or any(kept.draft is model for kept in state.STATE.replays):
            return
        state.STATE.replays.append(keep_replay(model, rows=settings.replay_rows, recorder=rec))
        capture.link_taps()


def after_speculators_reader(result: Any, *args: Any, **kwargs: Any) -> None:
    config = kwargs.get("config_dict", args[1] if len(args) > 1 else None)
    if isinstance(config, Mapping):
        note_draft_config(config, "speculators config.json")
    return None


def before_combine(*args: Any, **kwargs: Any) -> None:
    model = args[0] if args else None
    hidden = kwargs.get("hidden_states", args[1] if len(args) > 1 else None)
    inner = getattr(model, "model", None)
    if inner is None or not getattr(inner, "use_aux_hidden_state", False):
        return None  # no fc: fc_bypass was said from the config
    expected = getattr(inner, "fc_input_size", None)
    shape = getattr(hidden, "shape", None)
    if not isinstance(expected, int) or not shape:
        return None
    for found in check_vllm_fc_width(int(shape[-1]), expected):
        state.emit_finding(found)
    return None

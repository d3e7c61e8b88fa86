"""Join what the target captures with what the draft was trained on.

Whichever of the two arrives second (the target's ``set_eagle3_layers_to_capture`` or
the draft's config, from the server args, the draft's construction or its load) runs
the capture checks, in either order. Without a server (SGLang's classes built in a
script, a test or a notebook) the draft's config comes from the draft object itself.

A pair is checked once: captures and configs are keyed by their content, not by the
object that carried them (the same config arrives at the draft's construction and again
at its load), and a finding the join already emitted is never emitted again. What the
capture alone decides (an engine release that will crash on it, a short capture) is
said as soon as the capture is known, before the first forward.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...checks.capture import check_algorithm, check_capture, check_config_flags, check_engine_support
from ...records import Capture
from ...rules.readings import is_eagle3_architecture, uses_aux_hidden_state
from . import server, state

# Findings that depend on the capture alone: once per capture, whatever config joins it.
_PER_CAPTURE = ("short_capture", "aux_capture_disabled", "capture_unsupported")


def note_capture(capture: Capture) -> None:
    state.STATE.capture = capture
    state.emit(capture)
    state.STATE.captures_emitted += 1
    learn_from_server()
    run()


def note_draft_config(config: Mapping[str, Any] | None, source: str = "") -> None:
    """The draft's config (raw config.json preferred: it keeps the keys SGLang ignores)."""
    if not config:
        return
    st = state.STATE
    if st.draft_config is not None and st.draft_config_source.endswith("config.json") and not source.endswith("config.json"):
        return  # keep the raw file over the parsed config object
    if is_eagle3_architecture(config):
        st.eagle3_draft = True
    if st.draft_config is not None and _config_key(st.draft_config) == _config_key(config):
        return  # the same config again (construction, then load): nothing new to check
    st.draft_config = dict(config)
    st.draft_config_source = source
    run()


def learn_from_server() -> None:
    st = state.STATE
    args = server.spec_args()
    if args.get("speculative_algorithm") is not None:
        st.algorithm = server.algorithm()
    if st.draft_config is None or not st.draft_config_source.endswith("config.json"):
        path = args.get("speculative_draft_model_path")
        raw = server.draft_config_from_path(path)
        if raw is not None:
            st.draft_config = raw
            st.draft_config_source = f"{path}/config.json"
            st.eagle3_draft = st.eagle3_draft or is_eagle3_architecture(raw)
            # Under --speculative-algorithm EAGLE no capture call ever comes to trigger the
            # checks (seen on a live 0.5.17 server): run them as soon as the config is known.
            run()


def run() -> None:
    """Run the checks that the known facts allow, each pair once."""
    with state.lock():
        _run()


def _run() -> None:
    st = state.STATE
    config = st.draft_config
    capture = st.capture
    cap_key = _capture_key(capture) if capture is not None else None
    cfg_key = _config_key(config) if config is not None else None
    if capture is not None and (cap_key, None) not in st.checked_pairs:
        # What the capture alone decides, said now: not at the draft's load, and not
        # after the first forward has crashed on it.
        st.checked_pairs.add((cap_key, None))
        version = (capture.model_extra or {}).get("engine_version") or server.sglang_version()
        for f in check_engine_support(capture, version):
            _emit_capture_finding(cap_key, f)
        if config is None:
            for f in check_capture(capture, None, st.algorithm):
                _emit_capture_finding(cap_key, f)
    if config is None:
        return
    key = (cap_key, cfg_key)
    if key in st.checked_pairs:
        return
    st.checked_pairs.add(key)
    if ("config", cfg_key) not in st.checked_pairs:
        st.checked_pairs.add(("config", cfg_key))  # the config's own checks: once per config
        for f in check_algorithm(st.algorithm, config) + check_config_flags(config, "sglang", server.sglang_version()):
            _emit_once(f)
    if capture is None:
        disabled = (st.algorithm is not None and st.algorithm != "EAGLE3") or not uses_aux_hidden_state(config)
        if disabled and is_eagle3_architecture(config):
            # SGLang never calls set_eagle3_layers_to_capture in this case: say so now.
            off = Capture(module="target", requested_ids=None, boundaries=[], num_layers=0, hidden_size=0, rule="none", enabled=False)
            for f in check_capture(off, config, st.algorithm):
                _emit_once(f)
        return
    version = (capture.model_extra or {}).get("engine_version") or server.sglang_version()
    for f in check_capture(capture, config, st.algorithm, engine_version=version):
        _emit_capture_finding(cap_key, f)


def _emit_capture_finding(cap_key: str | None, found: Any) -> None:
    # short_capture / aux_capture_disabled / capture_unsupported depend on the capture alone: once per capture.
    if found.code in _PER_CAPTURE:
        key = (cap_key, found.code)
        if key in state.STATE.checked_pairs:
            return
        state.STATE.checked_pairs.add(key)
    _emit_once(found)


def _emit_once(found: Any) -> None:
    """Emit a finding of the join unless the very same one was emitted already."""
    key = (found.code, found.severity, found.module, found.message)
    if key in state.STATE.join_emitted:
        return
    state.STATE.join_emitted.add(key)
    state.emit(found)


def _capture_key(capture: Capture) -> str:
    return capture.model_dump_json()


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)

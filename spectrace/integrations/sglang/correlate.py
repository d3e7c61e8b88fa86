"""Join what the target captures with what the draft was trained on.

Whichever of the two arrives second (the target's ``set_eagle3_layers_to_capture`` or
the draft's config, from the server args or the draft's load) runs the capture checks.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...checks.capture import check_algorithm, check_capture, check_config_flags
from ...eagle3.draft_config import is_eagle3_architecture, uses_aux_hidden_state
from ...records import Capture
from . import server, state


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
    st.draft_config = dict(config)
    st.draft_config_source = source
    if is_eagle3_architecture(config):
        st.eagle3_draft = True
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
    st = state.STATE
    config = st.draft_config
    capture = st.capture
    if config is None:
        if capture is not None and (id(capture), None) not in st.checked_pairs:
            # A short capture needs no draft config: say it now, not at the draft's load.
            st.checked_pairs.add((id(capture), None))
            for f in check_capture(capture, None, st.algorithm):
                _emit_capture_finding(capture, f)
        return
    key = (id(capture), id(config))
    if key in st.checked_pairs:
        return
    st.checked_pairs.add(key)
    if not any(k[1] == id(config) for k in st.checked_pairs - {key}):
        for f in check_algorithm(st.algorithm, config) + check_config_flags(config, "sglang"):
            state.emit(f)
    if capture is None:
        disabled = (st.algorithm is not None and st.algorithm != "EAGLE3") or not uses_aux_hidden_state(config)
        if disabled and is_eagle3_architecture(config):
            # SGLang never calls set_eagle3_layers_to_capture in this case: say so now.
            off = Capture(module="target", requested_ids=None, boundaries=[], num_layers=0, hidden_size=0, rule="none", enabled=False)
            for f in check_capture(off, config, st.algorithm):
                state.emit(f)
        return
    for f in check_capture(capture, config, st.algorithm):
        _emit_capture_finding(capture, f)


def _emit_capture_finding(capture: Capture, found: Any) -> None:
    # short_capture / aux_capture_disabled depend on the capture alone: once per capture.
    if found.code in ("short_capture", "aux_capture_disabled"):
        key = (id(capture), found.code)
        if key in state.STATE.checked_pairs:
            return
        state.STATE.checked_pairs.add(key)  # type: ignore[arg-type]
    state.emit(found)

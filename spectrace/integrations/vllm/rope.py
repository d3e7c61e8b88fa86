"""The draft's rotary embedding against the target's, as vLLM built them.

vLLM builds each attention's rotary from the config it was handed and checks nothing
between the two models. The target is known here when its aux-layer capture is set up
(``set_aux_hidden_state_layers``, the capture hook), which V1's runner does after the
draft's load and Model Runner V2 around it: whichever of the draft's load and the
target's capture comes second runs the comparison, once per pair.
"""

from __future__ import annotations

import weakref
from typing import Any

from ...checks.rope_trained import check_live_trained_rope
from ...checks.trainer import recognition_from_config, stated_trained_base
from ..core.configs import config_to_dict, rope_keys_of
from ..core.rotary import live_rotaries
from . import state


def _compare(draft: Any, target: Any) -> None:
    pair = (id(draft), id(target))
    st = state.STATE
    if pair in st.rope_checked:
        return
    st.rope_checked.add(pair)
    draft_config = st.draft_config if st.draft_config else config_to_dict(getattr(draft, "config", None))
    base, said = stated_trained_base(draft_config)
    for found in check_live_trained_rope(
        live_rotaries(draft),
        live_rotaries(target),
        draft_keys=rope_keys_of(draft_config, True),
        target_keys=rope_keys_of(config_to_dict(getattr(target, "config", None)), False),
        trainer=recognition_from_config(draft_config),
        trained_base=base,
        trained_base_source=said,
        label="vLLM",
        source="vllm.rope",
    ):
        state.emit_finding(found)


def _alive(refs: list[weakref.ReferenceType[Any]]) -> list[Any]:
    refs[:] = [r for r in refs if r() is not None]
    return [r() for r in refs]


def at_draft_load(draft: Any) -> None:
    """The draft's load: compare with the targets known, and with any known later."""
    st = state.STATE
    st.rope_drafts.append(weakref.ref(draft))
    for target in _alive(st.rope_targets):
        _compare(draft, target)


def at_target_capture(target: Any) -> None:
    """The target's capture was set up: compare with the drafts loaded so far."""
    st = state.STATE
    if any(r() is target for r in st.rope_targets):
        return
    st.rope_targets.append(weakref.ref(target))
    for draft in _alive(st.rope_drafts):
        try:
            _compare(draft, target)
        except Exception as exc:
            state.internal_error("draft rope", exc)

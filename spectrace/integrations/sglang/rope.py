"""The draft's rotary embedding against the target's, as SGLang built them.

SGLang builds each decoder layer's rotary from the config it was handed (a draft config
that lost its ``rope_theta`` gets 10000 beside a 500000 target), checks nothing, and the
draft serves with another phase at every position. At the draft's load both models
exist in the process (the target's ``ModelRunner`` loads first); in a script that
builds the draft first, the check runs when the target is built. The draft's config
names or signs its trainer (:mod:`spectrace.checks.trainer`): the built rotary is judged
against the one that trainer trained with, as the audit judges the config.
"""

from __future__ import annotations

import weakref
from typing import Any

from ...checks.rope_trained import check_live_trained_rope
from ...checks.trainer import recognition_from_config, stated_trained_base
from ..core.configs import config_to_dict, rope_keys_of
from ..core.rotary import live_rotaries
from . import state


def _draft_config(draft: Any) -> dict[str, Any] | None:
    st = state.STATE
    if st.draft_config is not None and st.draft_config_source.endswith("config.json"):
        return st.draft_config  # the raw file keeps keys the parsed config object drops
    return config_to_dict(getattr(draft, "config", None))


def _targets(draft: Any) -> list[Any]:
    """The targets built so far (in this state: a reset forgets the earlier ones), oldest first."""
    refs = state.STATE.rope_targets
    refs[:] = [r for r in refs if r() is not None and r() is not draft]
    return [r() for r in refs]


def check_pair(draft: Any, target: Any) -> None:
    """rope_mismatch when the draft's rotary rotates like none of the target's (once per pair of values)."""
    drafts, targets = live_rotaries(draft), live_rotaries(target)
    config = _draft_config(draft)
    draft_keys = rope_keys_of(config, True)
    target_keys = rope_keys_of(config_to_dict(getattr(target, "config", None)), False)
    base, said = stated_trained_base(config)
    for found in check_live_trained_rope(
        drafts, targets, draft_keys=draft_keys, target_keys=target_keys, trainer=recognition_from_config(config),
        trained_base=base, trained_base_source=said, source="sglang.rope",
    ):  # fmt: skip
        key = "rope_mismatch:" + found.message
        state.emit_once(key, lambda found=found: found.model_copy(update={"module": found.module or "draft"}))


def at_draft_load(draft: Any) -> None:
    """The draft's load: compare with the latest target built in this process, else wait for one."""
    targets = _targets(draft)
    if not targets:
        # A draft whose load came before any target was built (scripts): checked at the
        # target's birth. Kept in the state, so a reset forgets it with the rest.
        state.STATE.rope_pending.append(weakref.ref(draft))
        return
    check_pair(draft, targets[-1])


def at_target_built(target: Any) -> None:
    """A target was built: remember it, and compare the drafts whose load came first."""
    state.STATE.rope_targets.append(weakref.ref(target))
    pending = state.STATE.rope_pending
    waiting = [ref() for ref in pending]
    pending.clear()
    for draft in waiting:
        if draft is not None:
            try:
                check_pair(draft, target)
            except Exception as exc:
                state.internal_error("draft rope", exc)

"""Shape checks on the live data path: the draft's fc input and the target's stored states.

Both read only shapes (host metadata): no ``.item()``, no ``.cpu()``, safe while a CUDA
graph is being captured (which is the only time they run for graphed steps).

- Draft ``LlamaModel.forward`` (and Kimi's ``Eagle3MLAModel.forward``) apply ``fc`` only
  ``if hidden_states.shape[-1] != embeds.shape[-1]``. In the modes whose hidden states
  come from the target (prefill extend, draft extend) they must be ``fc.in_features``
  wide; in the multi-step draft decode (``DECODE``) the draft reads its own 1 x hidden
  output, so skipping fc there is by design and is not checked.
- ``LogitsProcessor._get_hidden_states_to_store`` stores the final normed hidden state
  when the target captured no aux states; with an EAGLE-3 draft being served that is
  the start of bug 1.
"""

from __future__ import annotations

from typing import Any

from ...checks.trainer import last_state_by_config
from ...checks.widths import check_draft_input_width, check_stored_hidden
from . import server, state

# Forward modes whose spec_info.hidden_states were produced by the target (any version).
FROM_TARGET_MODES = frozenset({"EXTEND", "MIXED", "SPLIT_PREFILL", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"})


def _forward_batch(args: tuple, kwargs: dict) -> Any:
    if "forward_batch" in kwargs:
        return kwargs["forward_batch"]
    for value in args[1:]:
        if hasattr(value, "spec_info") and hasattr(value, "forward_mode"):
            return value
    return None


def _fc_in(fc: Any) -> int | None:
    for attr in ("in_features", "input_size"):
        value = getattr(fc, attr, None)
        if isinstance(value, int):
            return value
    weight = getattr(fc, "weight", None)
    return int(weight.shape[-1]) if weight is not None and weight.dim() == 2 else None


def _hidden(model: Any) -> int | None:
    embed = getattr(model, "embed_tokens", None)
    value = getattr(embed, "embedding_dim", None)
    if isinstance(value, int):
        return value
    config = getattr(model, "config", None)
    value = getattr(config, "hidden_size", None)
    return int(value) if value else None


def check_draft_input(model: Any, batch: Any) -> None:
    mode = getattr(getattr(batch, "forward_mode", None), "name", "")
    if mode not in FROM_TARGET_MODES:
        return
    hs = getattr(getattr(batch, "spec_info", None), "hidden_states", None)
    fc = getattr(model, "fc", None)
    if hs is None or fc is None or hs.dim() == 0 or hs.shape[0] == 0:
        return
    seen, expected, hidden = int(hs.shape[-1]), _fc_in(fc), _hidden(model)
    if expected is None or seen == expected:
        return  # the common case: no finding to build
    capture = state.STATE.capture
    boundaries = capture.boundaries if capture else None
    last_state = last_state_by_config(state.STATE.draft_config)
    if not check_draft_input_width(seen, expected, hidden, mode, boundaries, last_state=last_state):
        return  # a last-state draft gets the state it was trained on
    # Said once per kind, repeats counted; the finding is built only the first time.
    state.emit_once(
        "fc_bypass" if seen == hidden else "draft_width",
        lambda: check_draft_input_width(seen, expected, hidden, mode, boundaries, source="sglang.forward")[0],
    )


def around_draft_forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    """HookRegistry AROUND on the draft's inner model ``forward``: check, then run unchanged."""
    try:
        batch = _forward_batch(args, kwargs)
        if batch is not None:
            check_draft_input(args[0], batch)
    except Exception as exc:
        state.internal_error("draft forward", exc)
    return original(*args, **kwargs)


def _arg(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _serving_eagle3() -> bool:
    st = state.STATE
    if st.eagle3_draft:
        return True
    algo = server.algorithm()
    return algo == "EAGLE3"


def after_hidden_to_store(result: Any, *args: Any, **kwargs: Any) -> None:
    """HookRegistry AFTER on ``_get_hidden_states_to_store(self, hidden_states,
    hidden_states_before_norm, aux_hidden_states, pruned_states, pruned_states_before_norm,
    aux_pruned_states, sample_indices, logits_metadata)`` (same in 0.5.17 and 0.5.23)."""
    try:
        if result is None or _arg(args, kwargs, "aux_hidden_states", 3) is not None:
            return None
        meta = _arg(args, kwargs, "logits_metadata", 8)
        mode = getattr(meta, "capture_hidden_mode", None)
        if mode is None or not mode.need_capture() or not _serving_eagle3():
            return None
        width = int(result.shape[-1])
        name = getattr(mode, "name", str(mode))
        if last_state_by_config(state.STATE.draft_config):
            return None  # a last-state draft was trained on this very state
        state.emit_once("logits_fallback", lambda: check_stored_hidden(width, name, source="sglang.forward")[0])
    except Exception as exc:
        state.internal_error("logits processor", exc)
    return None

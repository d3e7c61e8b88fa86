"""AFTER ``set_eagle3_layers_to_capture`` on a target: the capture list really in effect.

SGLang captures the residual stream entering layer ``i`` for every ``i`` in
``model.layers_to_capture`` (Llama and DeepSeek alike), walking layers in order: so the
boundaries are the sorted, de-duplicated indices inside ``[0, num_layers)``. Reading the
list after the call (not re-deriving it from the ids) makes the record true for every
SGLang version, whatever rule it applied. The record also carries the release and the
target family, so the join can say at once when this release will crash on the list
(``capture_unsupported``, from ``eagle3.conventions.SGLANG_CAPTURE``), before the first
forward or CUDA-graph capture does.
"""

from __future__ import annotations

from typing import Any

from ...records import Capture
from ...rules.conventions import engine_rule, sglang_family
from . import correlate, server, state


def _inner(model: Any) -> Any:
    """The CausalLM that owns ``layers_to_capture`` (Kimi-K2.5 wraps a DeepSeek)."""
    if not hasattr(getattr(model, "model", None), "layers_to_capture") and getattr(model, "language_model", None) is not None:
        return model.language_model
    return model


def capture_of(model: Any, layer_ids: Any) -> Capture | None:
    owner = _inner(model)
    pp_group = getattr(owner, "pp_group", None)
    if pp_group is not None and not getattr(pp_group, "is_last_rank", True):
        return None  # SGLang returns early on non-last pipeline ranks: nothing to say here
    config = getattr(owner, "config", None)
    num_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inner = getattr(owner, "model", None)
    indices = list(getattr(inner, "layers_to_capture", []) or [])
    enabled = bool(getattr(owner, "capture_aux_hidden_states", False))
    wanted = set(int(i) for i in indices)
    boundaries = [b for b in range(num_layers) if b in wanted]
    requested = [int(i) for i in layer_ids] if layer_ids is not None else [int(i) for i in indices]
    arch = type(owner).__name__
    version = server.sglang_version()
    # The family by the class's ancestry: a subclass of LlamaForCausalLM runs its LlamaModel.
    ancestry = [cls.__name__ for cls in type(owner).__mro__]
    family = sglang_family(ancestry)
    return Capture(
        module="target",
        requested_ids=requested,
        boundaries=boundaries,
        num_layers=num_layers,
        hidden_size=hidden,
        rule=engine_rule(ancestry, version),
        enabled=enabled,
        target_class=arch,
        layers_to_capture=indices,
        ids_given=layer_ids is not None,
        engine_version=version,
        target_family=family,
    )


def _layer_ids(args: tuple, kwargs: dict) -> Any:
    if "layer_ids" in kwargs:
        return kwargs["layer_ids"]
    return args[1] if len(args) > 1 else None


def after_set_capture(result: Any, *args: Any, **kwargs: Any) -> None:
    """HookRegistry AFTER signature: ``(result, self, layer_ids=None)``."""
    try:
        from .rank import ensure_rank

        ensure_rank()
        record = capture_of(args[0], _layer_ids(args, kwargs))
        if record is not None:
            correlate.note_capture(record)
    except Exception as exc:
        state.internal_error("set_eagle3_layers_to_capture", exc)
    return None


def around_wrapper_capture(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Kimi-K2.5 delegates to its language model: record only if that call did not."""
    before = state.STATE.captures_emitted
    result = original(*args, **kwargs)
    if state.STATE.captures_emitted == before:
        after_set_capture(result, *args, **kwargs)
    return result

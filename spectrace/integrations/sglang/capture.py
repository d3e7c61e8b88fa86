"""AFTER ``set_eagle3_layers_to_capture`` on a target: the capture list really in effect.

SGLang captures the residual stream entering layer ``i`` for every ``i`` in
``model.layers_to_capture`` (every target family of 0.5.17 and 0.5.23), walking layers in
order: so the boundaries are the sorted, de-duplicated indices inside ``[0, num_layers)``
(GPT-OSS also captures ``num_layers`` at its final norm). Reading the
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
    """The object that owns ``layers_to_capture``'s config: the CausalLM itself, or the language
    model a wrapper delegates to (Kimi-K2.5, Gemma-3 and Llama-4 multimodal, MindSpore)."""
    if hasattr(getattr(model, "model", None), "layers_to_capture"):
        return model
    inner = getattr(model, "language_model", None)
    if inner is not None and hasattr(getattr(inner, "model", None), "layers_to_capture"):
        return inner
    return model


def _layers_owner(owner: Any) -> Any:
    """The module holding ``layers_to_capture`` (``model.model``; Gemma-4 multimodal: ``language_model``)."""
    for name in ("model", "language_model"):
        inner = getattr(owner, name, None)
        if hasattr(inner, "layers_to_capture"):
            return inner
    return getattr(owner, "model", None)


def _text_config(owner: Any) -> Any:
    config = getattr(owner, "config", None)
    text = getattr(config, "text_config", None)  # multimodal wrappers keep the decoder's sizes there
    if getattr(config, "num_hidden_layers", None) is None and text is not None:
        return text
    return config


def capture_of(model: Any, layer_ids: Any) -> Capture | None:
    owner = _inner(model)
    pp_group = getattr(owner, "pp_group", None)
    if pp_group is not None and not getattr(pp_group, "is_last_rank", True):
        return None  # SGLang returns early on non-last pipeline ranks: nothing to say here
    config = _text_config(owner)
    num_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inner = _layers_owner(owner)
    indices = list(getattr(inner, "layers_to_capture", []) or [])
    enabled = bool(getattr(owner, "capture_aux_hidden_states", False) or getattr(model, "capture_aux_hidden_states", False))
    wanted = set(int(i) for i in indices)
    # The family by the class's ancestry (a subclass of LlamaForCausalLM runs its LlamaModel),
    # the wrapper's name first: MiniMax-M3-VL's rule is its own.
    ancestry = [cls.__name__ for cls in type(model).__mro__] + [cls.__name__ for cls in type(owner).__mro__]
    family = sglang_family(ancestry)
    # Read by value, whatever the rule: the loop captures index i at layer i's entry; GPT-OSS
    # also captures index num_layers at its final norm.
    top = num_layers + 1 if family == "gpt_oss" else num_layers
    boundaries = [b for b in range(top) if b in wanted]
    requested = [int(i) for i in layer_ids] if layer_ids is not None else [int(i) for i in indices]
    version = server.sglang_version()
    return Capture(
        module="target",
        requested_ids=requested,
        boundaries=boundaries,
        num_layers=num_layers,
        hidden_size=hidden,
        rule=engine_rule(ancestry, version),
        enabled=enabled,
        target_class=type(model).__name__,
        layers_to_capture=indices,
        ids_given=layer_ids is not None,
        engine_version=version,
        target_family=family,
        rule_known=family is not None,
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
    """A wrapper that delegates to its language model (Kimi-K2.5, Gemma-3 and Llama-4 multimodal,
    MindSpore), or a class that a patched class inherits from: record only if that call did not."""
    before = state.STATE.captures_emitted
    result = original(*args, **kwargs)
    if state.STATE.captures_emitted == before:
        after_set_capture(result, *args, **kwargs)
    return result

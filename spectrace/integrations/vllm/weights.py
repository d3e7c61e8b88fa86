"""AROUND an EAGLE-3 draft's ``load_weights``: every name offered, every parameter written.

vLLM's draft classes first gather the whole checkpoint into a dict and then hand it to
``AutoWeightsLoader``, so which checkpoint name a parameter loader is serving cannot be
told by *when* it runs (the core's ``observe_load`` attributes by time). Here a name is
consumed when its very tensor object reaches a parameter loader (vLLM renames keys but
passes the same tensors), and the core's ``observe_load`` still says which parameters
were written (loader calls, then a bit-pattern change test).

Normal absences are exempt: ``embed_tokens`` and ``lm_head`` (vLLM gives the draft the
target's when the checkpoint has none). ``t2d`` is skipped by design; ``d2t`` lands in
``draft_id_to_target_id``, which stays zeros when the checkpoint lacks it. After the load,
the training flags the draft's config sets are checked against the class vLLM built
(``Eagle3DeepseekV2ForCausalLM`` reads no ``norm_before_fc``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from ...checks.replaced import ReplacedWeight, check_replaced_weights
from ...checks.vllm import check_vllm_class_flags, check_vllm_weights
from ...checks.vocab_map import check_engine_hot_map
from ...hooks.weights import observe_load
from ..core.loads import ChangedParam, DraftLoad, watch_replacements
from . import state

_SKIPPED_BY_DESIGN = ("t2d",)


def exempt_params(model: Any) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    return [n for n in names if n.endswith("embed_tokens.weight") or n.startswith("lm_head.")]


def _slot(param: Any) -> str:
    # vLLM's BasevLLMParameter exposes weight_loader as a read-only property over _weight_loader.
    if "weight_loader" not in param.__dict__ and isinstance(getattr(type(param), "weight_loader", None), property):
        if "_weight_loader" in param.__dict__:
            return "_weight_loader"
    return "weight_loader"


class _Consumed:
    """Wraps every parameter loader to see which offered tensor objects reached one."""

    def __init__(self, model: Any) -> None:
        self.ids: set[int] = set()
        self._restore: list[tuple[Any, str, bool, Any]] = []
        for _, param in model.named_parameters():
            slot = _slot(param)
            had = slot in param.__dict__
            original = param.__dict__.get(slot)
            inner = original if had else getattr(param, slot, None)
            if inner is None:
                from vllm.model_executor.model_loader.weight_utils import default_weight_loader

                inner = default_weight_loader
            try:
                setattr(param, slot, self._tracking(inner))
            except (AttributeError, TypeError):
                continue
            self._restore.append((param, slot, had, original))

    def _tracking(self, inner: Any) -> Any:
        seen = self.ids

        @functools.wraps(inner)
        def loader(param: Any, loaded: Any = None, *args: Any, **kwargs: Any) -> Any:
            if loaded is not None:
                seen.add(id(loaded))
                base = getattr(loaded, "_base", None)
                if base is not None:
                    seen.add(id(base))
            return inner(param, loaded, *args, **kwargs)

        return loader

    def restore(self) -> None:
        for param, slot, had, original in self._restore:
            if had:
                setattr(param, slot, original)
            else:
                param.__dict__.pop(slot, None)


def around_draft_load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``(original, self, weights)``: the load runs unchanged; what it did is recorded."""
    call = DraftLoad(original, args, kwargs)
    model = call.model
    offered: list[tuple[str, Any]] = []  # keeps the tensors alive, so their ids stay unique
    consumed: _Consumed | None = None

    def feed(items: Iterable[Any]) -> Iterator[Any]:
        for name, tensor in items:
            offered.append((name, tensor))
            yield name, tensor

    def observe() -> tuple[Any, Any]:
        nonlocal consumed
        consumed = _Consumed(model)
        return observe_load(model, call.load, feed(call.weights), module="draft", exempt=exempt_params(model), source=_source(model))

    try:
        result, record = call.observed(observe, state.internal_error)
    finally:
        if consumed is not None:
            consumed.restore()
    if record is None:
        return result
    try:
        taken = consumed.ids if consumed is not None else set()
        ignored = [
            name
            for name, tensor in offered
            if id(tensor) not in taken and name.rsplit(".", 1)[-1] not in _SKIPPED_BY_DESIGN and not _consumed_otherwise(model, name)
        ]
        record = record.model_copy(update={"ignored": ignored, "draft_class": type(model).__name__})
        state.emit(record)
        for found in check_vllm_weights(record, type(model).__name__):
            state.emit_finding(found)
        _watch_replacements(model, record.written)
        _check_class_flags(model)
        _check_map(model, offered)
        from .rope import at_draft_load

        at_draft_load(model)
    except Exception as exc:
        state.internal_error("draft load_weights report", exc)
    return result


def _check_class_flags(model: Any) -> None:
    """unsupported_config_flag: a training flag the draft's config sets that the class vLLM
    really built does not read (the config was noted at the class's ``__init__``)."""
    config = state.STATE.draft_config
    if config:
        for found in check_vllm_class_flags(config, type(model).__name__, module="draft"):
            state.emit_finding(found)


def _check_map(model: Any, offered: list[tuple[str, Any]]) -> None:
    """vocab_map_invalid: the map vLLM proposes with (target id = i + draft_id_to_target_id[i],
    ``compute_logits``) against the vocabulary and what the checkpoint's d2t and t2d say.
    Load time, once: host reads of two small int tensors."""
    param = getattr(model, "draft_id_to_target_id", None)
    if param is None:
        return  # the full vocabulary: no map
    maps = {name.rsplit(".", 1)[-1]: tensor for name, tensor in offered if name.rsplit(".", 1)[-1] in ("d2t", "t2d")}
    if "d2t" not in maps:
        return  # weights_missing says the map stayed zeros
    cfg = getattr(model, "config", None)
    d2t, t2d = maps["d2t"], maps.get("t2d")
    ids = [i + int(d) for i, d in enumerate(param.detach().reshape(-1).cpu().tolist())]
    marks = [bool(x) for x in t2d.reshape(-1).tolist()] if t2d is not None and t2d.dim() == 1 else None
    if marks is not None and sum(marks) != len(ids):
        marks = None  # the checkpoint's own inconsistency: `spectrace audit` reports it from the files
    for found in check_engine_hot_map(
        ids,
        draft_vocab_size=getattr(cfg, "draft_vocab_size", None),
        target_vocab=getattr(cfg, "vocab_size", None),
        checkpoint_d2t=d2t.reshape(-1).tolist() if d2t.dim() == 1 else None,
        t2d=marks,
        module="draft.draft_id_to_target_id",
        source="vllm.weights",
        name="arange + draft_id_to_target_id",
    ):
        state.emit_finding(found)


def _consumed_otherwise(model: Any, name: str) -> bool:
    # mask_hidden is copied straight into a buffer when parallel drafting is on.
    return "mask_hidden" in name and bool(getattr(model, "use_parallel_drafting", False))


def _source(model: Any) -> str:
    from .draft import draft_path

    return draft_path(model) or ""


# ------------------------------------------------------------------ weights replaced after load
#
# vLLM 0.32's proposer shares the target's embedding and head only when the checkpoint has
# none or an identical one (``_maybe_share_embeddings`` / ``_maybe_share_lm_head`` in
# v1/spec_decode/llm_base_proposer.py); releases before the fix shared them regardless.
# What the checkpoint wrote is compared at the draft's first forward (vLLM's dummy run,
# before any graph is captured): a trained tensor swapped out since is named.

_SHARE_STEP = {
    "lm_head.": "the proposer's _maybe_share_lm_head (vllm/v1/spec_decode/llm_base_proposer.py)",
    "embed_tokens.": "the proposer's _maybe_share_embeddings (vllm/v1/spec_decode/llm_base_proposer.py)",
}


def _explain(change: ChangedParam) -> ReplacedWeight:
    step = next((where for part, where in _SHARE_STEP.items() if part in change.name), None)
    fix = (
        "serve with a vLLM whose proposer keeps a draft's own trained head and embedding (it shares them only when the "
        "checkpoint has none or identical ones), or report the sharing step to vLLM"
        if step
        else None
    )
    return ReplacedWeight(change.name, change.how, shared_with=change.shared_with, step=step, fix=fix)


def _watch_replacements(model: Any, written: list[str]) -> None:
    import weakref

    ref = weakref.ref(model)

    def report(changed: list[ChangedParam], moment: str) -> None:
        if ref() is None:
            return
        for found in check_replaced_weights([_explain(c) for c in changed], moment=moment, source="vllm.weights"):
            state.emit_finding(found)

    watch_replacements(
        model,
        model,
        written,
        moment=lambda compared: None if compared or _capturing() else "first forward",
        final=lambda moment: True,
        report=report,
        on_error=state.internal_error,
    )


def _capturing() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False

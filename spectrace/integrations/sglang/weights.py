"""AROUND the EAGLE-3 draft's ``load_weights``: every name offered, every parameter written.

SGLang drops names it cannot map without a word and never checks for parameters left
at init (the dropped-weights bug). The load runs unchanged through ``observe_load``, which
wraps each ``param.weight_loader`` (SGLang looks it up with ``getattr`` at call time).
Normal absences are exempt: ``embed_tokens`` (SGLang gives the draft the target's
embedding, ``set_embed``) and ``lm_head`` when the config has no ``draft_vocab_size``
(``load_lm_head_from_target``). ``d2t`` becomes ``hot_token_id`` and counts as
consumed; ``t2d`` is skipped by design.
"""

from __future__ import annotations

from typing import Any

from ...checks.weights import check_weights
from ...hooks.weights import observe_load
from ...records import Finding, Weights
from ..core.loads import DraftLoad
from . import correlate, server, state
from .graphs import capturing

# Kimi's MLA draft buffers q_a_proj and kv_a_proj_with_mqa and writes them fused once both
# arrived, so the first of each pair sees no loader call while it is current.
_FUSED_PARTS = {"q_a_proj": "fused_qkv_a_proj_with_mqa", "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa"}


def exempt_params(model: Any) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    exempt = [n for n in names if n.endswith("embed_tokens.weight")]
    if getattr(model, "load_lm_head_from_target", False):
        exempt += [n for n in names if n.startswith("lm_head.")]
    return exempt


def _adjust(record: Weights, model: Any) -> Weights:
    ignored = list(record.ignored)
    written = set(record.written)
    for name in list(ignored):
        for part, fused in _FUSED_PARTS.items():
            if f".{part}." in f".{name}" and any(fused in w for w in written):
                ignored.remove(name)
                break
    missing = list(record.missing)
    config = getattr(model, "config", None)
    draft_vocab = getattr(config, "draft_vocab_size", None)
    vocab = getattr(config, "vocab_size", None)
    if draft_vocab and vocab and draft_vocab < vocab and getattr(model, "hot_token_id", None) is None:
        missing.append("d2t")  # required to map the reduced vocabulary back (becomes hot_token_id)
    if getattr(model, "hot_token_id", None) is not None and any(n.rsplit(".", 1)[-1] == "d2t" for n in record.offered):
        written.add("hot_token_id")  # d2t is consumed as an attribute, not through a weight_loader
    return record.model_copy(update={"ignored": ignored, "missing": missing, "written": sorted(written)})


def _sglang_fix(found: Finding, record: Weights, model: Any) -> Finding:
    """A fix that names SGLang's own ways out when no rename explains the gap."""
    if found.evidence.get("rename_map"):
        return found
    names = found.evidence.get("missing") or found.evidence.get("dropped") or []
    fix = found.fix
    if found.code == "weights_missing":
        parts = []
        if any(n.startswith("lm_head.") for n in names):
            parts.append(
                "the checkpoint has no lm_head.weight but the config sets draft_vocab_size, so SGLang keeps its own "
                "random head (accept length ~1): add the trained lm_head.weight, or drop draft_vocab_size so SGLang "
                "takes the target's head (load_lm_head_from_target)"
            )
        if "d2t" in names:
            parts.append("add the trained d2t (draft->target id offsets) to the checkpoint; without it draft ids are read as target ids")
        if parts:
            fix = "; ".join(parts)
    elif found.code == "weights_dropped":
        fix = (
            "SGLang's LlamaForCausalLMEagle3.load_weights maps only midlayer->layers.0, aux_norm_*->fc_norm.i and an "
            "optional 'model.' prefix: rename these keys to its parameter names "
            + ", ".join(sorted(dict(model.named_parameters()))[:6])
            + " ... (a name map in the conversion script)"
        )
    if fix == found.fix:
        return found
    return found.model_copy(update={"fix": fix})


def around_draft_load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """HookRegistry AROUND signature: ``(original_fn, self, weights, ...)``."""
    call = DraftLoad(original, args, kwargs)
    if capturing():
        return call.plain()
    model = call.model
    result, record = call.observed(
        lambda: observe_load(model, call.load, call.weights, module="draft", exempt=exempt_params(model), source=_source()),
        state.internal_error,
    )
    if record is None:
        return result
    try:
        _report(model, record)
    except Exception as exc:
        state.internal_error("draft load_weights report", exc)
    return result


def _source() -> str:
    path = server.spec_args().get("speculative_draft_model_path")
    return str(path) if path else ""


def _report(model: Any, record: Weights) -> None:
    from .rank import ensure_rank

    ensure_rank()
    record = _adjust(record, model)
    record = record.model_copy(update={"draft_class": type(model).__name__})
    state.STATE.eagle3_draft = True
    state.emit(record)
    for found in check_weights(record):
        state.emit(_sglang_fix(found, record, model))
    # Server args first: the raw config.json keeps keys SGLang's parsed config may lose.
    correlate.learn_from_server()
    correlate.note_draft_config(server.config_to_dict(getattr(model, "config", None)), source=f"{type(model).__name__}.config")


def after_draft_init(result: Any, *args: Any, **kwargs: Any) -> None:
    """An EAGLE-3 draft exists in this process: the target's fallbacks now matter.

    HookRegistry AFTER signature: ``(result, self, config, quant_config=None, prefix="")``.
    The draft's config is known from here on, with or without server args (a script,
    test or notebook builds SGLang's classes directly): the capture check runs now if
    the target is configured already, else when it is. The server's raw config.json,
    when there is one, is still preferred over the parsed object.
    """
    state.STATE.eagle3_draft = True
    try:
        from .rank import ensure_rank

        ensure_rank()
        model = args[0] if args else None
        config = kwargs.get("config", args[1] if len(args) > 1 else getattr(model, "config", None))
        correlate.learn_from_server()
        correlate.note_draft_config(server.config_to_dict(config), source=f"{type(model).__name__}.config")
    except Exception as exc:
        state.internal_error("draft __init__ config", exc)
    return None

"""AROUND the EAGLE-3 draft's ``load_weights``: every name offered, every parameter written.

SGLang drops names it cannot map without a word and never checks for parameters left
at init (the dropped-weights bug). The load runs unchanged through ``observe_load``, which
wraps each ``param.weight_loader`` (SGLang looks it up with ``getattr`` at call time).
Normal absences are exempt: ``embed_tokens`` (SGLang gives the draft the target's
embedding, ``set_embed``) and ``lm_head`` when the config has no ``draft_vocab_size``
(``load_lm_head_from_target``), and ``fc`` for a last-state draft. ``d2t`` becomes ``hot_token_id`` and counts as
consumed; ``t2d`` is skipped by design.
"""

from __future__ import annotations

from typing import Any

from ...checks.replaced import ReplacedWeight, check_replaced_weights
from ...checks.vocab_map import check_engine_hot_map
from ...checks.weights import check_weights
from ...hooks.weights import observe_load
from ...records import Finding, Weights
from ..core.configs import config_to_dict
from ..core.loads import ChangedParam, DraftLoad, watch_replacements
from . import correlate, rope, server, state
from .graphs import capturing

# Kimi's MLA draft buffers q_a_proj and kv_a_proj_with_mqa and writes them fused once both
# arrived, so the first of each pair sees no loader call while it is current.
_FUSED_PARTS = {"q_a_proj": "fused_qkv_a_proj_with_mqa", "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa"}


def exempt_params(model: Any) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    exempt = [n for n in names if n.endswith("embed_tokens.weight")]
    if getattr(model, "load_lm_head_from_target", False):
        exempt += [n for n in names if n.startswith("lm_head.")]
    if _last_state(getattr(model, "config", None)):
        # A draft trained on the target's last state has no fc (nvidia's gpt-oss-120b Eagle3
        # v2): SGLang builds one, then never runs it, since the stored state is as wide as
        # the embedding. An fc left at init is then normal.
        exempt += [n for n in names if n.startswith("model.fc.") or n.startswith("fc.")]
    return exempt


def _last_state(config: Any) -> bool:
    """``use_aux_hidden_state`` false in the draft's config (nested in eagle_config or not)."""
    if config is None:
        return False
    nested = getattr(config, "eagle_config", None)
    for source in (nested, config):
        value = source.get("use_aux_hidden_state") if isinstance(source, dict) else getattr(source, "use_aux_hidden_state", None)
        if value is not None:
            return value is False
    return False


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
    maps: dict[str, Any] = {}
    call.weights = _keep_maps(call.weights, maps)
    result, record = call.observed(
        lambda: observe_load(model, call.load, call.weights, module="draft", exempt=exempt_params(model), source=_source()),
        state.internal_error,
    )
    if record is None:
        return result
    try:
        _report(model, record, maps)
    except Exception as exc:
        state.internal_error("draft load_weights report", exc)
    return result


def _source() -> str:
    path = server.spec_args().get("speculative_draft_model_path")
    return str(path) if path else ""


def _keep_maps(weights: Any, maps: dict[str, Any]) -> Any:
    """The offered tensors, unchanged, keeping ``d2t`` and ``t2d`` by the way: SGLang turns d2t
    into hot_token_id and skips t2d, and the check of its map needs what the checkpoint said."""
    for item in weights:
        try:
            name = item[0]
            tail = name.rsplit(".", 1)[-1] if isinstance(name, str) else ""
            if tail in ("d2t", "t2d"):
                maps[tail] = item[1]
        except Exception:
            pass  # not a (name, tensor) pair: the engine's load decides what it is
        yield item


def _report(model: Any, record: Weights, maps: dict[str, Any] | None = None) -> None:
    from .rank import ensure_rank

    ensure_rank()
    record = _adjust(record, model)
    record = record.model_copy(update={"draft_class": type(model).__name__})
    state.STATE.eagle3_draft = True
    state.emit(record)
    for found in check_weights(record):
        state.emit(_sglang_fix(found, record, model))
    _check_hot_map(model, maps or {})
    _watch_replacements(model, record)
    # Server args first: the raw config.json keeps keys SGLang's parsed config may lose.
    correlate.learn_from_server()
    correlate.note_draft_config(config_to_dict(getattr(model, "config", None)), source=f"{type(model).__name__}.config")
    try:
        rope.at_draft_load(model)  # after the configs: the finding names the key the base came from
    except Exception as exc:
        state.internal_error("draft rope", exc)


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
        correlate.note_draft_config(config_to_dict(config), source=f"{type(model).__name__}.config")
    except Exception as exc:
        state.internal_error("draft __init__ config", exc)
    return None


def _check_hot_map(model: Any, maps: dict[str, Any]) -> None:
    """The map SGLang built from d2t (``hot_token_id``: the target id of each draft id), against
    the vocabulary and what the checkpoint's d2t and t2d say."""
    hot = getattr(model, "hot_token_id", None)
    if hot is None:
        return
    cfg = getattr(model, "config", None)
    # Load time, once: these are host tensors here (hot_token_id moves to the device later).
    ids = hot.tolist()
    d2t, t2d = maps.get("d2t"), maps.get("t2d")
    marks = [bool(x) for x in t2d.reshape(-1).tolist()] if t2d is not None and t2d.dim() == 1 else None
    if marks is not None and sum(marks) != len(ids):
        # A t2d marking another number of ids than d2t has entries is the checkpoint's own
        # inconsistency, which `spectrace audit` reports from the files; here t2d only
        # serves to tell which ids the engine's map should hold.
        marks = None
    for found in check_engine_hot_map(
        ids,
        draft_vocab_size=getattr(cfg, "draft_vocab_size", None),
        target_vocab=getattr(cfg, "vocab_size", None),
        checkpoint_d2t=d2t.reshape(-1).tolist() if d2t is not None and d2t.dim() == 1 else None,
        t2d=marks,
        source=_source(),
    ):
        state.emit(found)


# ------------------------------------------------------------------ weights replaced after load
#
# What the checkpoint wrote is fingerprinted at the end of the load and compared once at
# the draft's first forward, and once more at the first forward under CUDA-graph capture
# when that comes later (a script's draft may run eagerly first): core/loads.py.

_SET_EMBED_AND_HEAD = "EAGLEWorkerV2.init_lm_head -> set_embed_and_head (sglang/srt/speculative/eagle_worker_v2.py)"
_SET_EMBED = "EAGLEWorkerV2.init_lm_head -> set_embed (sglang/srt/speculative/eagle_worker_v2.py)"


def _explain(model: Any, change: ChangedParam) -> ReplacedWeight:
    """Which SGLang step swaps this tensor, the config key that makes it, and the way out."""
    name = change.name
    cfg = getattr(model, "config", None)
    from_target = bool(getattr(model, "load_lm_head_from_target", False))
    step = trigger = fix = None
    if name.startswith("lm_head.") and from_target:
        rows = change.shape_then[0] if change.shape_then else None
        step = _SET_EMBED_AND_HEAD
        trigger = '"draft_vocab_size": null in the draft\'s config.json (SGLang then sets load_lm_head_from_target)'
        fix = (
            f'write "draft_vocab_size": {rows if rows else "<rows of the trained lm_head>"} in the draft\'s config.json, '
            "(with its d2t when that is below the target's vocabulary): SGLang takes the target's head only when "
            "draft_vocab_size is null"
        )
    elif name.endswith("embed_tokens.weight"):
        step = _SET_EMBED_AND_HEAD if from_target else _SET_EMBED
        trigger = (
            "the draft's hidden_size equals target_hidden_size "
            f"({getattr(cfg, 'hidden_size', '?')}): SGLang then gives the draft the target's embedding"
        )
        fix = (
            "train the draft with the target's embedding frozen (the trainers' default), so the shared one is the one "
            "it learned with; a draft with its own trained embedding cannot keep it on SGLang"
        )
    return ReplacedWeight(name, change.how, shared_with=change.shared_with, step=step, trigger=trigger, fix=fix)


def _target_storages(draft: Any) -> dict[int, str]:
    """Storage pointer -> parameter name of the other models SGLang built in this process (the target)."""
    out: dict[int, str] = {}
    try:
        from .adopted import _adopted

        for other in list(_adopted.keys()):
            if other is draft:
                continue
            for name, param in other.named_parameters():
                out.setdefault(int(param.data_ptr()), name)
    except Exception:
        pass  # no target known: the finding still names the draft's tensor
    return out


def _moment(compared: bool) -> str | None:
    """The comparison due now: the first forward, then the first under CUDA-graph capture
    (its warm-up runs eagerly; never while a stream captures, when no host read may run)."""
    in_capture = state.STATE.in_capture > 0
    if compared and not in_capture:
        return None  # the cheap test first: this runs on every draft forward until capture
    if capturing():
        return None
    return "CUDA-graph capture" if in_capture else "first forward"


def _say(model: Any) -> Any:
    def report(changed: list[ChangedParam], moment: str) -> None:
        replaced = [_explain(model, c) for c in changed]
        for found in check_replaced_weights(replaced, moment=moment, source="sglang.weights"):
            key = "weights_replaced_after_load:" + ",".join(sorted(r.name for r in replaced))
            state.emit_once(key, lambda found=found: found)

    return report


def _watch_replacements(model: Any, record: Weights) -> None:
    """Fingerprint what the checkpoint wrote; compare at the draft's first forward(s).
    SGLang calls the root's forward() directly, so the hook sits on its inner model."""
    import weakref

    inner = getattr(model, "model", None)
    module = inner if callable(getattr(inner, "register_forward_pre_hook", None)) else model
    ref = weakref.ref(model)
    watch_replacements(
        model,
        module,
        [n for n in record.written if n != "hot_token_id"],
        moment=_moment,
        final=lambda moment: moment == "CUDA-graph capture",
        report=lambda changed, moment: _say(ref())(changed, moment) if ref() is not None else None,
        others=_target_storages,
        on_error=state.internal_error,
    )


def check_replaced_now(model: Any, moment: str = "check") -> None:
    """Compare the draft's tensors with what its load wrote now (tests, notebooks)."""
    watch = model.__dict__.get("_spectrace_replacement_watch")
    if watch is not None:
        watch.compare(model, moment)

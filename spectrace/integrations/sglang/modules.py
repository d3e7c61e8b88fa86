"""Per-module records from SGLang's own model objects: target layers, aux concat, logits,
and the draft's fc, decoder layer, norm and logits.

Seams (docs/sglang-patch-points.md):

- a model is *adopted* when it is built (``__init__`` AFTER of the known target and draft
  classes) and again, for any other architecture, when ``ModelRunner.load_model`` returns.
  Both happen before any CUDA graph is captured. Its modules are hooked on its first
  outermost forward (the eager warm-up before capture, or a script's first call), when
  the capture list is known, so only the layers the draft reads are hooked by default;
- SGLang calls the root model's ``.forward()`` directly: the engine wraps the class's
  forward (hooks/stepwrap.py), each outermost call is a step, and :func:`context_of`
  reads its ``ForwardBatch`` (forward mode, token rows);
- ``LogitsProcessor._compute_lm_head`` AFTER gives the logits (a forward hook on
  ``lm_head`` never fires: the head is applied through its quant method);
- ``LogitsProcessor._get_hidden_states_to_store`` AFTER gives the fused draft input
  (the aux concat), recorded chunk by chunk;
- ``EagleDraftWorker.draft_forward`` AROUND numbers the draft forwards of one multi-step
  draft (``draft_step``).

What a record holds: a 0.5.17 Llama layer returns ``(mlp_out, residual)``; its record's
``output.residual_stream`` is their sum, the residual stream at that boundary. A 0.5.23
layer returns an owed-output handle whose residual update has not run yet; its record
holds the owed contribution (``output.owed_contribution``), not the residual stream (the
captured boundaries are in the aux concat's chunks).
"""

from __future__ import annotations

import threading
from typing import Any

from ...hooks import roles as R
from ...hooks.identity import ByIdentity
from ...hooks.values import forward_batch_of
from . import state
from .adopted import _adopted, _is_draft

_lock = threading.Lock()
_processors: ByIdentity[tuple[str, str]] = ByIdentity()  # LogitsProcessor -> (name, side)
_loop = threading.local()  # the multi-step draft in progress on this thread


def _tracer() -> Any:
    tracer = state.tracer()
    if getattr(tracer, "_sglang_ready", False):
        return tracer
    tracer.context_of = context_of
    tracer.views = view_of
    tracer._sglang_ready = True
    try:
        _live_checks(tracer)
    except Exception as exc:
        state.internal_error("live checks", exc)
    return tracer


def _live_checks(tracer: Any) -> None:
    """Provenance and feature skew from the live records (checks/live.py), on the worker thread."""
    import os

    from ...checks.live import LiveChecks, fingerprint_from_env

    rec = state.recorder()
    fingerprint, problem = fingerprint_from_env(os.environ)
    if problem:
        rec.coverage("not_covered", problem)
    live = LiveChecks(rec.once, fingerprint, on_error=lambda message: rec.internal_error(f"live checks: {message}"))

    def observe(fields: dict[str, Any]) -> None:
        capture = state.STATE.capture
        if capture is not None and live.expected != list(capture.boundaries):
            live.set_expected_boundaries(capture.boundaries)
        live.observe(fields)

    tracer.observers.append(observe)
    rec.add_drain(live.finish)


def adopt(model: Any, side: str | None = None) -> None:
    """Trace ``model`` (target or draft) from its first outermost forward on; idempotent."""
    try:
        with _lock:
            if model in _adopted:
                return
            side = side or ("draft" if _is_draft(model) else "target")
            taken = set(_adopted.values())
            prefix, n = side, 1
            while prefix in taken:
                n += 1
                prefix = f"{side}#{n}"
            _adopted[model] = prefix
        tracer = _tracer()
        tracer.adopt(model, prefix, modules=_selector(model, side))
        _remember_processors(model, prefix, side)
        if side == "target":
            from . import rope

            rope.at_target_built(model)  # a draft loaded first (a script) is compared now
    except Exception as exc:
        state.internal_error("adopt model", exc)


def _remember_processors(model: Any, prefix: str, side: str) -> None:
    for name, module in model.named_modules():
        if type(module).__name__ == "LogitsProcessor":
            _processors[module] = (f"{prefix}.{name}", side)


# ------------------------------------------------------------------ which modules
def _captured_boundaries(model: Any) -> list[int] | None:
    capture = state.STATE.capture
    if capture is not None and capture.boundaries:
        return list(capture.boundaries)
    for module in model.modules():
        ids = getattr(module, "layers_to_capture", None)
        if isinstance(ids, (list, tuple)) and ids:
            return [int(i) for i in ids]
    return None


def _selector(model: Any, side: str) -> Any:
    """A module filter decided at attach time (the capture list is known by then)."""
    from ... import runtime

    settings = runtime.settings()
    if settings.modules or settings.profile:
        return list(settings.modules) or None  # the user's globs (or profile) win

    def wanted(name: str, module: Any) -> bool:
        role = R.role_of(model, name, module, hint=side)
        if role is None:
            return False
        if side == "draft":
            return role in (R.DRAFT_FC, R.DRAFT_LAYER, R.DRAFT_NORM)
        if role in (R.TARGET_NORM,):
            return True
        boundaries = _wanted_boundaries(model)
        if role == R.TARGET_EMBED:
            return boundaries is None or 0 in boundaries
        if role.startswith("target.layer["):
            index = int(role[len("target.layer[") : -1])
            return boundaries is None or index + 1 in boundaries
        return False

    return wanted


def _wanted_boundaries(model: Any) -> set[int] | None:
    """Boundaries to record: the captured ones and the last layer's output (None: all)."""
    from ... import runtime

    if runtime.settings().sglang_layers == "all":
        return None
    found = _captured_boundaries(model) or []
    layers = _num_layers(model)
    return set(found) | ({layers} if layers else set())


def _num_layers(model: Any) -> int | None:
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    value = getattr(text, "num_hidden_layers", None)
    return int(value) if isinstance(value, int) else None


# ------------------------------------------------------------------ what a step is
def context_of(root: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, int | None, int | None] | None:
    """(forward mode, token rows, draft-step index) of a root forward: host metadata only."""
    batch = forward_batch_of(args, kwargs)
    if batch is None:
        return None
    mode = getattr(getattr(batch, "forward_mode", None), "name", None)
    ids = args[0] if args and hasattr(args[0], "shape") else kwargs.get("input_ids")
    tokens = int(ids.shape[0]) if ids is not None and getattr(ids, "dim", lambda: 0)() >= 1 else None
    draft_step = None
    loop = getattr(_loop, "count", None)
    if loop is not None and _is_draft(root):
        draft_step = loop
        _loop.count = loop + 1
    return mode, tokens, draft_step


def around_draft_forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``EagleDraftWorker.draft_forward``: number its draft forwards 0, 1, 2, ..."""
    outer = getattr(_loop, "count", None)
    _loop.count = 0
    try:
        return original(*args, **kwargs)
    finally:
        _loop.count = outer


# ------------------------------------------------------------------ what a record holds
def view_of(name: str, module: Any) -> Any:
    """How a hooked SGLang module is read: top-level input tensors only (its
    ``ForwardBatch`` is not walked on every call), and a decoder layer's residual stream."""
    from ...hooks.engine import ModuleView

    layer = type(module).__name__.endswith("DecoderLayer")
    return ModuleView(inputs=top_level_inputs, outputs=layer_output if layer else None)


def top_level_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    import torch

    found = [(f"input[{i}]", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    found += [(f"kwarg.{k}", v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return found


def layer_output(output: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any, Any, Any]] | None:
    """The residual stream after a decoder layer: 0.5.17 returns ``(mlp_out, residual)``
    (their sum); 0.5.23 returns the layer's contribution and keeps the residual it has not
    added yet in ``forward_batch.residual_stream`` (their sum again)."""
    import torch

    if isinstance(output, (tuple, list)) and len(output) >= 2:
        hidden, residual = output[0], output[1]
        if isinstance(hidden, torch.Tensor) and isinstance(residual, torch.Tensor) and hidden.shape == residual.shape:
            return [("output.residual_stream", hidden, residual, None)]
        if residual is not None:
            return None
        output = hidden  # (contribution, None): the residual lives in the batch's stream (0.5.23 DeepSeek)
    value = output if isinstance(output, torch.Tensor) else getattr(getattr(output, "contribution", None), "value", None)
    if not isinstance(value, torch.Tensor):
        return None
    stream = getattr(forward_batch_of(args, kwargs), "residual_stream", None)
    residual = getattr(stream, "residual", None)
    pending = getattr(stream, "pending", None)
    if pending is not None and getattr(pending, "owed", None) is not None:
        # Tensor parallelism: the contribution still owes its all-reduce (done at the next
        # boundary). This rank holds a partial sum, not the residual stream: say so, so no
        # check compares it with the captured (reduced) states.
        return [("output.unreduced_partial", value, None, None)]
    if pending is not None and isinstance(residual, torch.Tensor) and residual.shape == value.shape:
        return [("output.residual_stream", value, residual, None)]
    return [("output.contribution", value, None, None)]  # the residual was already added in place


def after_compute_lm_head(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``LogitsProcessor._compute_lm_head(self, hidden_states, lm_head, ...)``: the logits."""
    try:
        owner = _processors.get(args[0]) if args else None
        if owner is None or not hasattr(result, "shape"):
            return None
        name, side = owner
        role = R.DRAFT_LM_HEAD if side == "draft" else R.TARGET_LM_HEAD
        head = args[2] if len(args) > 2 else kwargs.get("lm_head")
        full = getattr(head, "num_embeddings", None)
        # Tensor parallelism: a vocab-parallel head gives each rank its slice of the vocabulary.
        arg = "output.logits_shard" if isinstance(full, int) and int(result.shape[-1]) < full else "output.logits"
        _tracer().observe(name, "LogitsProcessor", role, [(arg, result, None, None)], root=name.split(".")[0])
    except Exception as exc:
        state.internal_error("logits", exc)
    return None


def after_hidden_to_store(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``LogitsProcessor._get_hidden_states_to_store``: the fused draft input, by chunk."""
    try:
        owner = _processors.get(args[0]) if args else None
        if owner is None or owner[1] != "target" or not hasattr(result, "shape") or result.dim() != 2:
            return None
        aux = kwargs.get("aux_hidden_states", args[3] if len(args) > 3 else None)
        if aux is None:
            return None
        count = len(aux) if isinstance(aux, (list, tuple)) else _chunk_count(result)
        width = int(result.shape[-1])
        if not count or width % count:
            return None
        step = width // count
        tracer = _tracer()
        items: list[tuple[str, Any, Any, Any]] = [(f"output.chunk[{i}]", result, None, (i * step, (i + 1) * step)) for i in range(count)]
        embedding = _embedding_chunk(count)
        if embedding is not None and isinstance(aux, (list, tuple)) and hasattr(aux[embedding], "shape"):
            # The chunk that is the embedding output (a draft trained on boundary 0) is a
            # function of one token id per row: recorded as that tensor, without statistics.
            tracer.remember_token_tensor(aux[embedding])
            items[embedding] = (f"output.chunk[{embedding}]", aux[embedding], None, None)
        name = owner[0].rsplit(".", 1)[0] + ".aux_concat" if "." in owner[0] else "aux_concat"
        if tracer.values is not None:  # SPECTRACE_CAPTURE_VALUES: its rows and the batch's input_ids
            tracer.values.offer(result, tracer._thread().step, name)
        tracer.observe(name, "AuxConcat", R.TARGET_AUX_CONCAT, items, root=owner[0].split(".")[0])
    except Exception as exc:
        state.internal_error("aux concat", exc)
    return None


def _embedding_chunk(count: int) -> int | None:
    """Which chunk of the aux concat is the embedding output (boundary 0), if captured."""
    capture = state.STATE.capture
    boundaries = list(capture.boundaries) if capture is not None and capture.boundaries else []
    if len(boundaries) != count or 0 not in boundaries:
        return None
    return sorted(boundaries).index(0)


def _chunk_count(fused: Any) -> int | None:
    capture = state.STATE.capture
    if capture is not None and capture.boundaries:
        return len(capture.boundaries)
    hidden = capture.hidden_size if capture is not None else None
    return int(fused.shape[-1]) // hidden if hidden else None


# ------------------------------------------------------------------ the seams
def after_model_init(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER a model class's ``__init__``: adopt it (scripts build these without a server)."""
    if args:
        adopt(args[0])
    return None


def after_load_model(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunner.load_model``: adopt whatever model the runner built."""
    try:
        runner = args[0]
        server_args = getattr(runner, "server_args", None)
        for flag in ("enable_two_batch_overlap", "enable_single_batch_overlap"):
            if getattr(server_args, flag, False):
                state.recorder().coverage(
                    "not_covered",
                    f"--{flag.replace('_', '-')}: the overlapped micro-batches run outside the traced forwards; "
                    "their per-module records are missing or mixed",
                )
        model = getattr(runner, "model", None)
        if model is not None:
            draft = bool(getattr(runner, "is_draft_worker", False))
            adopt(model, "draft" if draft else None)
            from . import draft_class

            if draft:
                config = getattr(runner, "model_config", None)
                draft_class.at_draft_model(model, getattr(config, "model_path", None))
            else:
                draft_class.at_target_model(model)
    except Exception as exc:
        state.internal_error("load_model", exc)
    return None

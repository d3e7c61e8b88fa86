"""Keep a served draft's inputs and its module boundaries for ``spectrace replay``.

Opt-in, off by default (``SPECTRACE_REPLAY=1``, or :func:`keep_replay` in code): these are
tensor values of the user's run. For the first :data:`MAX_FORWARDS` draft forwards whose
rows start a sequence at position 0, the first :data:`DEFAULT_ROWS` rows of the first
sequence are kept: the ids, positions, fused input, fc's input and output, the embeddings,
the decoder layer's input and output (plus residual), the final norm's output, the top-k
of the logits over the served ``lm_head`` and the target ids the served map gives them.
Only rows from position 0 are kept because the reference recomputes attention over them:
later draft steps attend over a KV cache that is not kept.

Which forwards: eager ones. Under CUDA-graph replay no Python hook runs, so graph-replayed
decode steps yield nothing, and a forward whose fc, layer and norm ran in a graph (SGLang
0.5.17 graphs prefills by default) kept only its inputs: it is counted, said once, and
not kept. Serve with ``--disable-prefill-cuda-graph`` and the draft extend that follows
each prefill runs eagerly. A forward inside a graph capture or ``torch.compile`` is skipped.

Cost: one attribute test per draft module call until the forwards are taken. At a kept
forward, clones of a few rows on the device and one small matmul for the top-k (queued,
never waited for); the copies reach the host when the file is written, off the forward
(the recorder's flush thread, or :meth:`ReplayCapture.write`). Bounded by
:data:`MAX_FORWARDS`, rows and :data:`MAX_BYTES`.

    >>> capture = keep_replay(draft)          # hooks on draft.model.fc, its layer, its norm
    >>> ...                                   # run the draft
    >>> capture.write("traces", "trace-x.jsonl")
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch
from torch import nn

from ..replay.file import MAX_BYTES, MAX_FORWARDS, MAX_ROWS, TOPK
from .graph_branch import capturing as _capturing

DEFAULT_ROWS = 8
# The target's own rows kept beside a draft forward (``spectrace probe``): its input ids and
# its top-1 next token, one row more than the draft's (the draft's row t proposes the token
# the target chose at row t + 1).
TARGET_KEYS = ("target_in", "target_next")
ENV = "SPECTRACE_REPLAY"
ENV_ROWS = "SPECTRACE_REPLAY_ROWS"


def replay_enabled(env: Any = None) -> bool:
    """Whether ``SPECTRACE_REPLAY`` asks for replay inputs (1, true, yes, on)."""
    env = os.environ if env is None else env
    return str(env.get(ENV, "")).strip().lower() in ("1", "true", "yes", "on")


def _rows_setting(env: Any = None) -> int:
    # The settings' one parser: ASCII digits, 1 to MAX_ROWS, a bad value named once with the default.
    from ..settings import parse_number

    env = os.environ if env is None else env
    return int(parse_number(env, ENV_ROWS, DEFAULT_ROWS, 1, MAX_ROWS))


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, (tuple, list)) and output else output


def draft_parts(draft: nn.Module) -> tuple[nn.Module, nn.Module | None, nn.Module, nn.Module, Any] | None:
    """(inner model, fc, first decoder layer, final norm, head) of an EAGLE-3 draft, by SGLang's names."""
    inner = getattr(draft, "model", None)
    if inner is None:
        return None
    layers = getattr(inner, "layers", None)
    layer = layers[0] if layers is not None and len(layers) else getattr(inner, "midlayer", None)
    norm = getattr(inner, "norm", None)
    if layer is None or norm is None:
        return None
    return inner, getattr(inner, "fc", None), layer, norm, getattr(draft, "lm_head", None)


def _hidden_and_positions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(hidden states, positions) of a draft forward called without SGLang's batch: by name,
    else by kind (the hidden states are the floating tensor, the positions the integer one)."""
    hidden, positions = kwargs.get("hidden_states"), kwargs.get("positions")
    for value in args[1:3]:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and hidden is None:
                hidden = value
            elif not value.is_floating_point() and positions is None:
                positions = value
    return hidden, positions


class ReplayCapture:
    """Hooks on one draft that keep its replay inputs (see the module's doc). Never raises into the model."""

    def __init__(self, draft: nn.Module, rows: int = DEFAULT_ROWS, max_forwards: int = MAX_FORWARDS, recorder: Any = None) -> None:
        parts = draft_parts(draft)
        if parts is None:
            raise ValueError(f"{type(draft).__name__} has no model.fc / model.layers[0] / model.norm: not an EAGLE-3 draft")
        self.draft = draft
        self.inner, self.fc, self.layer, self.norm, self.head = parts
        # The reader refuses a file past these limits: the writer never makes one.
        self.rows, self.max_forwards, self.recorder = max(1, min(rows, MAX_ROWS)), max(1, min(max_forwards, MAX_FORWARDS)), recorder
        self.kept: list[dict[str, Any]] = []  # per forward: "meta" and "tensors"
        self.bytes = 0
        self.calls = 0
        self._cur: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._full = False
        self._written = False
        self.target_rotary: dict[str, Any] | None = None  # the target's rotary (TargetTap), for spectrace probe
        self.too_large: list[int] = []  # bytes of each forward not kept for the MAX_BYTES cap (counted, said)
        self.inputs_only = 0  # forwards whose fc, layer and norm ran in a CUDA graph: not kept
        self._pending_fc: tuple[torch.Tensor, torch.Tensor] | None = None  # vLLM's fc, run before the forward
        self._handles: list[Any] = []
        hook = self._handles.append
        # vLLM's inner model is compiled-or-called through its own __call__ (support_torch_compile),
        # which runs forward() without the module's hooks: the forward is then the draft's own.
        outer = draft if type(self.inner).__call__ is not nn.Module.__call__ else self.inner
        hook(outer.register_forward_pre_hook(self._begin, with_kwargs=True))
        hook(outer.register_forward_hook(self._end, with_kwargs=True))
        if self.fc is not None:
            hook(self.fc.register_forward_hook(self._fc, with_kwargs=True))
        hook(self.layer.register_forward_pre_hook(self._layer_in, with_kwargs=True))
        hook(self.layer.register_forward_hook(self._layer_out, with_kwargs=True))
        hook(self.norm.register_forward_hook(self._norm_out, with_kwargs=True))
        if recorder is not None:
            recorder.add_drain(self.drain)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------ hooks
    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a hook never raises into the model
            self._cur = None
            if self.recorder is not None:
                self.recorder.internal_error(f"replay: {type(exc).__name__}: {exc}")

    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        if self._full or _capturing() or torch.compiler.is_compiling():
            return
        self._guard(self._start, args, kwargs)

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._cur = None
        ids = _arg(args, kwargs, 0, "input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() == 0:
            return
        n, mode, hidden = min(self.rows, int(ids.shape[0])), None, None
        batch = kwargs.get("forward_batch", args[2] if len(args) > 2 and hasattr(args[2], "forward_mode") else None)
        if batch is not None:  # SGLang: host metadata says whether the first request starts at 0
            mode = getattr(getattr(batch, "forward_mode", None), "name", None)
            prefix, lens = getattr(batch, "extend_prefix_lens_cpu", None), getattr(batch, "extend_seq_lens_cpu", None)
            if not mode or "EXTEND" not in mode or not prefix or not lens or int(prefix[0]) != 0:
                return
            n = min(n, int(lens[0]))
            hidden = getattr(getattr(batch, "spec_info", None), "hidden_states", None)
        else:  # a plain draft: (input_ids, hidden_states, positions), or vLLM's (input_ids, positions, hidden_states)
            hidden, positions = _hidden_and_positions(args, kwargs)
            if (
                isinstance(positions, torch.Tensor)
                and positions.device.type == "cpu"
                and positions.numel()
                and int(positions.reshape(-1)[0]) != 0
            ):
                return
        tensors: dict[str, torch.Tensor] = {"input_ids": ids[:n].detach().clone().long()}
        target = TARGET_ROWS.take()  # the target's forward just before this one (paired by ids in spectrace probe)
        if target is not None:
            tensors.update(target)
            self.target_rotary = TARGET_ROWS.rotary
        pending, self._pending_fc = self._pending_fc, None
        if pending is not None and isinstance(hidden, torch.Tensor) and pending[1].shape == hidden.shape:
            # vLLM: fc ran just before this forward (combine_hidden_states, after the input
            # norms), so what the model reads is fc's output. fc's own input is kept; the raw
            # fused input is not (the input norms already ran on it).
            tensors["fc_in"], tensors["fc_out"] = pending[0][:n].detach().clone(), pending[1][:n].detach().clone()
        elif isinstance(hidden, torch.Tensor) and hidden.dim() == 2 and hidden.shape[0] >= n:
            tensors["hidden_in"] = hidden[:n].detach().clone()
        self._cur = {"n": n, "mode": mode, "tensors": tensors}

    def _put(self, key: str, value: Any) -> None:
        cur = self._cur
        if cur is not None and isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] >= cur["n"]:
            cur["tensors"][key] = value[: cur["n"]].detach().clone()

    def _fc(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._cur is None:
            if self._full:  # once the forwards are kept, every later call returns here
                return
            # vLLM applies fc outside the model's forward (combine_hidden_states): keep a
            # reference (no copy) until the forward that follows; dropped at its end.
            inp, out = _arg(args, kwargs, 0, "input"), _first(output)
            if isinstance(inp, torch.Tensor) and isinstance(out, torch.Tensor) and inp.dim() == out.dim() == 2:
                self._pending_fc = (inp, out)
            return

        def take() -> None:
            self._put("fc_in", _arg(args, kwargs, 0, "input"))
            self._put("fc_out", _first(output))

        self._guard(take)

    def _layer_in(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._cur is None:
            return

        def take() -> None:
            self._put("positions", _arg(args, kwargs, 0, "positions"))
            self._put("embeds", _arg(args, kwargs, 1, "embeds"))
            self._put("layer_in", _arg(args, kwargs, 2, "hidden_states"))

        self._guard(take)

    def _layer_out(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._cur is None:
            return
        # SGLang's and the reference's layer return (mlp out, residual): the final norm reads their sum.
        if isinstance(output, (tuple, list)) and len(output) >= 2 and isinstance(output[1], torch.Tensor):
            self._guard(lambda: self._put("layer_out", output[0][: self._cur["n"]] + output[1][: self._cur["n"]]))  # type: ignore[index]
        else:
            self._guard(self._put, "layer_out", _first(output))

    def _norm_out(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._cur is not None:
            self._guard(self._head, _first(output))

    def _head(self, normed: Any) -> None:
        self._put("norm_out", normed)
        cur = self._cur
        weight = getattr(self.head, "weight", None)
        if cur is None or "norm_out" not in cur["tensors"] or not isinstance(weight, torch.Tensor):
            return
        with torch.no_grad():
            # The served head's weight, as the logits processor multiplies it (a few rows, queued).
            logits = cur["tensors"]["norm_out"].float() @ weight.detach().float().t()
            values, ids = logits.topk(min(TOPK, int(logits.shape[-1])), dim=-1)
        cur["tensors"]["topk_values"], cur["tensors"]["topk_ids"] = values, ids
        hot = getattr(self.draft, "hot_token_id", None)  # SGLang: draft id -> target id
        offsets = getattr(self.draft, "draft_id_to_target_id", None)  # vLLM: draft id -> offset (d2t)
        if isinstance(hot, torch.Tensor) and hot.dim() == 1:
            cur["tensors"]["target_ids"] = hot.to(ids.device)[ids]
        elif isinstance(offsets, torch.Tensor) and offsets.dim() == 1:
            cur["tensors"]["target_ids"] = ids + offsets.detach().to(ids.device).long()[ids]
        elif hot is None and offsets is None:
            cur["tensors"]["target_ids"] = ids.clone()  # no map: draft ids are target ids

    def _end(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        cur, self._cur, self._pending_fc = self._cur, None, None
        if cur is None or self._full:
            return
        if "layer_out" not in cur["tensors"] and "norm_out" not in cur["tensors"]:
            # The draft's body ran inside a CUDA graph (SGLang 0.5.17 graphs prefills by
            # default) or a compiled graph (vLLM without --enforce-eager): only its inputs
            # were seen, nothing to localise a divergence with. Not kept, so it does not
            # take the place of a forward that would be complete.
            self.inputs_only += 1
            if self.inputs_only == 1 and self.recorder is not None:
                self._guard(self.recorder.coverage, "not_covered", self._graphed_advice())
            return
        size = sum(t.numel() * t.element_size() for t in cur["tensors"].values())
        with self._lock:
            if self._full:
                return
            if self.bytes + size > MAX_BYTES:
                # Not kept, and nothing after it (each later forward would copy as much):
                # counted in the file's metadata and said once in the trace.
                self._full = True
                self.too_large.append(size)
        if self.too_large:
            if self.recorder is not None:
                self._guard(self.recorder.coverage, "not_covered", self._too_large_advice(size))
                self.recorder.drain_soon()
            return
        with self._lock:
            self.bytes += size
            self.kept.append({"n": cur["n"], "mode": cur["mode"], "call": self.calls - 1, "bytes": size, "tensors": cur["tensors"]})
            self._full = len(self.kept) >= self.max_forwards
        if self._full and self.recorder is not None:
            self.recorder.drain_soon()

    def _too_large_advice(self, size: int) -> str:
        mib = lambda n: f"{n / (1 << 20):.1f} MiB"  # noqa: E731
        return (
            f"SPECTRACE_REPLAY: a draft forward of {mib(size)} was not kept ({mib(self.bytes)} kept already, "
            f"{len(self.kept)} forward(s); the cap is {mib(MAX_BYTES)} per process), nor any forward after it: "
            f"keep fewer rows (SPECTRACE_REPLAY_ROWS, now {self.rows})"
        )

    def _graphed_advice(self) -> str:
        what = (
            "SPECTRACE_REPLAY: a draft forward's fc, decoder layer and norm ran inside a CUDA or compiled graph "
            "(no Python hook runs there): only eager forwards are kept; "
        )
        if type(self.draft).__module__.startswith("vllm."):
            return what + "on vLLM serve with --enforce-eager while you collect a replay"
        return what + "on SGLang serve with --disable-prefill-cuda-graph so the draft extend after each prefill runs eagerly"

    # ------------------------------------------------------------ off the forward
    def drain(self) -> None:
        """The recorder's drain: write the file once the forwards are kept (at close: what was kept)."""
        if self._written or not (self.kept or self.too_large) or (not self._full and not getattr(self.recorder, "closing", False)):
            return
        path = self.recorder.open_file()
        if path is None:
            self._written = True
            self.recorder.coverage("not_covered", "SPECTRACE_REPLAY: the trace has no folder (set SPECTRACE_DIR): no replay file")
            return
        directory, name = os.path.split(path)
        self.write(directory, name)

    def write(self, directory: str, trace_name: str) -> str | None:
        """Write the replay file beside ``trace_name`` in ``directory`` (once, the folder created
        if it does not exist yet, private as the file); returns its name."""
        from ..replay.file import ReplayData, ReplayForward, ReplayMeta, encode, replay_name
        from ..values_file import write_private

        with self._lock:
            if self._written or not (self.kept or self.too_large):
                return None
            self._written = True
            kept = list(self.kept)
        forwards: list[ReplayData] = []
        for slot in kept:
            # Off the forward: the copies were queued on the device, .cpu() waits for them here.
            tensors = {k: v.cpu() for k, v in slot["tensors"].items()}
            rows = slot["n"]
            pos = tensors.get("positions")
            if pos is not None:  # only the leading rows at positions 0, 1, 2, ... (a device tensor was not checked)
                good = (pos.reshape(-1)[:rows].long() == torch.arange(min(rows, pos.numel()))).int().cumprod(0)
                rows = int(good.sum())
            if rows <= 0:
                continue
            tensors = {k: v[: rows + 1] if k in TARGET_KEYS else v[:rows] for k, v in tensors.items()}
            meta = ReplayForward(step=-1, draft_call=slot["call"], rows=rows, forward_mode=slot["mode"], keys=sorted(tensors))
            forwards.append(ReplayData(meta, tensors))
        if not forwards and not self.too_large:
            return None
        os.makedirs(directory or ".", mode=0o700, exist_ok=True)  # capture.write("traces", ...) before any trace made it
        # The served dtype: of the first floating tensor kept (the fused input at least).
        ref = next((t for f in forwards for t in f.tensors.values() if t.is_floating_point()), None)
        meta_all = ReplayMeta(
            trace=trace_name,
            engine=f"{type(self.draft).__module__}.{type(self.draft).__name__}",
            dtype=str(ref.dtype).replace("torch.", "") if ref is not None else "",
            rows=self.rows,
            topk=TOPK,
            bytes_per_forward=[s["bytes"] for s in kept],
            target_rotary=self.target_rotary,
            forwards=[f.meta for f in forwards],
            too_large=list(self.too_large),
        )
        return write_private(directory, replay_name(trace_name), encode(meta_all, forwards))


class _LatestTargetRows:
    """The target rows of the process's latest eligible target forward, until a draft forward takes them."""

    def __init__(self) -> None:
        self._rows: dict[str, torch.Tensor] | None = None
        self.rotary: dict[str, Any] | None = None  # the target's rotary, as its tap read it

    def put(self, rows: dict[str, torch.Tensor], rotary: dict[str, Any] | None) -> None:
        self._rows, self.rotary = rows, rotary

    def take(self) -> dict[str, torch.Tensor] | None:
        rows, self._rows = self._rows, None
        return rows


TARGET_ROWS = _LatestTargetRows()


def target_parts(target: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module] | None:
    """(the module whose forward reads the ids, its final norm, its head) of a causal LM:
    SGLang's and vLLM's ``LlamaForCausalLM`` (``model.norm``, ``lm_head``), Hugging Face's,
    or a wrapper holding one as ``.model`` (spectrace's reference target)."""
    for outer in (target, getattr(target, "model", None)):
        inner = getattr(outer, "model", None)
        norm, head = getattr(inner, "norm", None), getattr(outer, "lm_head", None)
        if isinstance(norm, nn.Module) and isinstance(getattr(head, "weight", None), torch.Tensor) and not _is_draft(target):
            return target, norm, head  # type: ignore[return-value]
    return None


def target_rotary(target: nn.Module) -> dict[str, Any] | None:
    """The rotary the target really rotates with: an engine's rotary module (SGLang's and
    vLLM's ``base``, ``is_neox_style``, its class for the scaling), else a Hugging Face
    config's base (its rotary is the half-split, neox style). Read once, at the tap's start."""
    for module in target.modules():
        if all(hasattr(module, a) for a in ("base", "rotary_dim", "is_neox_style")):
            try:
                base: Any = module.base
                return {"base": float(base), "neox": bool(module.is_neox_style), "cls": type(module).__name__}
            except (TypeError, ValueError):
                continue
    config = getattr(getattr(target, "model", target), "config", None) or getattr(target, "config", None)
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else None
    base = base or getattr(config, "rope_theta", None)
    if isinstance(base, (int, float)):
        kind = params.get("rope_type", "default") if isinstance(params, dict) else "default"
        return {"base": float(base), "neox": True, "cls": f"config:{kind}"}
    return None


def _is_draft(model: nn.Module) -> bool:
    """An EAGLE-3 draft (an fc over the fused input, or a map of its vocabulary), not a target."""
    inner = getattr(model, "model", None)
    return any(getattr(x, a, None) is not None for x in (model, inner) for a in ("fc", "hot_token_id", "draft_id_to_target_id", "d2t"))


class TargetTap:
    """Keeps the target's own next-token choice (top-1 of its head over its final norm's rows)
    at the forwards from position 0, for the draft forward that follows (``spectrace probe``).

    Same rules as the draft's capture: eager forwards only (no Python hook runs in a graph),
    the first ``rows`` + 1 rows of the first sequence, a clone and one small matmul queued on
    the device, never waited for; nothing once the draft's capture is full. A head split
    over tensor-parallel ranks (fewer rows than the vocabulary) is not read: its top-1
    would be a shard's."""

    def __init__(self, target: nn.Module, rows: int = DEFAULT_ROWS, recorder: Any = None, capture: ReplayCapture | None = None) -> None:
        parts = target_parts(target)
        if parts is None:
            raise ValueError(f"{type(target).__name__} has no model.norm / lm_head: not a causal LM")
        self.root, self.norm = parts[0], parts[1]
        self.head: Any = parts[2]
        self.rows, self.recorder, self.capture = rows, recorder, capture
        self._n: int | None = None
        self._ids: torch.Tensor | None = None
        self.puts = 0  # bounded even where no draft capture is linked: a few per kept draft forward
        self.rotary = target_rotary(target)
        vocab = getattr(getattr(target, "config", None), "vocab_size", None)
        head_weight: Any = self.head.weight
        head_rows = int(head_weight.shape[0])
        self.split = isinstance(vocab, int) and head_rows < vocab
        self.vocab = vocab if isinstance(vocab, int) else None
        # As for the draft: SGLang's runner calls the root's forward() directly (no hooks), so
        # the ids are read where the root calls its inner model; vLLM's inner model is called
        # through its own compiled __call__ (no hooks), and its runner calls the root.
        inner = getattr(self.root, "model", None)
        if isinstance(inner, nn.Module) and target_parts(inner) is not None:
            inner = getattr(inner, "model", None)  # a wrapper (spectrace's reference target): the decoder is one deeper
        entry: nn.Module = inner if isinstance(inner, nn.Module) and type(inner).__call__ is nn.Module.__call__ else self.root
        self._handles = [
            entry.register_forward_pre_hook(self._begin, with_kwargs=True),
            entry.register_forward_hook(self._end, with_kwargs=True),
            self.norm.register_forward_hook(self._normed, with_kwargs=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _done(self) -> bool:
        full = self.capture._full if self.capture is not None else self.puts >= 4 * MAX_FORWARDS
        return self.split or full or _capturing() or torch.compiler.is_compiling()

    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._n = None
        if self._done():
            return
        try:
            self._start(args, kwargs)
        except Exception as exc:  # a hook never raises into the model
            self._n = None
            if self.recorder is not None:
                self.recorder.internal_error(f"replay target: {type(exc).__name__}: {exc}")

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = _arg(args, kwargs, 0, "input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]  # Hugging Face's (1, T)
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() == 0:
            return
        n = min(self.rows + 1, int(ids.shape[0]))
        batch = kwargs.get("forward_batch", args[2] if len(args) > 2 and hasattr(args[2], "forward_mode") else None)
        if batch is not None:  # SGLang: the first request's rows from position 0 of an extend
            mode = getattr(getattr(batch, "forward_mode", None), "name", None)
            prefix, lens = getattr(batch, "extend_prefix_lens_cpu", None), getattr(batch, "extend_seq_lens_cpu", None)
            if not mode or "EXTEND" not in mode or "DRAFT" in mode or not prefix or not lens or int(prefix[0]) != 0:
                return
            n = min(n, int(lens[0]))
        else:
            positions = _arg(args, kwargs, 1, "positions")
            if isinstance(positions, torch.Tensor) and positions.device.type == "cpu" and positions.numel():
                if int(positions.reshape(-1)[0]) != 0:
                    return
        self._n, self._ids = n, ids

    def _normed(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        n, ids = self._n, self._ids
        if n is None or ids is None:
            return
        self._n = None  # the first final norm of the forward only
        try:
            normed = _first(output)
            if not isinstance(normed, torch.Tensor) or normed.shape[-2 if normed.dim() == 3 else 0] < n:
                return
            rows = normed.reshape(-1, normed.shape[-1])[:n]
            weight = self.head.weight.detach()
            if self.vocab is not None:
                weight = weight[: self.vocab]  # rows past the vocabulary are padding
            with torch.no_grad():
                # In the head's own dtype: a float copy of a 128k-row head would be gigabytes.
                top1 = (rows.detach().to(weight.dtype) @ weight.t()).argmax(-1)
            TARGET_ROWS.put({"target_in": ids[:n].detach().clone().long(), "target_next": top1}, self.rotary)
            self.puts += 1
        except Exception as exc:  # a hook never raises into the model
            if self.recorder is not None:
                self.recorder.internal_error(f"replay target: {type(exc).__name__}: {exc}")

    def _end(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self._n, self._ids = None, None


def keep_target(target: nn.Module, rows: int | None = None, recorder: Any = None, capture: ReplayCapture | None = None) -> TargetTap:
    """Keep ``target``'s next-token choices beside the draft's replay inputs (rows default: ``SPECTRACE_REPLAY_ROWS`` or 8)."""
    return TargetTap(target, rows if rows is not None else _rows_setting(), recorder, capture)


def keep_replay(draft: nn.Module, rows: int | None = None, max_forwards: int = MAX_FORWARDS, recorder: Any = None) -> ReplayCapture:
    """Start keeping ``draft``'s replay inputs (rows default: ``SPECTRACE_REPLAY_ROWS`` or 8)."""
    return ReplayCapture(draft, rows if rows is not None else _rows_setting(), max_forwards, recorder)

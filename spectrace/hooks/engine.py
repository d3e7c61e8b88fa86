"""The capture engine: forward hooks that turn module calls into ``call`` records.

A :class:`Tracer` hooks the selected modules of one or more roots and wraps each
root's ``forward`` (SGLang calls ``.forward()`` directly, so a hook on the root would
never fire). Each outermost root call is a *step*: its calls are collected, their
statistics (device vectors, see :mod:`.stats`) are copied to the host in one go after
the step, and the finished records go to the :class:`~spectrace.recorder.Recorder`.

A hook never raises into the model: every internal failure becomes a counted
``internal_error``. Hooks only read tensors, so outputs are bit-identical.

    >>> tracer = Tracer(recorder, stats="basic")
    >>> tracer.attach(model, modules=["model.layers.*"])
    >>> model(ids); tracer.detach()
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import torch
import torch.nn as nn

from ..recorder import Recorder
from ..records import Call, TensorMeta
from .selection import ModuleFilter, select
from .stats import _INDEX_DTYPES, PendingStats, device_stats, stats_supported
from .tensors import collect


def _capturing() -> bool:
    """True while a CUDA graph is being captured (no new work may be queued then)."""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


class _ThreadSteps:
    """One thread's open step: threads sharing a model never mix their calls."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.start_ns = 0
        self.calls: list[Call] = []
        self.pending = PendingStats()


class Tracer:
    """Hooks modules and produces one list of call records per step."""

    def __init__(self, recorder: Recorder, *, stats: str = "basic", sample: int = 1) -> None:
        self.recorder = recorder
        self.stats_mode = stats
        self.sample = max(1, sample)
        self.step = -1
        self.auto_step = True
        self._handles: list[Any] = []
        self._wrapped: list[tuple[nn.Module, Any, bool, Any]] = []
        self._active = True
        self._local = threading.local()
        self._seq = 0
        self._counter_lock = threading.Lock()
        self._hooked: dict[int, str] = {}
        self._adopted: dict[int, tuple[Any, ...]] = {}

    # ---------------------------------------------------------------- set-up
    def attach(
        self,
        root: nn.Module,
        modules: ModuleFilter = None,
        *,
        types: tuple[Any, ...] = (),
        profile: str | None = None,
        prefix: str = "",
    ) -> list[str]:
        """Hook the selected modules under ``root`` and wrap its forward; returns their names."""
        chosen = select(root, modules, types=types, profile=profile)
        names: list[str] = []
        root_name = prefix or type(root).__name__
        for name, module in chosen:
            if id(module) in self._hooked:
                continue
            full = f"{prefix}.{name}" if prefix else name
            self._hooked[id(module)] = full
            self._handles.append(module.register_forward_pre_hook(self._make_pre_hook(full), with_kwargs=True))
            self._handles.append(
                module.register_forward_hook(self._make_post_hook(full, type(module).__name__, root_name), with_kwargs=True)
            )
            names.append(full)
        self.wrap_forward(root)
        return names

    def adopt(self, root: nn.Module, prefix: str, modules: ModuleFilter = None, profile: str | None = None) -> None:
        """Wrap ``root``'s forward now and hook its modules on its first outermost call.

        Auto-activation adopts every model as it is built; a model built inside another
        (a Hugging Face backbone inside its LM head class) is first called at depth > 0
        and so is traced as part of the outer one, not twice.
        """
        self._adopted[id(root)] = (prefix, modules, profile)
        self.wrap_forward(root)

    def _attach_adopted(self, root: nn.Module) -> None:
        spec = self._adopted.pop(id(root), None)
        if spec is None:
            return
        prefix, modules, profile = spec
        try:
            self.attach(root, modules, profile=profile, prefix=prefix)
        except Exception as exc:
            self.recorder.internal_error(f"attach {prefix}: {type(exc).__name__}: {exc}")

    def wrap_forward(self, root: nn.Module) -> None:
        """Make every call of ``root.forward`` (direct or through ``__call__``) a step."""
        if any(entry[0] is root for entry in self._wrapped):
            return
        had_own = "forward" in root.__dict__
        original = root.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self._active:  # detached while another wrapper still sits on top
                return original(*args, **kwargs)
            if self._adopted and self._depth() == 0:
                self._attach_adopted(root)
            opened = self._open_step()
            try:
                return original(*args, **kwargs)
            finally:
                if opened:
                    self._close_step()

        root.forward = forward  # type: ignore[method-assign]
        self._wrapped.append((root, original, had_own, forward))

    def detach(self) -> None:
        """Remove every hook and restore every wrapped forward (called from ``finally``)."""
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._handles.clear()
        self._active = False
        for root, original, had_own, wrapper in self._wrapped:
            try:
                if root.__dict__.get("forward") is not wrapper:
                    # Another trace wrapped on top of ours: unwinding here would drop its
                    # wrapper too. Ours stays inside the chain as a pass-through.
                    continue
                if had_own:
                    root.forward = original  # type: ignore[method-assign]
                else:
                    del root.forward
            except Exception:
                pass
        self._wrapped.clear()
        self._hooked.clear()
        self.finish_step()

    # ----------------------------------------------------------------- steps
    def _thread(self) -> _ThreadSteps:
        state = getattr(self._local, "steps", None)
        if state is None:
            state = self._local.steps = _ThreadSteps(self.step)
        return state

    def set_step(self, step: int) -> None:
        """Take over step numbering (a speculative loop marks its own steps)."""
        self.finish_step()
        self.auto_step = False
        self.step = step
        state = self._thread()
        state.step, state.start_ns = step, time.time_ns()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _open_step(self) -> bool:
        depth = self._depth()
        self._local.depth = depth + 1
        if depth == 0 and self.auto_step:
            with self._counter_lock:
                self.step += 1
                step = self.step
            state = self._thread()
            state.step, state.start_ns = step, time.time_ns()
            return True
        return False

    def _close_step(self) -> None:
        self._local.depth = max(0, self._depth() - 1)
        self.finish_step(wait=False)  # no host sync inside the forward

    def _sampled(self) -> bool:
        step = self._thread().step
        return step % self.sample == 0 if step >= 0 else True

    def finish_step(self, wait: bool = True) -> None:
        """Start the step's statistics read-back; its calls go on once the copy landed.

        On CUDA the copy is non-blocking into pinned memory behind an event; with
        ``wait=False`` (the end of a forward) nothing blocks and the calls are handed on
        at a later step's end, or when anything reads the trace (``wait=True``).
        """
        state = self._thread()
        calls, state.calls = state.calls, []
        step, start, end = state.step, state.start_ns or time.time_ns(), time.time_ns()
        try:
            state.pending.resolve_async(lambda: self._emit_step(step, calls, start, end))
            state.pending.drain(wait=wait)
        except Exception as exc:
            self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")

    def _emit_step(self, step: int, calls: list[Call], start: int, end: int) -> None:
        if not calls:
            return
        try:
            self.recorder.emit_step(step, calls, start, end)
        except Exception as exc:  # runs inside the host's forward: never raise
            self.recorder.counters.records_dropped += len(calls)
            self.recorder.internal_error(f"step hand-off: {type(exc).__name__}: {exc}")

    # ----------------------------------------------------------------- hooks
    def _make_pre_hook(self, name: str) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                if not self._sampled():
                    return
                stack = self._local.__dict__.setdefault("inputs", [])
                stack.append([])  # the post-hook pops one entry per call, whatever happens here
                stack[-1] = self._metas(collect(args, kwargs, side="input"))
            except Exception as exc:
                self.recorder.internal_error(f"pre-hook {name}: {type(exc).__name__}: {exc}")
            return None

        return pre_hook

    def _make_post_hook(self, name: str, module_type: str, root: str) -> Callable[..., None]:
        def post_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            try:
                with self._counter_lock:
                    self.recorder.counters.calls_seen += 1
                if not self._sampled():
                    return
                stack = self._local.__dict__.get("inputs") or [[]]
                inputs = stack.pop() if stack else []
                capturing = _capturing()
                outputs = self._metas(collect((), None, output, side="output"), capturing)
                state = self._thread()
                with self._counter_lock:
                    self._seq += 1
                    seq = self._seq
                state.calls.append(
                    Call(
                        step=state.step,
                        seq=seq,
                        module=name,
                        module_type=module_type,
                        root=root,
                        inputs=inputs,
                        outputs=outputs,
                        t_unix=time.time(),
                        graph_capture=capturing,
                    )
                )
                if capturing:
                    self.recorder.coverage(
                        "graph_replay",
                        "modules ran under CUDA-graph capture: shapes recorded once, replays are not traced per module",
                        step=state.step,
                    )
                if self.auto_step and self._depth() == 0:
                    # A hooked module called outside any wrapped root: flush per call.
                    self.finish_step(wait=False)
            except Exception as exc:
                self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
            return None

        return post_hook

    def _metas(self, tensors: list[tuple[str, torch.Tensor]], capturing: bool | None = None) -> list[TensorMeta]:
        if capturing is None:
            capturing = _capturing()
        metas: list[TensorMeta] = []
        # "basic" summarises the first tensor of each side that statistics apply to (the
        # hidden states); "full" every tensor. Shapes are always recorded for all of them.
        # Rotary cos/sin, masks and ids repeat in every layer and would double the cost.
        budget = None if self.stats_mode == "full" else 1
        for arg, tensor in tensors:
            try:
                shape = [int(s) for s in tensor.shape]
            except Exception:  # nested/jagged tensors have no single shape
                shape = []
            meta = TensorMeta(arg=arg, shape=shape, dtype=str(tensor.dtype).replace("torch.", ""), device=str(tensor.device))
            metas.append(meta)
            if self.stats_mode == "off" or capturing or budget == 0 or meta.dtype in _INDEX_DTYPES:
                continue
            if not stats_supported(tensor):
                continue
            if budget is not None:
                budget -= 1
            try:
                self._thread().pending.add(meta, device_stats(tensor, self.stats_mode), tensor.numel())
            except Exception as exc:
                self.recorder.internal_error(f"statistic on {tensor.dtype}: {type(exc).__name__}: {exc}")
        return metas

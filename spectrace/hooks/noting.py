"""Noting a call: its tensors' shapes, and statistics enqueued for those that get them.

A call's note is a plain tuple (:data:`~.call_text.RawCall`) built into a record later, off
the host's thread (:mod:`.building`). Statistics are enqueued on the step's
:class:`~.readback.StepStats` (inside a graph being captured: a slot of the graph's
statistics table, :mod:`.graph_slots`). Privacy (:mod:`.privacy`): a tensor that is a
function of the token ids alone gets its shape and dtype only.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .call_text import RawTensor
from .describe import describe, device_of, dtype_name
from .graph_branch import capturing as _capturing
from .module_view import ViewItem
from .privacy import ALL, INPUTS, SHARED, TokenTensors
from .step_state import ThreadSteps
from .tensor_stats import INDEX_DTYPES, stats_supported
from .tracer_base import TracerBase


class Noting(TracerBase):
    """Turns one call's tensors into its note, and its note into the step's calls."""

    def observe(self, name: str, module_type: str, role: str | None, items: list[ViewItem], root: str = "") -> None:
        """A call the engine did not see as a module call (a function an integration
        patched: SGLang's logits, its aux concat), recorded like one. Never raises."""
        try:
            self._finish_call(name, module_type, root, role, [], items)
        except Exception as exc:
            self.recorder.internal_error(f"observe {name}: {type(exc).__name__}: {exc}")

    def _finish_call(
        self,
        name: str,
        module_type: str,
        root: str,
        role: str | None,
        inputs: list[RawTensor],
        items: list[ViewItem] | None,
        plain: list[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """One call's record note; its outputs either as an output view's ``items`` or, from
        the generic walk, as ``plain`` (arg, tensor) pairs."""
        local = self._local.__dict__
        state = local.get("steps") or self._thread()
        if state.pending:
            self._read_pending(state)  # the calls before this one come first
        if state.warming:
            if items is None:
                items = [(arg, t, None, None) for arg, t in plain or ()]
            self._warm(items)  # an engine's warm-up before capture: compile now, not mid-capture
            return
        state.seen += 1
        if state.untraced:
            return
        with self._counter_lock:
            self._seq += 1
            seq = self._seq
        outside = local.get("depth", 0) == 0  # a hooked module called outside any wrapped root
        if outside:
            state.capturing = _capturing()
        if plain is not None:
            outputs = self._note(plain, state, name, module_type, role, reuse=False, output=True)
        else:
            outputs = self._note_items(items or [], state, name, module_type, role)
        ctx = state.context
        state.calls.append((state.step, seq, name, module_type, root, inputs, outputs, time.time(), state.capturing, role, ctx))
        if state.capturing and self.graph_slots is None:
            self.recorder.coverage(
                "graph_replay",
                "modules ran under CUDA-graph capture: shapes recorded once, replays are not traced per module",
                step=state.step,
            )
        if self.auto_step and outside:
            self.finish_step(wait=False)  # flush per call

    def _warm(self, items: list[ViewItem]) -> None:
        slots = self.graph_slots
        if slots is None or self.stats_mode == "off":
            return
        for _arg, tensor, add, cols in items:
            if isinstance(tensor, torch.Tensor) and stats_supported(tensor):
                slots.warm(tensor, add=add, cols=cols)

    def _note_items(self, items: list[ViewItem], state: ThreadSteps, name: str, module_type: str, role: str | None) -> list[RawTensor]:
        """An output view's tensors: plain ones as :meth:`_note` does; a sum or a column
        range as the tensor it stands for (built eagerly, or computed inside the graph)."""
        if all(add is None and cols is None for _a, _t, add, cols in items):
            return self._note([(arg, t) for arg, t, _add, _cols in items], state, name, module_type, role, reuse=False, output=True)
        noted: list[RawTensor] = []
        scope = None if self.token_stats else self._token_scope.get(name)
        private = not self.token_stats and (scope in (ALL, SHARED) or TokenTensors.is_token_module(role, module_type))
        for arg, tensor, add, cols in items:
            if private:
                # A token-only module's output (privacy.py): shape and dtype only, remembered
                # for the modules that take it next.
                if scope != SHARED:
                    self._token_tensors.remember(tensor)
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            if not self.token_stats and self._token_tensors.holds(tensor):
                # A view of an embedding output (an integration remembered it): shape and
                # dtype only, in eager steps and in a captured graph alike (privacy.py).
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            if state.capturing and self._graph_slot(tensor, state, name, module_type, role, arg, add, cols):
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            view = tensor
            if not state.capturing and self.stats_mode != "off":
                if add is not None:
                    view = tensor + add
                if cols is not None:
                    view = view[..., cols[0] : cols[1]].contiguous()
            noted.extend(self._note([(arg, view)], state, name, module_type, role, budget=1, reuse=False, output=True))
        return noted

    def _shape_only(self, arg: str, tensor: torch.Tensor, state: ThreadSteps, cols: tuple[int, int] | None) -> RawTensor:
        shape = tuple(tensor.shape)
        if cols is not None and shape:
            shape = (*shape[:-1], cols[1] - cols[0])
        return (arg, shape, dtype_name(tensor.dtype), device_of(tensor), state.stats.generation, -1, 0)

    def _graph_slot(
        self,
        tensor: torch.Tensor,
        state: ThreadSteps,
        name: str,
        module_type: str,
        role: str | None,
        arg: str,
        add: torch.Tensor | None = None,
        cols: tuple[int, int] | None = None,
    ) -> bool:
        """Statistics of ``tensor`` as kernels inside the graph being captured (True if it took a slot)."""
        slots = self.graph_slots
        if slots is None or self.stats_mode == "off" or slots.capturing_table() is None:
            return False
        ctx = state.context
        try:
            return (
                slots.record(
                    tensor, name=name, role=role, module_type=module_type, arg=arg, draft_step=ctx[2] if ctx else None, add=add, cols=cols
                )
                is not None
            )
        except Exception as exc:
            self.recorder.internal_error(f"graph slot {name}: {type(exc).__name__}: {exc}")
            return False

    def _note(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        state: ThreadSteps,
        name: str = "",
        module_type: str = "",
        role: str | None = None,
        budget: int | None = -1,
        reuse: bool = True,
        guard: tuple[torch.Tensor, int] | None = None,
        seen: dict[int, Any] | None = None,
        output: bool = False,
    ) -> list[RawTensor]:
        """Shapes of every tensor, and statistics enqueued for the ones that get them
        (inside a graph being captured: a slot of its statistics table).

        ``guard``: (tensor, its version at the call) of a call read later; that tensor's
        statistics are skipped, and counted, if it was written in place since. ``seen``:
        the (shape, dtype, device) of tensors already noted in this pass, by identity
        (rotary cos/sin and position ids go to every layer; a layer's output is the next
        one's input). ``output``: the tensors are the call's outputs (a module whose
        inputs alone are token-only keeps its outputs' statistics)."""
        noted: list[RawTensor] = []
        generation = state.stats.generation  # a step ends in finish_step only: fixed here
        if self.stats_mode == "off":
            # Shapes only: the loop below without its statistics branch (the hottest path).
            for arg, tensor in tensors:
                shape, dtype, device = describe(tensor, seen)
                if device != "cpu":
                    state.on_device = True
                noted.append((arg, shape, dtype, device, generation, -1, 0))
            return noted
        # "basic" summarises the first tensor of each side that statistics apply to (the
        # hidden states); "full" every tensor. Shapes are always recorded for all of them.
        # Rotary cos/sin, masks and ids repeat in every layer and would double the cost.
        if budget == -1:
            budget = None if self.stats_mode == "full" else 1
        # Privacy (privacy.py): a token-only module's tensors (an embedding's outputs, layer
        # 0's input norm and q/k/v, ...), and those same tensors seen again, get no
        # statistics (asked here, without a call per tensor).
        token_module = False
        keep_refs = True
        if not self.token_stats:
            scope = self._token_scope.get(name)
            token_module = scope in (ALL, SHARED) or (scope == INPUTS and not output) or TokenTensors.is_token_module(role, module_type)
            keep_refs = scope != SHARED
        token_refs = None if self.token_stats else self._token_refs  # (empty: nothing to ask per tensor)
        for arg, tensor in tensors:
            hit = seen.get(id(tensor)) if seen is not None else None
            matched = hit is not None and hit[0] is tensor
            described, supported = (hit[1], hit[2]) if matched else (describe(tensor), None)
            shape, dtype, device = described
            index = -1
            numel = 0
            eligible = budget != 0 and dtype not in INDEX_DTYPES
            if eligible and supported is None:
                supported = stats_supported(tensor)
            if seen is not None and (not matched or supported is not hit[2]):
                # (a layer's output is the next one's input: described and asked once)
                seen[id(tensor)] = (tensor, described, supported)
            if eligible:
                if supported:
                    if budget is not None:
                        budget -= 1
                    if token_module:
                        if keep_refs:  # a function of the token ids alone: shape and dtype only
                            self._token_tensors.remember(tensor)
                    elif token_refs and self._token_tensors.holds(tensor):
                        pass  # an embedding output seen again
                    elif state.capturing:
                        # Nothing may be read back during capture; a slot in the graph instead.
                        self._graph_slot(tensor, state, name, module_type, role, arg)
                    else:
                        try:
                            if guard is not None and tensor is guard[0]:
                                if tensor._version == guard[1]:
                                    numel = tensor.numel()
                                    index = state.stats.add(tensor, reuse, version=guard[1], owner=name)
                                else:
                                    state.stats.skipped_modified += 1  # reported at the step's end
                            else:
                                numel = tensor.numel()
                                # A module seen writing in place launches at once, never held.
                                index = state.stats.add(tensor, reuse, owner=name, hold=name not in self._read_at_once)
                        except Exception as exc:
                            self.recorder.internal_error(f"statistic on {tensor.dtype}: {type(exc).__name__}: {exc}")
            if device != "cpu":
                state.on_device = True
            noted.append((arg, shape, dtype, device, generation, index, numel))
        return noted

    def remember_token_tensor(self, tensor: torch.Tensor) -> None:
        """An integration's word that ``tensor`` is a function of one token id each row
        (an embedding output it saw outside a module call): it gets no statistics."""
        self._token_tensors.remember(tensor)

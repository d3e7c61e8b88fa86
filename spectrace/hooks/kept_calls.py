"""Reading the calls the hooks kept: one pass, warm, in the calls' order.

A call inside a traced forward is kept as it came (``Tracer._keep``, engine.py) and read
here with the others: at the step's end, or once ``engine.PENDING_CALLS`` calls or
``engine.PENDING_BYTES`` of their outputs are held. Each call is noted as its hooks would
have noted it (:mod:`.noting`); statistics only of tensors whose version is still the
call's (a module seen writing its input or output in place is read at once from then on).
"""

from __future__ import annotations

from typing import Any

import torch

from .call_text import RawTensor
from .describe import describe
from .step_state import Pending, ThreadSteps
from .tensor_stats import INDEX_DTYPES, stats_supported
from .tensors import MAX_TENSORS_PER_SIDE, collect, collect_kwargs
from .tracer_base import TracerBase


class KeptCalls(TracerBase):
    """Notes the calls a step's hooks kept, in one pass."""

    def _read_pending(self, state: ThreadSteps) -> None:
        """Note the calls the hooks kept (see PENDING_CALLS), in their order, as the hooks
        would have one by one; statistics only of tensors whose version is the call's."""
        pending, state.pending, state.pending_bytes = state.pending, [], 0
        with self._counter_lock:
            first = self._seq + 1
            self._seq += len(pending)
        state.seen += len(pending)
        # No model code runs until this pass ends: its CPU statistics are taken together.
        state.stats.batch_rows = True
        try:
            self._read_kept(state, pending, first)
        finally:
            state.stats.batch_rows = False
            try:
                state.stats.take_rows()
            except Exception as exc:
                self.recorder.internal_error(f"statistics of kept calls: {type(exc).__name__}: {exc}")

    def _read_kept(self, state: ThreadSteps, pending: list[Pending], first: int) -> None:
        step, capturing, ctx, calls, note = state.step, state.capturing, state.context, state.calls, self._note
        seen: dict[int, Any] = {}  # (see describe.describe) every tensor here is held: ids are unique
        # The keyword arguments' notes by the arguments' identities: the layers of a stack get
        # the same objects (rotary cos/sin, position ids, mask), walked and noted once a pass.
        # Only notes without statistics are kept: shapes only, or the positional arguments
        # took the one statistic of the side ("basic").
        kwarg_notes: dict[tuple[Any, ...], list[RawTensor]] = {}
        shapes_only = self.stats_mode == "off"
        for n, (spec, args, kwargs, output, t_unix, in_version, out, out_version) in enumerate(pending):
            name, module_type, root, role = spec
            try:
                guard = None
                if in_version is not None:
                    guard = (args[0], in_version)
                    if args[0]._version != in_version:
                        # The module wrote its input in place: its calls are read at once from now on.
                        self._read_at_once.add(name)
                # (one tensor argument, one tensor output: most calls; collect's answer without the call)
                found = [("input[0]", args[0])] if len(args) == 1 and type(args[0]) is torch.Tensor else collect(args, None, side="input")
                if not kwargs:
                    inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                else:
                    room = MAX_TENSORS_PER_SIDE - len(found)
                    if shapes_only or (found and self._takes_stats(found[0][1], seen)):  # the side's statistic is taken
                        inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                        key = (room, tuple(kwargs), tuple(map(id, kwargs.values())))
                        rest = kwarg_notes.get(key)
                        if rest is None:
                            rest = kwarg_notes[key] = note(
                                collect_kwargs(kwargs, room), state, name, module_type, role, budget=0, seen=seen
                            )
                        inputs = inputs + rest if inputs else rest
                    else:
                        found += collect_kwargs(kwargs, room)
                        inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                guard = None
                if out is not None:
                    guard = (out, out_version)
                    if out._version != out_version:
                        self._read_at_once.add(name)  # its output is written in place after the call
                found = [("output", output)] if type(output) is torch.Tensor else collect((), None, output, side="output")
                outputs = note(found, state, name, module_type, role, reuse=False, guard=guard, seen=seen, output=True)
            except Exception as exc:
                self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
                continue
            calls.append((step, first + n, name, module_type, root, inputs, outputs, t_unix, capturing, role, ctx))

    @staticmethod
    def _takes_stats(tensor: torch.Tensor, seen: dict[int, Any]) -> bool:
        """Whether :meth:`_note` gives ``tensor``, first of its side, the side's statistic
        ("basic"): its answers kept in ``seen`` as _note keeps them."""
        hit = seen.get(id(tensor))
        if hit is None or hit[0] is not tensor:
            describe(tensor, seen)
            hit = seen[id(tensor)]
        if hit[1][1] in INDEX_DTYPES:
            return False
        supported = hit[2]
        if supported is None:
            supported = stats_supported(tensor)
            seen[id(tensor)] = (tensor, hit[1], supported)
        return supported

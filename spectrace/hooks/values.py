"""Keep the first rows of the fused draft input and their token ids (``SPECTRACE_CAPTURE_VALUES=N``).

Opt-in, off by default: these are tensor values of the user's run (the embedding chunk
spells out the prompt), written beside the trace as ``<trace stem>.values.safetensors``
(:mod:`spectrace.values_file`) for ``spectrace compare-train``, which recomputes the
target's hidden states for the same ids and says which boundary each chunk really is.

Which rows and steps: the first :data:`MAX_STEPS` target forwards whose fused input
starts a sequence at position 0, one per forward, the first sequence's rows only, at most
N of them. A prefix is needed because the comparison reruns the target from position 0:

- SGLang: an ``EXTEND`` batch whose first request has no cached prefix
  (``extend_prefix_lens_cpu[0] == 0``, host metadata); its rows are the first request's
  ``extend_seq_lens_cpu[0]``. ``DECODE``, ``TARGET_VERIFY`` and draft batches continue a
  sequence and are not kept. Under CUDA-graph replay no Python hook runs, so only eager
  forwards (prefills are) can be kept.
- A plain model (the reference pipeline's target): ``input_ids`` of its root forward,
  the first row of a batch; a forward with a KV cache whose positions do not start at 0
  is not kept.

Where positions come as a tensor, they are copied too and checked once the copy has
landed: only the leading rows at positions 0, 1, 2, ... are written.

Cost: once the steps are taken, one attribute test per root forward. At a kept step, on
the CPU a clone; on CUDA a clone on the device and an event recorded after it (never
while a graph is captured). A copy into pinned host memory would need a pinned
allocation, and CUDA's host allocation synchronizes the device: the forward would wait.
The host's thread never waits: once the last step is kept, the recorder's flush thread
waits on the events, copies the rows to the host and writes the file; with fewer steps
kept, that happens at close. Until then at most :data:`MAX_STEPS` x N rows stay on the
device.

A forked child starts with no kept steps of its own (the parent's are the parent's).

    >>> capture = values_capture(recorder)   # None unless SPECTRACE_CAPTURE_VALUES
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..records import Capture, Values
from ..values_file import ValuesMeta, ValuesStep, ValuesStepData, encode, values_name, write_private
from .graph_branch import capturing as _capturing

MAX_STEPS = 4  # forwards kept per process: enough to compare, few enough to stay off the hot path
_INDEX = (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8)


class StepInputs(NamedTuple):
    """What a root forward says about its rows (references only, nothing copied)."""

    ids: torch.Tensor  # (T,) token ids of the rows
    positions: torch.Tensor | None  # (T,) when the forward was given them as a tensor
    limit: int | None  # rows of the first sequence, when the batch says
    forward_mode: str | None


@dataclass
class _Slot:
    step: int
    fused: torch.Tensor  # (n, width): a host copy, or on CUDA a device clone until the drain
    ids: torch.Tensor  # (n,), the same
    positions: torch.Tensor | None
    forward_mode: str | None
    event: Any  # a CUDA event recorded after the copies, or None on the CPU


def values_capture(recorder: Any) -> ValuesCapture | None:
    """The capture of a tracer's recorder, or None when ``SPECTRACE_CAPTURE_VALUES`` is off."""
    tokens = int(getattr(recorder.settings, "capture_values", 0) or 0)
    return ValuesCapture(recorder, tokens) if tokens > 0 else None


def forward_batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An SGLang ``ForwardBatch`` among a call's arguments, by its attributes (this module
    does not import the engine), or None."""
    batch = kwargs.get("forward_batch")
    if batch is not None:
        return batch
    for value in args[:4]:
        if hasattr(value, "forward_mode") and hasattr(value, "batch_size"):
            return value
    return None


def _index_tensor(value: Any) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) and value.dtype in _INDEX else None


def step_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> StepInputs | None:
    """The rows a root forward runs, if they can start a kept step (None otherwise)."""
    batch = forward_batch_of(args, kwargs)
    if batch is not None:  # an SGLang ForwardBatch: host metadata only
        mode = getattr(getattr(batch, "forward_mode", None), "name", None)
        if mode != "EXTEND":
            return None
        prefix = getattr(batch, "extend_prefix_lens_cpu", None)
        lens = getattr(batch, "extend_seq_lens_cpu", None)
        if prefix is None or lens is None or not len(prefix) or not len(lens) or int(prefix[0]) != 0:
            return None
        ids = _index_tensor(getattr(batch, "input_ids", None))
        if ids is None:
            ids = _index_tensor(args[0] if args else kwargs.get("input_ids"))
        if ids is None or ids.dim() != 1:
            return None
        return StepInputs(ids, None, int(lens[0]), mode)
    ids = _index_tensor(kwargs.get("input_ids", args[0] if args else None))
    if ids is None or ids.dim() not in (1, 2):
        return None
    positions = _index_tensor(kwargs.get("position_ids", kwargs.get("positions", args[1] if len(args) > 1 else None)))
    if positions is None and kwargs.get("past_key_values") is not None:
        positions = _index_tensor(kwargs.get("cache_position"))
        if positions is None:
            return None  # a KV cache and nothing that says where the rows start
    if ids.dim() == 2:
        ids = ids[0]
        if positions is not None and positions.dim() == 2:
            positions = positions[0]
    if positions is not None and positions.dim() != 1:
        positions = None
    return StepInputs(ids, positions, int(ids.shape[0]), None)


def _host_copy(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.device | None]:
    """A copy of ``tensor`` that nothing else writes, and the CUDA device whose stream must
    finish it (None: done).

    On the CPU a clone; on CUDA a clone on the device, queued and not waited for (the drain
    brings it to the host, see the module's doc); on any other accelerator a plain copy to
    the host (it waits, at most :data:`MAX_STEPS` times a process)."""
    if tensor.device.type == "cpu":
        return tensor.clone(), None
    if tensor.device.type != "cuda":
        return tensor.to("cpu"), None
    return tensor.clone(), tensor.device


class ValuesCapture:
    """Takes the kept steps' rows and writes the values file once (see the module's doc)."""

    def __init__(self, recorder: Any, tokens: int, max_steps: int = MAX_STEPS) -> None:
        self.recorder = recorder
        self.tokens = tokens
        self.max_steps = max_steps
        self._local = threading.local()
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []
        self._full = False
        self._written = False
        self._pid = os.getpid()
        self._module = ""
        recorder.add_drain(self.drain)

    # ---------------------------------------------------------------- host side
    def note_root(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """At an outermost forward's start: the rows it runs (references, no copy)."""
        if self._full:
            return
        try:
            self._local.inputs = step_inputs(args, kwargs)
        except Exception as exc:
            self._local.inputs = None
            self.recorder.internal_error(f"values: step inputs: {type(exc).__name__}: {exc}")

    def end_root(self) -> None:
        self._local.inputs = None

    def offer(self, fused: Any, step: int, module: str) -> None:
        """The fused draft input of this forward (aux concat output). Never raises."""
        if self._full:
            return
        try:
            self._offer(fused, step, module)
        except Exception as exc:
            self.recorder.internal_error(f"values: {type(exc).__name__}: {exc}")

    def _in_child(self) -> None:
        """In a forked child: the parent's kept steps are not this process's (its trace is its own)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.Lock()  # a parent thread may have held it at the fork
            self._slots, self._full, self._written = [], False, False

    def _offer(self, fused: Any, step: int, module: str) -> None:
        inputs: StepInputs | None = getattr(self._local, "inputs", None)
        if inputs is None or not isinstance(fused, torch.Tensor) or _capturing() or torch.compiler.is_compiling():
            return  # not a forward from position 0, or inside a graph capture (nothing may be queued)
        self._in_child()
        x = fused.detach()
        if x.dim() == 3:
            x = x[0]
        if x.dim() != 2 or x.shape[0] != inputs.ids.shape[0]:
            return  # not one row per token of the forward (SGLang's LAST capture mode keeps one per request)
        n = min(self.tokens, int(x.shape[0]), int(inputs.ids.shape[0]), inputs.limit if inputs.limit is not None else self.tokens)
        if n <= 0:
            return
        with self._lock:
            if self._full:
                return
            self._local.inputs = None  # one slot per forward
            fused_h, device = _host_copy(x[:n])
            ids_h, ids_device = _host_copy(inputs.ids[:n])
            positions = inputs.positions
            pos_h, pos_device = _host_copy(positions[:n]) if positions is not None else (None, None)
            event = None
            device = device or ids_device or pos_device
            if device is not None:
                # Recorded after the copies, on the stream that queued them (the tensors' device).
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
            self._slots.append(_Slot(step, fused_h, ids_h, pos_h, inputs.forward_mode, event))
            self._module = self._module or module
            self._full = len(self._slots) >= self.max_steps
        if self._full:
            self.recorder.drain_soon()  # written from the flush thread, once the copies landed

    # ---------------------------------------------------------- off the hot path
    def drain(self) -> None:
        """The recorder's drain: write the file once the last step is kept (at close: whatever
        was kept), after its copies have landed."""
        self._in_child()
        final = bool(getattr(self.recorder, "closing", False))
        with self._lock:
            if final and not self._slots and not self._written:
                self._written = True
                self.recorder.coverage(
                    "not_covered",
                    f"SPECTRACE_CAPTURE_VALUES={self.tokens}: no fused draft input was seen with a row per token of a forward "
                    "from position 0 (no aux concat ran, or only decode, verify, last-token or CUDA-graph replays did): "
                    "no values file",
                )
                return
            if self._written or not self._slots or (not self._full and not final):
                return
            slots = list(self._slots)
            self._written = self._full = True
        try:
            for slot in slots:
                if slot.event is not None:
                    slot.event.synchronize()  # a drain runs on the flush thread or a reader's, never in a forward
                    slot.fused, slot.ids = slot.fused.cpu(), slot.ids.cpu()
                    slot.positions = slot.positions.cpu() if slot.positions is not None else None
            self._write(slots)
        except BaseException:
            # A full disk, a folder gone for a moment: the rows are still here, and the next
            # drain (a read, at the latest the close) tries again. The recorder counts this one.
            with self._lock:
                self._written = False
            raise

    def _write(self, slots: list[_Slot]) -> None:
        rec = self.recorder
        kept: list[ValuesStepData] = []
        off_zero = 0
        for slot in slots:
            rows = int(slot.fused.shape[0])
            if slot.positions is not None:
                expected = torch.arange(rows, dtype=torch.int64)
                good = (slot.positions.to(torch.int64) == expected).int().cumprod(0)
                rows = int(good.sum())
            if rows <= 0:
                off_zero += 1
                continue
            kept.append(ValuesStepData(slot.step, slot.ids[:rows].to(torch.int64), slot.fused[:rows], slot.forward_mode))
        if off_zero:
            rec.coverage("not_covered", f"SPECTRACE_CAPTURE_VALUES: {off_zero} kept forward(s) did not start at position 0: not written")
        if not kept:
            return
        path = rec.open_file()
        if path is None:
            rec.coverage(
                "not_covered",
                "SPECTRACE_CAPTURE_VALUES: the trace has no folder (set SPECTRACE_DIR or directory=): the values were not written",
            )
            return
        directory, trace_name = os.path.split(path)
        first = kept[0].fused
        meta = ValuesMeta(
            trace=trace_name,
            module=self._module,
            tokens=self.tokens,
            width=int(first.shape[1]),
            dtype=str(first.dtype).replace("torch.", ""),
            boundaries=self._boundaries(),
            steps=[ValuesStep(step=s.step, rows=int(s.fused.shape[0]), forward_mode=s.forward_mode) for s in kept],
        )
        try:
            name = write_private(directory, values_name(trace_name), encode(meta, kept))
        except Exception as exc:
            rec.sink_error(f"values file: {type(exc).__name__}: {exc}")
            return
        rec.emit(
            Values(
                file=name,
                module=meta.module,
                tokens=self.tokens,
                steps=[s.step for s in meta.steps],
                rows=[s.rows for s in meta.steps],
                width=meta.width,
                dtype=meta.dtype,
                boundaries=meta.boundaries,
                t_unix=time.time(),
            )
        )

    def _boundaries(self) -> list[int] | None:
        """The boundaries of the last capture record so far (the chunks' stated provenance)."""
        try:
            captures = [r for r in list(self.recorder.important) if isinstance(r, Capture)]
        except Exception:
            return None
        if not captures or not captures[-1].enabled:
            return None
        return list(captures[-1].boundaries)

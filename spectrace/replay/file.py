"""The replay file: a served draft's inputs and its outputs at each module boundary.

``SPECTRACE_REPLAY=1`` keeps them (:mod:`spectrace.hooks.replay_capture`) as
``<trace stem>.replay.safetensors`` beside the trace, created as the values file is
(0600, never over an existing name). Per kept forward ``i`` it holds tensors named
``fwd<i>.<key>`` for the keys in :data:`KEYS` that the forward produced; the safetensors
metadata key ``spectrace`` holds :class:`ReplayMeta` as JSON. These are tensor values of
a user's run: user data.

    >>> replay_name("trace-host-42.jsonl")
    'trace-host-42.replay.safetensors'
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from ..safe_files import FileMissing, SafeFileError, open_regular, shown

REPLAY_SUFFIX = ".replay.safetensors"
RESULT_SUFFIX = ".replay.json"
FORMAT = "spectrace.replay/1"
META_KEY = "spectrace"
# The writer's limits (:mod:`spectrace.hooks.replay_capture` keeps no more), which the
# reader checks before it loads a byte of tensor data: a replay file is a file anyone may
# have put beside a trace.
MAX_FORWARDS = 4  # forwards kept per process
MAX_BYTES = 64 * 1024 * 1024  # tensor bytes per process: a forward that would pass it is not kept
MAX_ROWS = 256  # SPECTRACE_REPLAY_ROWS at most
TOPK = 8  # logits kept per row (their top k)
MAX_HEADER_BYTES = 1 << 20  # the safetensors header (names, shapes, metadata) of MAX_FORWARDS forwards is a few KiB
# What each kept tensor is: ids (integer, one per row), or rows of floats of one width.
_ID_KEYS = ("input_ids", "positions", "topk_ids", "target_ids", "target_in", "target_next")  # the rest are floating rows
# The target's own rows (``spectrace probe``): one id per row, up to one row more than the draft's.
_TARGET_ROW_KEYS = ("target_in", "target_next")
_FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_INT_DTYPES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
# What one kept forward may hold, in data-path order. Inputs: the ids, positions, the
# fused input rows as the draft got them (``hidden_in``), what fc read (``fc_in``, after
# any input norm), the embeddings and the hidden states the decoder layer read. Outputs:
# fc, the decoder layer (its output plus residual, what the final norm reads), the final
# norm, the top-k of the logits over the served head, their target ids after the map. And
# the target's own forward just before (``spectrace probe``): its input ids and its top-1
# next token at rows 0 .. rows (one more row than the draft's).
KEYS = (
    "input_ids", "positions", "hidden_in", "fc_in", "fc_out", "embeds", "layer_in",
    "layer_out", "norm_out", "topk_values", "topk_ids", "target_ids", "target_in", "target_next",
)  # fmt: skip


class ReplayForward(BaseModel):
    """One kept draft forward."""

    step: int = Field(description="the trace's step number, -1 outside a traced step")
    draft_call: int = Field(description="which draft forward of the process this was (0 = the first)")
    rows: int = Field(description="rows kept: positions 0 .. rows-1 of the first sequence")
    forward_mode: str | None = Field(None, description="the engine's forward mode (EXTEND, DRAFT_EXTEND), None outside an engine")
    keys: list[str] = Field(default=[], description="the tensors kept for this forward (fwd<i>.<key>)")


class ReplayMeta(BaseModel):
    """What a replay file holds, written into its safetensors metadata."""

    format: str = FORMAT
    trace: str = Field("", description="the trace file these values belong to (a name in the same folder)")
    engine: str = Field("", description="the draft's class as served (its module and name)")
    dtype: str = Field("", description="dtype of the served hidden states")
    rows: int = Field(description="SPECTRACE_REPLAY_ROWS: the most rows kept per forward")
    topk: int = Field(description="logits kept per row (their top k)")
    bytes_per_forward: list[int] = Field(default=[], description="bytes kept for each forward")
    target_rotary: dict[str, Any] | None = Field(
        None, description="the target's rotary as served (base, neox style, class), where its choices were kept"
    )
    forwards: list[ReplayForward] = []
    too_large: list[int] = Field(
        default=[], description="bytes of each forward not kept because it would pass the per-process cap (MAX_BYTES)"
    )


@dataclass
class ReplayData:
    """One kept forward as read back (CPU tensors by key)."""

    meta: ReplayForward
    tensors: dict[str, Any] = field(default_factory=dict)


class ReplayFileError(ValueError):
    """A replay file that cannot be used (a one-line message)."""


def replay_name(trace_name: str) -> str:
    """The replay file's name for a trace file's name (same stem)."""
    stem = trace_name[: -len(".jsonl")] if trace_name.endswith(".jsonl") else trace_name
    return stem + REPLAY_SUFFIX


def encode(meta: ReplayMeta, forwards: list[ReplayData]) -> bytes:
    """The safetensors bytes of ``forwards`` with ``meta`` in the metadata."""
    from safetensors.torch import save

    tensors = {f"fwd{i}.{key}": t.contiguous() for i, f in enumerate(forwards) for key, t in f.tensors.items()}
    return save(tensors, metadata={META_KEY: meta.model_dump_json()})


def save_beside(replay_file: str, suffix: str, result: BaseModel, warn: Callable[[str], None] | None) -> None:
    """A command's result beside the trace, named as the replay file with ``suffix``
    (``.replay.json``, ``.probe.json``); a failed write is one warning, never an error."""
    from ..values_file import write_private

    folder, name = os.path.split(replay_file)
    try:
        write_private(folder or ".", name[: -len(REPLAY_SUFFIX)] + suffix, result.model_dump_json(indent=2).encode())
    except OSError as exc:
        if warn is not None:
            warn(f"the result was not written beside the trace ({exc.strerror or exc})")


def find_replay_files(trace: str) -> list[str]:
    """The replay files of a trace file (its own, by its whole stem), or of every trace in a
    folder, oldest first by modification time (the last is the latest written, whatever
    the names' numbers say)."""
    if os.path.isdir(trace):
        found = [os.path.join(trace, n) for n in os.listdir(trace) if n.endswith(REPLAY_SUFFIX)]
    else:
        folder, name = os.path.split(trace)
        own = trace if name.endswith(REPLAY_SUFFIX) else os.path.join(folder or ".", replay_name(name))
        found = [own] if os.path.lexists(own) else []
    return sorted(found, key=_written_at)


def _written_at(path: str) -> tuple[int, str]:
    try:
        return os.lstat(path).st_mtime_ns, path
    except OSError:
        return 0, path


def _header(path: str, fd: int, size: int) -> tuple[int, dict[str, Any]]:
    """The safetensors header's length and content, checked against the writer's limits
    before any tensor is read; :class:`ReplayFileError` otherwise."""
    name = shown(path)
    if size < 8:
        raise ReplayFileError(f"{name} is not a readable replay file: {size} bytes, shorter than a safetensors header")
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if length > MAX_HEADER_BYTES:
        raise ReplayFileError(f"{name} declares a {length}-byte header; a replay file's is at most {MAX_HEADER_BYTES} bytes")
    if size > 8 + length + MAX_BYTES:
        raise ReplayFileError(f"{name} is {size} bytes; a replay file holds at most {MAX_BYTES >> 20} MiB of tensors")
    try:
        header = json.loads(os.pread(fd, length, 8).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ReplayFileError(f"{name} is not a readable replay file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ReplayFileError(f"{name} is not a readable replay file: its header is not a JSON object")
    return length, header


def _check_tensors(path: str, header: dict[str, Any], meta: ReplayMeta, data_bytes: int) -> None:
    """Every tensor as the writer makes it: at most :data:`MAX_FORWARDS` forwards of at most
    :data:`MAX_ROWS` rows, :data:`MAX_BYTES` in all, each tensor's first dimension the
    forward's rows, ids integer and the rest floating rows of one width."""
    name = shown(path)
    if len(meta.forwards) > MAX_FORWARDS:
        raise ReplayFileError(f"{name} claims {len(meta.forwards)} forwards; a replay file keeps at most {MAX_FORWARDS}")
    if not 0 < meta.rows <= MAX_ROWS or not 0 < meta.topk <= TOPK:
        raise ReplayFileError(f"{name} claims {meta.rows} rows and top-{meta.topk}; the writer keeps 1 to {MAX_ROWS} rows and top-{TOPK}")
    total, width, top = 0, None, None
    for i, fwd in enumerate(meta.forwards):
        if not 0 < fwd.rows <= meta.rows:
            raise ReplayFileError(f"{name}: forward {i} claims {fwd.rows} rows; the file keeps 1 to {meta.rows}")
        for key in fwd.keys:
            entry = header.get(f"fwd{i}.{key}")
            if key not in KEYS or not isinstance(entry, dict):
                continue
            dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
            ints = key in _ID_KEYS
            sizes = _INT_DTYPES if ints else _FLOAT_DTYPES
            what = f"{name}: fwd{i}.{key}"
            if dtype not in sizes:
                raise ReplayFileError(f"{what} is {dtype}; it must be {'an integer' if ints else 'a floating'} dtype ({', '.join(sizes)})")
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ReplayFileError(f"{what} has no valid shape")
            dims = 1 if key in ("input_ids", "positions", *_TARGET_ROW_KEYS) else 2
            if key in _TARGET_ROW_KEYS:
                if len(shape) != 1 or not 0 < shape[0] <= fwd.rows + 1:
                    raise ReplayFileError(f"{what} has shape {shape}; the target's rows are 1 to {fwd.rows + 1} ids")
            elif len(shape) != dims or shape[0] != fwd.rows:
                raise ReplayFileError(f"{what} has shape {shape}; the metadata says {fwd.rows} rows of {dims} dimension(s)")
            if key in ("topk_values", "topk_ids", "target_ids"):
                if shape[1] > TOPK or top not in (None, shape[1]):
                    raise ReplayFileError(f"{what} has shape {shape}: not the top {top or TOPK} the other top-k tensors keep")
                top = shape[1]
            elif dims == 2 and key not in ("hidden_in", "fc_in"):
                if width not in (None, shape[1]):
                    raise ReplayFileError(f"{what} has shape {shape}; the draft's other hidden states are {width} wide")
                width = shape[1]
            if not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets):
                raise ReplayFileError(f"{what} has no valid data offsets")
            nbytes = sizes[dtype]
            for d in shape:
                nbytes *= d
            if offsets[1] - offsets[0] != nbytes or not 0 <= offsets[0] <= offsets[1] <= data_bytes:
                raise ReplayFileError(f"{what}: its data offsets {offsets} do not fit its shape {shape} in the file")
            total += nbytes
    if total > MAX_BYTES:
        raise ReplayFileError(f"{name} holds {total} bytes of tensors; a replay file keeps at most {MAX_BYTES >> 20} MiB")


def read_replay(path: str) -> tuple[ReplayMeta, list[ReplayData]]:
    """The metadata and kept forwards of a replay file; :class:`ReplayFileError` when unusable.

    Checked against the writer's limits from its header alone (a file's size, its forwards,
    rows, dtypes and shapes) before any tensor is loaded."""
    try:
        fd, size = open_regular(path)
    except FileMissing:
        raise ReplayFileError(f"no replay file at {shown(path)}") from None
    except SafeFileError as exc:
        raise ReplayFileError(str(exc)) from None
    try:
        length, header = _header(path, fd, size)
        raw = header.get("__metadata__")
        raw = raw.get(META_KEY) if isinstance(raw, dict) else None
        if not isinstance(raw, str):
            raise ReplayFileError(f"{shown(path)} is a safetensors file without spectrace's metadata: not a replay file")
        meta = ReplayMeta.model_validate_json(raw)
        if meta.format != FORMAT:
            raise ReplayFileError(f"{shown(path)} is in format {meta.format!r}; this spectrace reads {FORMAT!r}")
        _check_tensors(path, header, meta, size - 8 - length)
        # Read through the descriptor checked above (a file swapped in at ``path`` is not
        # read), no more than the bound just checked.
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(fd, min(1 << 20, size - len(data)), len(data))
            if not chunk:
                break
            data += chunk
        from safetensors.torch import load

        tensors = load(bytes(data))
        out = []
        for i, fwd in enumerate(meta.forwards):
            out.append(ReplayData(fwd, {k: tensors[f"fwd{i}.{k}"] for k in fwd.keys if k in KEYS and f"fwd{i}.{k}" in tensors}))
        return meta, out
    except ReplayFileError:
        raise
    except Exception as exc:  # a truncated or foreign file: safetensors' and pydantic's errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReplayFileError(f"{shown(path)} is not a readable replay file: {first[:160]}") from None
    finally:
        os.close(fd)

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

import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from ..safe_files import FileMissing, SafeFileError, open_regular, shown

REPLAY_SUFFIX = ".replay.safetensors"
RESULT_SUFFIX = ".replay.json"
FORMAT = "spectrace.replay/1"
META_KEY = "spectrace"
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


def find_replay_files(trace: str) -> list[str]:
    """The replay files of a trace file, or of every trace in a folder (sorted)."""
    if os.path.isdir(trace):
        return sorted(os.path.join(trace, n) for n in os.listdir(trace) if n.endswith(REPLAY_SUFFIX))
    folder, name = os.path.split(trace)
    if name.endswith(REPLAY_SUFFIX):
        return [trace]
    stem = replay_name(name)[: -len(REPLAY_SUFFIX)]
    return sorted(os.path.join(folder or ".", n) for n in os.listdir(folder or ".") if n.startswith(stem) and n.endswith(REPLAY_SUFFIX))


def read_replay(path: str) -> tuple[ReplayMeta, list[ReplayData]]:
    """The metadata and kept forwards of a replay file; :class:`ReplayFileError` when unusable."""
    try:
        fd, _size = open_regular(path)
    except FileMissing:
        raise ReplayFileError(f"no replay file at {shown(path)}") from None
    except SafeFileError as exc:
        raise ReplayFileError(str(exc)) from None
    try:
        # Opened by the descriptor checked above, so a file swapped in at ``path`` is not read.
        by_fd = f"/proc/self/fd/{fd}"
        source = by_fd if os.path.exists(by_fd) else path
        from safetensors import safe_open

        with safe_open(source, framework="pt") as handle:
            raw = (handle.metadata() or {}).get(META_KEY)
            if raw is None:
                raise ReplayFileError(f"{shown(path)} is a safetensors file without spectrace's metadata: not a replay file")
            meta = ReplayMeta.model_validate_json(raw)
            if meta.format != FORMAT:
                raise ReplayFileError(f"{shown(path)} is in format {meta.format!r}; this spectrace reads {FORMAT!r}")
            names = set(handle.keys())
            out = []
            for i, fwd in enumerate(meta.forwards):
                tensors = {k: handle.get_tensor(f"fwd{i}.{k}") for k in fwd.keys if k in KEYS and f"fwd{i}.{k}" in names}
                out.append(ReplayData(fwd, tensors))
            return meta, out
    except ReplayFileError:
        raise
    except Exception as exc:  # a truncated or foreign file: safetensors' and pydantic's errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReplayFileError(f"{shown(path)} is not a readable replay file: {first[:160]}") from None
    finally:
        os.close(fd)

"""The values file: rows of the fused draft input and their token ids, beside the trace.

``SPECTRACE_CAPTURE_VALUES=N`` writes ``<trace stem>.values.safetensors`` next to
``<trace stem>.jsonl``; ``spectrace compare-train`` reads it. Per kept step ``i`` it holds
``step<i>.fused`` (rows x width, the dtype as served) and ``step<i>.input_ids`` (rows,
int64), each a sequence from position 0; the safetensors metadata key ``spectrace`` holds
:class:`ValuesMeta` as JSON. These are tensor values of a user's run: user data.

The file is created as the trace is: ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, in the
trace's folder opened once; a name already taken is never opened (the next free
``.2``, ``.3``, ... name is used).

    >>> values_name("trace-host-42.jsonl")
    'trace-host-42.values.safetensors'
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .safe_files import FileMissing, SafeFileError, open_regular, shown
from .sinks.jsonl import create_own_file

VALUES_SUFFIX = ".values.safetensors"
FORMAT = "spectrace.values/1"
META_KEY = "spectrace"
_O = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class ValuesStep(BaseModel):
    """One kept step of the values file."""

    step: int = Field(description="the trace's step number")
    rows: int = Field(description="token rows kept (positions 0 .. rows-1 of one sequence)")
    forward_mode: str | None = Field(None, description="the serving engine's forward mode of the step (EXTEND), None outside an engine")


class ValuesMeta(BaseModel):
    """What a values file holds, written into its safetensors metadata."""

    format: str = FORMAT
    trace: str = Field(description="the trace file these values belong to (a name in the same folder)")
    module: str = Field(description="where the rows were taken: the aux concat (the fused draft input)")
    tokens: int = Field(description="SPECTRACE_CAPTURE_VALUES: the most rows kept per step")
    width: int = Field(description="width of one fused row (chunks x hidden)")
    dtype: str = Field(description="dtype of the fused rows as served")
    boundaries: list[int] | None = Field(None, description="the boundaries the trace's capture record names, when known")
    steps: list[ValuesStep] = []


@dataclass
class ValuesStepData:
    """One kept step as read back: its token ids and fused rows (CPU tensors)."""

    step: int
    input_ids: Any  # torch.Tensor (rows,) int64
    fused: Any  # torch.Tensor (rows, width)
    forward_mode: str | None = None


class ValuesFileError(ValueError):
    """A values file that cannot be used (a one-line message)."""


def values_name(trace_name: str) -> str:
    """The values file's name for a trace file's name (same stem)."""
    stem = trace_name[: -len(".jsonl")] if trace_name.endswith(".jsonl") else trace_name
    return stem + VALUES_SUFFIX


def write_private(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` to a new file ``name`` in ``directory`` (0600, O_EXCL, no symlink
    followed); returns the name used (the next free numbered one if ``name`` is taken)."""
    folder = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NONBLOCK", 0) | _O
        fd, candidate = create_own_file(folder, name, flags, directory)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, f"short write of {candidate}")
                view = view[written:]
        except BaseException:
            os.close(fd)
            try:
                os.unlink(candidate, dir_fd=folder)  # a half-written safetensors file is no file
            except OSError:
                pass
            raise
        os.close(fd)
        return candidate
    finally:
        os.close(folder)


def encode(meta: ValuesMeta, steps: list[ValuesStepData]) -> bytes:
    """The safetensors bytes of ``steps`` with ``meta`` in the metadata."""
    from safetensors.torch import save

    tensors = {}
    for i, s in enumerate(steps):
        tensors[f"step{i}.fused"] = s.fused.contiguous()
        tensors[f"step{i}.input_ids"] = s.input_ids.to("cpu").long().contiguous()
    return save(tensors, metadata={META_KEY: meta.model_dump_json()})


def read_values(path: str) -> tuple[ValuesMeta, list[ValuesStepData]]:
    """The metadata and the kept steps of a values file; :class:`ValuesFileError` when unusable."""
    try:
        fd, _size = open_regular(path)
    except FileMissing:
        raise ValuesFileError(f"no values file at {shown(path)}") from None
    except SafeFileError as exc:  # a FIFO would block safetensors' open, a device never end
        raise ValuesFileError(str(exc)) from None
    try:
        return _read_open(path, fd)
    finally:
        os.close(fd)


def _read_open(path: str, fd: int) -> tuple[ValuesMeta, list[ValuesStepData]]:
    # safetensors opens by name: the name of the descriptor checked above (Linux's
    # /proc/self/fd) keeps a file swapped in at ``path`` since from being read instead.
    by_fd = f"/proc/self/fd/{fd}"
    source = by_fd if os.path.exists(by_fd) else path
    try:
        from safetensors import safe_open

        with safe_open(source, framework="pt") as handle:
            raw = (handle.metadata() or {}).get(META_KEY)
            if raw is None:
                raise ValuesFileError(f"{path} is a safetensors file without spectrace's metadata: not a values file")
            meta = ValuesMeta.model_validate_json(raw)
            if meta.format != FORMAT:
                raise ValuesFileError(f"{path} is in format {meta.format!r}; this spectrace reads {FORMAT!r}")
            steps = []
            for i, s in enumerate(meta.steps):
                fused, ids = handle.get_tensor(f"step{i}.fused"), handle.get_tensor(f"step{i}.input_ids")
                if fused.dim() != 2 or ids.dim() != 1 or fused.shape[0] != ids.shape[0] or fused.shape[1] != meta.width:
                    raise ValuesFileError(
                        f"{path}: step {s.step} holds fused {list(fused.shape)} and ids {list(ids.shape)}, not rows x {meta.width}"
                    )
                steps.append(ValuesStepData(s.step, ids.long(), fused, s.forward_mode))
            return meta, steps
    except ValuesFileError:
        raise
    except FileNotFoundError:
        raise ValuesFileError(f"no values file at {path}") from None
    except Exception as exc:  # a truncated or foreign file: safetensors' and pydantic's errors
        first = str(exc).splitlines()[0].replace(source, "the file") if str(exc) else type(exc).__name__
        raise ValuesFileError(f"{shown(path)} is not a readable values file: {first}") from None

"""A draft checkpoint's tensors, read as ``spectrace audit`` reads the folder.

:func:`spectrace.audit.checkpoint.read_checkpoint` first checks config.json and every
header (sizes bounded, files inside the folder); then the tensors are loaded from
safetensors, or through torch's weights-only unpickler (a pickle is never executed).
Names are normalised to one spelling: no ``model.`` prefix, ``midlayer`` as
``layers.0``, the legacy ``aux_norm_*`` as ``fc_norm.*`` (SGLang's own legacy map).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..audit.checkpoint import AuditInputError, DraftCheckpoint, _torch_state, contained, read_checkpoint, read_json

_LEGACY = {"midlayer.": "layers.0.", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}


def normalise(name: str) -> str:
    for old, new in _LEGACY.items():
        name = name.replace(old, new)
    return name[len("model.") :] if name.startswith("model.") else name


def load_draft(folder: Path) -> tuple[DraftCheckpoint, dict[str, Any], dict[str, torch.Tensor]]:
    """(checked inventory, raw config.json, tensors by normalised name); :class:`AuditInputError` on bad input."""
    ckpt = read_checkpoint(folder)
    raw = read_json(folder / "config.json", "draft config", folder)
    tensors: dict[str, torch.Tensor] = {}
    for file in ckpt.files:
        path = contained(folder / file, folder)
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file

            try:
                got = load_file(str(path))
            except Exception as exc:  # a header that passed the audit's checks and still fails
                raise AuditInputError(f"{file}: safetensors could not read it ({type(exc).__name__})") from None
        else:
            got = _torch_state(folder / file, folder)
        for name, tensor in got.items():
            tensors[normalise(name)] = tensor
    return ckpt, json.loads(json.dumps(raw)), tensors

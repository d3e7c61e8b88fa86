"""Which class SGLang built for the draft, against what the draft checkpoint is.

SGLang renames some draft architectures to their NextN/MTP head (``ModelConfig``) and
builds whatever its registry maps the name to, whatever the speculative algorithm; an
EAGLE-3 checkpoint so built never reaches the EAGLE-3 draft's hooks (its class is
another), so the check sits where every model is built: ``ModelRunner.load_model``
returns, on the draft worker's runner. What the checkpoint is comes from its own folder
(the raw config.json's architectures and aux-layer ids, the safetensors headers' names:
bounded reads, no tensor data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...checks.draft_class import check_built_draft_class, check_draft_built_as_target
from ...rules.draft_classes import ModelSize
from . import server, state

# The draft checkpoint's tensor names are read from at most this many safetensors headers.
MAX_HEADERS = 8


def _tensor_names(folder: str | None) -> list[str]:
    if not folder:
        return []
    try:
        from ...audit.checkpoint import read_safetensors_header, weight_files

        root = Path(folder)
        if not root.is_dir():
            return []
        files = [f for f in weight_files(root) if f.suffix == ".safetensors"][:MAX_HEADERS]
        return [name for f in files for name in read_safetensors_header(f, root)]
    except Exception:
        return []  # unreadable: the config's aux ids still say whether it is EAGLE-3


def _has_aux_ids(config: dict[str, Any]) -> bool:
    eagle = config.get("eagle_config")
    nested = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return bool(config.get("eagle_aux_hidden_state_layer_ids") or nested)


def model_size(model: Any) -> ModelSize:
    """The decoder layers (the longest ``layers`` list under the model, one level down at
    most) and the parameter count: shapes only, no tensor data read."""
    layers = None
    for holder in (model, getattr(model, "model", None), getattr(model, "language_model", None)):
        found = getattr(holder, "layers", None) if holder is not None else None
        if found is not None and hasattr(found, "__len__"):
            layers = max(layers or 0, len(found))
    params = sum(int(p.numel()) for p in model.parameters()) if hasattr(model, "parameters") else 0
    return ModelSize(layers, params)


def at_target_model(model: Any) -> None:
    """The target worker's runner built ``model``: its class and size, for the draft's check."""
    state.STATE.__dict__["_spectrace_target_built"] = (type(model).__name__, model_size(model))


def at_draft_model(model: Any, model_path: str | None) -> None:
    """The draft worker's runner built ``model`` from the checkpoint at ``model_path``."""
    path = model_path or server.spec_args().get("speculative_draft_model_path")
    raw = server.draft_config_from_path(str(path) if path else None)
    archs = raw.get("architectures") if raw is not None else None
    architectures = [str(a) for a in archs] if isinstance(archs, list) else []
    # Without a local config.json what the checkpoint is stays unknown: only the built
    # model's class and size are judged.
    if raw is not None:
        for found in check_built_draft_class(
            type(model).__name__, architectures, _tensor_names(str(path)), _has_aux_ids(raw), algorithm=server.algorithm()
        ):
            state.emit_once(f"draft_class_mismatch:{type(model).__name__}", lambda found=found: found)
    # The other direction: the full target model built as the draft (no draft kind at all).
    target = state.STATE.__dict__.get("_spectrace_target_built")
    for found in check_draft_built_as_target(
        type(model).__name__,
        architectures,
        target_class=target[0] if target else None,
        draft_size=model_size(model),
        target_size=target[1] if target else None,
        algorithm=server.algorithm(),
    ):
        state.emit_once(f"draft_class_mismatch:{type(model).__name__}", lambda found=found: found)

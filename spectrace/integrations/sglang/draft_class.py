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

from ...checks.draft_class import check_built_draft_class
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


def at_draft_model(model: Any, model_path: str | None) -> None:
    """The draft worker's runner built ``model`` from the checkpoint at ``model_path``."""
    path = model_path or server.spec_args().get("speculative_draft_model_path")
    raw = server.draft_config_from_path(str(path) if path else None)
    if raw is None:
        return  # no local config.json: what the checkpoint is stays unknown
    archs = raw.get("architectures")
    architectures = [str(a) for a in archs] if isinstance(archs, list) else []
    for found in check_built_draft_class(
        type(model).__name__, architectures, _tensor_names(str(path)), _has_aux_ids(raw), algorithm=server.algorithm()
    ):
        state.emit_once(f"draft_class_mismatch:{type(model).__name__}", lambda found=found: found)

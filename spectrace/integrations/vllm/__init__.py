"""spectrace inside vLLM: EAGLE-3 wiring checks with no code change.

Routes in (idempotent, never double-patching):

- ``SPECTRACE=1`` + the plugin entry point ``vllm.general_plugins`` (``plugin.register``),
  which vLLM runs in the API process, EngineCore and every worker;
- ``SPECTRACE=1`` + the ``.pth`` bootstrap: the import hooks this integration registers
  (:func:`.points.import_targets`) patch the same points as vLLM imports the modules;
- explicitly, e.g. in tests::

      from spectrace.integrations import vllm as st_vllm
      st_vllm.install(recorder)      # patch now / on import, records go to `recorder`

What it records: the draft's weight load (``weights``), the target's capture
(``capture``, with the runner that chose the ids), the fc input width, and accepted
drafts per position (``acceptance``); findings per spectrace.rules.catalogue, with the
fixes vLLM's code gives (spectrace.checks.vllm).
"""

from __future__ import annotations

import importlib
from typing import Any

# Nothing is imported eagerly: the import-hook route reads .points in every process.
_LAZY = {
    "state": (".state", None),
    "applied": (".patching", "applied"),
    "is_patched": (".patching", "is_patched"),
    "POINTS": (".points", "POINTS"),
    "Point": (".points", "Point"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    loaded = importlib.import_module(module, __name__)
    return loaded if attr is None else getattr(loaded, attr)


def install(recorder: Any = None) -> list[str]:
    """Patch vLLM now (imported modules) and on import (the rest); records go to ``recorder``
    (default: the process recorder). Returns the point keys patched by this call."""
    from . import state
    from .patching import install_direct

    if recorder is not None:
        state.use_recorder(recorder)
    return install_direct()


__all__ = ["install", "applied", "is_patched", "POINTS", "Point", "state"]

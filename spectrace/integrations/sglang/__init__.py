"""spectrace inside a real SGLang process: EAGLE-3 wiring checks with no code change.

Routes in (both idempotent, never double-patching):

- ``SPECTRACE=1`` + the plugin entry point ``sglang.srt.plugins`` (``plugin.register``),
  hooks registered with SGLang's ``HookRegistry``;
- ``SPECTRACE=1`` + the ``.pth`` bootstrap: ``runtime.INTEGRATIONS`` patches the same
  points as the modules import (versions without plugins);
- explicitly, e.g. in tests::

      from spectrace.integrations import sglang as st_sglang
      st_sglang.install(recorder)      # patch now / on import, records go to `recorder`

What it records: the draft's weight load (``weights``), the target's capture list
(``capture``), shape checks on the draft input and the logits processor, accept lengths
per verify (``acceptance``), graph-replay coverage; findings per spectrace.findings.
"""

from __future__ import annotations

from typing import Any

from . import state
from .patching import applied, hooked, install_direct, is_patched
from .points import POINTS, Point


def install(recorder: Any = None) -> list[str]:
    """Patch SGLang now (imported modules) and on import (the rest); records go to ``recorder``
    (default: the process recorder). Returns the point keys patched by this call."""
    if recorder is not None:
        state.use_recorder(recorder)
    return install_direct()


def note_draft_config(config: Any, source: str = "explicit") -> None:
    """Tell spectrace the draft's config.json (when no server args say where it is)."""
    from .correlate import note_draft_config as _note
    from .server import config_to_dict

    _note(config_to_dict(config), source)


__all__ = ["install", "note_draft_config", "applied", "hooked", "is_patched", "POINTS", "Point", "state"]

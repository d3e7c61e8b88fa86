"""spectrace inside a real SGLang process: EAGLE-3 wiring checks with no code change.

Routes in (both idempotent, never double-patching):

- ``SPECTRACE=1`` + the plugin entry point ``sglang.srt.plugins`` (``plugin.register``),
  hooks registered with SGLang's ``HookRegistry``;
- ``SPECTRACE=1`` + the ``.pth`` bootstrap: the import hooks this integration registers
  (:func:`.points.import_targets`, from its point table) patch the same points as the
  modules import (versions without plugins);
- explicitly, e.g. in tests::

      from spectrace.integrations import sglang as st_sglang
      st_sglang.install(recorder)      # patch now / on import, records go to `recorder`

What it records: the draft's weight load (``weights``), the target's capture list
(``capture``), shape checks on the draft input and the logits processor, accept lengths
per verify (``acceptance``), graph-replay coverage; findings per spectrace.rules.catalogue.
"""

from __future__ import annotations

from typing import Any

from ..core.package import lazy_attributes

# Nothing is imported eagerly: the import-hook route reads .points in every process
# under SPECTRACE=1, and must not pull the hooks in with it. ``install(recorder=None)``
# patches SGLang now (imported modules) and on import (the rest), records going to
# ``recorder`` (default: the process recorder), and returns the point keys it patched.
__getattr__ = lazy_attributes(__name__, {"hooked": (".patching", "hooked"), "install_direct": (".patching", "install_direct")})


def note_draft_config(config: Any, source: str = "explicit") -> None:
    """Tell spectrace the draft's config.json (when no server args say where it is)."""
    from ..core.configs import config_to_dict
    from .correlate import note_draft_config as _note

    _note(config_to_dict(config), source)


__all__ = ["install", "note_draft_config", "applied", "hooked", "is_patched", "POINTS", "Point", "state"]

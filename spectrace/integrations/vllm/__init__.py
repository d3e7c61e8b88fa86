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

from ..core.package import lazy_attributes

# Nothing is imported eagerly (the import-hook route reads .points in every process).
# ``install(recorder=None)`` patches vLLM now and on import; records go to ``recorder``.
__getattr__ = lazy_attributes(__name__)


__all__ = ["install", "applied", "is_patched", "POINTS", "Point", "state"]

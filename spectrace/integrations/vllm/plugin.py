"""vLLM plugin route: entry point ``vllm.general_plugins`` -> ``register``.

``vllm.plugins.load_general_plugins()`` calls ``register()`` with no arguments in every
process that builds models (the API server, EngineCore, each worker), once per process,
and vLLM warns plugins that it may happen more than once. It does nothing unless
``SPECTRACE=1``; then it starts spectrace's process runtime (exit flush, the import hooks
of every integration; idempotent, and already done when the ``.pth`` bootstrap ran) and
patches the vLLM modules already imported. The rest are patched as vLLM imports them.
"""

from __future__ import annotations

import os
import sys
import threading

_done: list[bool] = []
_lock = threading.Lock()


def _enabled() -> bool:
    return os.environ.get("SPECTRACE", "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    if not _enabled():
        return
    with _lock:
        if _done:
            return
        _done.append(True)
    try:
        from ... import runtime
        from .patching import install_direct

        runtime.activate()
        install_direct()
    except Exception as exc:  # never break vLLM's start-up
        sys.stderr.write(f"spectrace: warning: vLLM plugin registration failed: {type(exc).__name__}: {exc}\n")

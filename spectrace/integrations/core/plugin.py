"""An engine's plugin entry point: on only under ``SPECTRACE=1``, once per process, never raising.

SGLang (``sglang.srt.plugins``) and vLLM (``vllm.general_plugins``) call a plugin function
with no arguments in each process they start, and may call it again (vLLM says so). The
engine's loader reads its own allowlist (``SGLANG_PLUGINS``, ``VLLM_PLUGINS``) before it
calls anything; :meth:`EnginePlugin.register` reads it again, so that a direct call (a
test, an older loader) honours the user's list the same way.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

ENTRY_POINT_NAME = "spectrace"  # the name in both engines' entry-point groups (pyproject.toml)


def spectrace_enabled() -> bool:
    return os.environ.get("SPECTRACE", "").strip().lower() in ("1", "true", "yes", "on")


class EnginePlugin:
    def __init__(self, engine: str, allowlist: str, *, lenient: bool) -> None:
        self.engine = engine
        self.allowlist = allowlist
        # How the engine reads its list: SGLang strips each name and loads every plugin when
        # the list is empty; vLLM matches names exactly and an empty list loads none.
        self._lenient = lenient
        self._done = False
        self._lock = threading.Lock()

    def allowed(self) -> bool:
        """Does the engine's allowlist let spectrace's entry point load?"""
        raw = os.environ.get(self.allowlist)
        if raw is None:
            return True
        if self._lenient:
            names = {name.strip() for name in raw.split(",") if name.strip()}
            return not names or ENTRY_POINT_NAME in names
        return ENTRY_POINT_NAME in raw.split(",")

    def register(self, start: Callable[[], object]) -> None:
        """Run ``start`` the first time the engine loads the plugin with spectrace switched on."""
        if not spectrace_enabled() or not self.allowed():
            return
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            start()
        except Exception as exc:  # never break the engine's start-up
            sys.stderr.write(f"spectrace: warning: {self.engine} plugin registration failed: {type(exc).__name__}: {exc}\n")

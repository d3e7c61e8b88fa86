"""SGLang plugin route: entry point ``sglang.srt.plugins`` -> ``register``.

``sglang.srt.plugins.load_plugins()`` calls ``register()`` with no arguments in every
SGLang process (scheduler/TP workers included), then applies the hooks. It does nothing
unless ``SPECTRACE=1``. Each point whose module exists is registered with
``HookRegistry`` on its dotted path and *claimed*, so the ``.pth`` import hook (if also
active) does not patch it a second time; points already patched by the import hook are
skipped. The process's exit flush comes from ``spectrace.runtime.activate()``.
"""

from __future__ import annotations

import os


def _enabled() -> bool:
    return os.environ.get("SPECTRACE", "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    if not _enabled():
        return
    try:
        from .patching import register_with_hook_registry

        register_with_hook_registry()
    except Exception as exc:  # never break SGLang's start-up
        import sys

        sys.stderr.write(f"spectrace: warning: SGLang plugin registration failed: {type(exc).__name__}: {exc}\n")

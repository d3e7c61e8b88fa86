"""SGLang plugin route: entry point ``sglang.srt.plugins`` -> ``register``.

``sglang.srt.plugins.load_plugins()`` calls ``register()`` with no arguments in every
SGLang process (scheduler/TP workers included), then applies the hooks. It does nothing
unless ``SPECTRACE=1`` (and ``SGLANG_PLUGINS``, when set, names ``spectrace``), and once
per process. Each point whose module is imported is registered with ``HookRegistry`` on
its dotted path and *claimed*, so the ``.pth`` import hook (if also active) does not
patch it a second time; points already patched by the import hook are skipped. The
process's exit flush comes from ``spectrace.runtime.activate()``.
"""

from __future__ import annotations

from ..core.plugin import EnginePlugin

PLUGIN = EnginePlugin("SGLang", "SGLANG_PLUGINS", lenient=True)


def register() -> None:
    PLUGIN.register(_start)


def _start() -> None:
    from .patching import register_with_hook_registry

    register_with_hook_registry()

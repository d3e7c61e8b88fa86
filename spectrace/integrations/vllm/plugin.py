"""vLLM plugin route: entry point ``vllm.general_plugins`` -> ``register``.

``vllm.plugins.load_general_plugins()`` calls ``register()`` with no arguments in every
process that builds models (the API server, EngineCore, each worker), once per process,
and vLLM warns plugins that it may happen more than once. It does nothing unless
``SPECTRACE=1`` (and ``VLLM_PLUGINS``, when set, names ``spectrace``), and once per
process; then it starts spectrace's process runtime (exit flush, the import hooks of
every integration; idempotent, and already done when the ``.pth`` bootstrap ran) and
patches the vLLM modules already imported. The rest are patched as vLLM imports them.
"""

from __future__ import annotations

from ..core.plugin import EnginePlugin

PLUGIN = EnginePlugin("vLLM", "VLLM_PLUGINS", lenient=False)


def register() -> None:
    PLUGIN.register(_activate_and_patch)


def _activate_and_patch() -> None:
    from ... import runtime
    from .patching import install_direct

    runtime.activate()
    install_direct()

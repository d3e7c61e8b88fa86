"""Import-hook route (``SPECTRACE=1`` through the ``.pth`` bootstrap, any SGLang version).

``spectrace.runtime.INTEGRATIONS`` maps each SGLang module spectrace watches to
:func:`patch_module`; it runs right after the module is imported and patches the
points of that module (see :mod:`.points`). Points the plugin route already claimed
are left to SGLang's HookRegistry.
"""

from __future__ import annotations

from types import ModuleType

from .patching import patch_module as _patch_module


def patch_module(module: ModuleType) -> None:
    _patch_module(module)


# The name runtime.INTEGRATIONS first used for llama_eagle3; same behaviour.
patch_draft_module = patch_module

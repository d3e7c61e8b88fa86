"""An engine package's attributes, imported only when first read.

Every engine folder has the same three modules the core works with: ``points`` (its
table), ``patching`` (its :class:`~.patcher.Patcher`) and ``state``. The import-hook route
reads each engine's point table in every process under ``SPECTRACE=1``; importing the
engine package must not pull its hooks (and torch) in with it, so what the package
offers from those modules loads on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

# name -> (".submodule", attribute, or None for the module itself)
ENGINE_ATTRIBUTES: dict[str, tuple[str, str | None]] = {
    "state": (".state", None),
    "POINTS": (".points", "POINTS"),
    "Point": (".points", "Point"),
    "applied": (".patching", "applied"),
    "is_patched": (".patching", "is_patched"),
    "install": (".patching", "install"),
}


def lazy_attributes(package: str, extra: Mapping[str, tuple[str, str | None]] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the engine ``package``: :data:`ENGINE_ATTRIBUTES` and its ``extra`` ones."""
    table = {**ENGINE_ATTRIBUTES, **(extra or {})}

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = table[name]
        loaded = importlib.import_module(module, package)
        return loaded if attr is None else getattr(loaded, attr)

    return __getattr__

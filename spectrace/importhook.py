"""Run a callback right after a module is imported (or now, if it already is).

Auto-activation uses this to patch ``transformers`` and SGLang's model modules as they
load, without importing them itself. Callbacks run once per module and their errors
are handed to ``on_error`` instead of breaking the import.

    >>> when_imported("transformers.modeling_utils", patch_transformers)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType

Callback = Callable[[ModuleType], None]

_callbacks: dict[str, list[Callback]] = {}
_lock = threading.RLock()
_finder: _PostImportFinder | None = None
_on_error: Callable[[str], None] = lambda message: sys.stderr.write(f"spectrace: warning: {message}\n")


def set_error_handler(handler: Callable[[str], None]) -> None:
    global _on_error
    _on_error = handler


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:
            _on_error(f"patching {name} failed ({type(exc).__name__}: {exc}); it is not covered")


class _LoaderWrapper(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _run(self.name, module)

    def __getattr__(self, item: str) -> object:
        return getattr(self.inner, item)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Delegates to the other finders, then wraps the loader of watched modules."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)  # type: ignore[arg-type]
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderWrapper(spec.loader, fullname)  # type: ignore[assignment]
                return spec
        return None


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported; now if it already is."""
    global _finder
    module = sys.modules.get(name)
    if module is not None:
        try:
            callback(module)
        except Exception as exc:
            _on_error(f"patching {name} failed ({type(exc).__name__}: {exc}); it is not covered")
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)


def module_exists(name: str) -> bool:
    """Whether ``name`` could be imported, without importing it or its parent packages.

    ``importlib.util.find_spec`` would import every parent package; in a server process
    that can pull in code the server itself never loads. The source file is looked for
    under the already imported (or merely located) top-level package instead.
    """
    if name in sys.modules:
        return True
    top, _, rest = name.partition(".")
    package = sys.modules.get(top)
    roots = list(getattr(package, "__path__", None) or [])
    if package is None:
        try:
            spec = importlib.util.find_spec(top)  # a top-level name imports nothing
        except (ImportError, ValueError):
            return False
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not rest:
        return bool(roots) or package is not None
    parts = rest.split(".")
    for root in roots:
        base = os.path.join(root, *parts)
        if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
            return True
    return False

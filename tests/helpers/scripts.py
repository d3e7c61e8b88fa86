"""A script of the repository (bench/, scripts/) imported as a module by its path."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: str | os.PathLike[str]) -> ModuleType:
    """The script at ``path``, registered in sys.modules under its file name (dataclasses look
    their module up there)."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

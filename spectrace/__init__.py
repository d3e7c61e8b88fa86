"""spectrace: debug instrumentation and tracing for EAGLE-3 speculative decoding.

>>> import spectrace
>>> with spectrace.trace(model) as t:
...     model(ids)
>>> [c.module for c in t.calls()]
>>> spectrace.load("traces/")  # a written trace: findings, data path, acceptance
"""

from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = ["__version__", "trace", "Trace", "Settings", "load"]


def __getattr__(name: str) -> Any:
    # Lazy: `import spectrace` must stay cheap (the viewers and the bootstrap import it
    # without wanting torch).
    if name in ("trace", "Trace"):
        from . import api

        return getattr(api, name)
    if name == "load":  # read a trace for a notebook or a script (no torch)
        from .notebook import load

        return load
    if name == "Settings":
        from .settings import Settings

        return Settings
    raise AttributeError(f"module 'spectrace' has no attribute {name!r}")

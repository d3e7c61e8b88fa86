"""BEFORE ``EngineCore.shutdown``: write what is held before vLLM tears the process down.

vLLM's EngineCore handles SIGTERM itself and its parent may end it before interpreter
exit, so spectrace's own exit flush does not always run there: the last verify steps'
acceptance records (held until the next step) and the recorder's buffer would be lost.
"""

from __future__ import annotations

from typing import Any

from . import acceptance, state


def before_shutdown(*args: Any, **kwargs: Any) -> None:
    acceptance.drain()
    state.recorder().flush()
    return None

"""Where an engine's hooks send records, and forgetting what they learned.

Each engine keeps its facts in a dataclass of its own (a subclass of :class:`HookState`)
bound to the name ``STATE`` in its ``state`` module. The hooks read ``state.STATE`` on
every call and tests swap it, so it stays a plain module attribute: :class:`EngineState`
reads and rebinds it through that module's namespace instead of holding a copy.

    >>> STATE = State()                                     # in an engine's state.py
    >>> SHARED = EngineState("vllm", globals(), State)
    >>> SHARED.reset(my_recorder)                           # tests: a fresh State
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass
class HookState:
    recorder: Any = None  # None: the process recorder (spectrace.runtime.recorder())


class EngineState:
    """One engine's process state: its ``STATE``, the lock its facts change under, its recorder."""

    def __init__(self, engine: str, namespace: MutableMapping[str, Any], make: Callable[..., HookState]) -> None:
        self.engine = engine  # lower case, the prefix of its internal errors ("vllm ...")
        self._namespace = namespace
        self._make = make
        # Re-entrant: a check run under the lock may emit, and emitting may take it again.
        self._lock = threading.RLock()

    @property
    def current(self) -> Any:
        return self._namespace["STATE"]

    def reset(self, recorder: Any = None) -> Any:
        """Forget everything learned so far (tests); patches stay installed."""
        with self._lock:
            fresh = self._make(recorder=recorder)
            self._namespace["STATE"] = fresh
        return fresh

    def lock(self) -> threading.RLock:
        """The state's lock, for work that must not interleave with itself across threads."""
        return self._lock

    def use_recorder(self, recorder: Any) -> None:
        self._namespace["STATE"].recorder = recorder

    def recorder(self) -> Any:
        own = self._namespace["STATE"].recorder
        if own is not None:
            return own
        from ... import runtime

        return runtime.recorder()

    def emit(self, record: Any) -> None:
        self.recorder().emit(record)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Count a failure of spectrace's own (never raised into the engine)."""
        try:
            self.recorder().internal_error(f"{self.engine} {where}: {type(exc).__name__}: {exc}")
        except Exception:
            pass

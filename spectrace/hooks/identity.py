"""A map keyed by the object itself, for the models and modules the tracer has seen.

CPython reuses a dead object's memory, so its ``id()`` too: a table keyed by ``id(model)``
takes a model built after another was freed for the old one ("already hooked", "already
adopted") and traces nothing of it, without a word. Here an entry holds a weak reference to
its key, answers only to that object, and goes when the object dies.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class _Strong:
    """A key that takes no weak reference is held (so its id cannot be reused while here)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


class ByIdentity(Generic[V]):
    """``{object: value}`` by identity; an entry lives as long as its object.

    Lookups are a dict lookup and a weak reference call, without a lock; changes take one.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, V]] = {}
        # Reentrant: a collection inside a change may run a dead key's callback on this thread.
        self._lock = threading.RLock()

    def get(self, key: Any, default: V | None = None) -> V | None:
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            return default
        return entry[1]

    def __contains__(self, key: Any) -> bool:
        entry = self._entries.get(id(key))
        return entry is not None and entry[0]() is key

    def __setitem__(self, key: Any, value: V) -> None:
        k = id(key)
        try:
            ref: Any = weakref.ref(key, lambda r, k=k: self._forget(k, r))
        except TypeError:
            ref = _Strong(key)
        with self._lock:
            self._entries[k] = (ref, value)

    def pop(self, key: Any, default: V | None = None) -> V | None:
        with self._lock:
            entry = self._entries.get(id(key))
            if entry is None or entry[0]() is not key:
                return default
            del self._entries[id(key)]
            return entry[1]

    def _snapshot(self) -> list[tuple[Any, V]]:
        while True:
            try:
                return list(self._entries.values())
            except RuntimeError:  # a collection while copying removed a dead key's entry: again
                continue

    def values(self) -> list[V]:
        return [value for ref, value in self._snapshot() if ref() is not None]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Any]:
        for ref, _value in self._snapshot():
            obj = ref()
            if obj is not None:
                yield obj

    def _forget(self, key: int, ref: Any) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]

"""A patch point names a dotted target and the hook spectrace puts around it.

One row per (target, hook): ``module`` + ``qualname`` (``Class.method`` or a module-level
function), how the hook runs (``BEFORE`` / ``AFTER`` / ``AROUND``, HookRegistry's names
and signatures, so SGLang's plugin route and the import-hook route run the very same
function), the hook as ``"submodule:function"`` inside the engine's package, and the
``feature`` it serves. Points of one feature are alternatives across engine releases: a
feature is said "not covered" only when none of them exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Point:
    module: str
    qualname: str  # Class.method inside module, or a module-level function
    kind: str  # "BEFORE" | "AFTER" | "AROUND"
    hook: str  # "submodule:function" inside the engine's package
    feature: str
    # A fallback: left unpatched (and unreported) where this module exists, because a point
    # there does the same job more cheaply (a hook that runs on every step costs each time).
    unless: str = ""

    # The engine package that holds the hooks; each engine's subclass names its own, so a
    # row of its table stays five short strings.
    package: ClassVar[str] = ""

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"

    @property
    def key(self) -> str:
        return f"{self.target}:{self.kind}:{self.hook}"

    def resolve_hook(self) -> Callable[..., Any]:
        sub, _, name = self.hook.partition(":")
        hook: Callable[..., Any] = getattr(importlib.import_module(f"{self.package}.{sub}"), name)
        return hook


class PointTable:
    """An engine's points, and the questions the patcher asks of them.

    Reading a table imports nothing but this module: the import-hook route reads every
    engine's table in every process under ``SPECTRACE=1``.
    """

    def __init__(self, points: Sequence[Point], on_import: str) -> None:
        self.points: tuple[Point, ...] = tuple(points)
        # Every module with a point, in table order (a release may lack some).
        self.modules: tuple[str, ...] = tuple(dict.fromkeys(p.module for p in self.points))
        self._on_import = on_import  # "package.module:function" the import hook calls with the module

    def import_targets(self) -> list[tuple[str, str]]:
        """The import hooks this engine registers: each module of the table, and the callback
        that patches its points right after the engine imports it."""
        return [(module, self._on_import) for module in self.modules]

    def points_for(self, module: str) -> list[Point]:
        return [p for p in self.points if p.module == module]

    def alternatives(self, point: Point) -> list[Point]:
        """The other points of ``point``'s feature (the same job in another release)."""
        return [p for p in self.points if p.feature == point.feature and p is not point]

    def same_hook(self, point: Point) -> set[str]:
        """The keys of every point that runs ``point``'s hook."""
        return {p.key for p in self.points if p.hook == point.hook}

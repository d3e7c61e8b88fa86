"""What the parts of a :class:`~.engine.Tracer` share: its state, by name and type.

The tracer is assembled from parts, one job each (attach.py, steps.py, hook_makers.py,
kept_calls.py, noting.py, building.py; engine.py puts them together and holds a thread's
step and its end). They share one object: the hooks run on the model's hot path, and a
method of the same object is the cheapest call there is. This base names the state they
share (set in ``Tracer.__init__``) and, for the type checker only, the methods one part
calls in another.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.nn as nn

from .call_text import RawTensor, StepContext
from .identity import ByIdentity
from .module_view import ModuleView, ViewItem
from .privacy import Scope, TokenTensors
from .sampling import StepSampler
from .step_state import FinishedStep, ThreadSteps
from .worker import RecordWorker

if TYPE_CHECKING:
    from ..recorder import Recorder
    from . import stepwrap


class TracerBase:
    recorder: Recorder
    stats_mode: str
    step: int
    auto_step: bool
    offload: str
    token_stats: bool
    defer_stats: bool
    roles: dict[str, str]
    values: Any
    graph_slots: Any
    observers: list[Callable[[dict[str, Any]], None]]
    context_of: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], StepContext | None] | None
    views: Callable[[str, nn.Module], ModuleView | None] | None
    sample: int
    budget: Any  # a budget.StepBudget, or None
    _sampler: StepSampler
    _replay: Any
    _target_tap: Any
    _handles: list[Any]
    _wrapped: ByIdentity[stepwrap.Handle]
    _hooked: ByIdentity[str]
    _adopted: ByIdentity[tuple[Any, ...]]
    _active: bool
    _local: threading.local
    _seq: int
    _counter_lock: threading.Lock
    _graph_pending: int
    _graph_readouts: int
    _values_lock: threading.Lock
    _values: collections.OrderedDict[int, list[list[float] | None]]
    _worker: RecordWorker
    _token_tensors: TokenTensors
    _token_refs: dict[int, Any]
    _token_scope: dict[str, Scope]
    _read_at_once: set[str]
    _step: Callable[..., Any]

    if TYPE_CHECKING:
        # (engine.py)
        def _thread(self) -> ThreadSteps: ...
        def finish_step(self, wait: bool = True) -> None: ...
        def _keep(
            self, state: ThreadSteps, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, version: int | None
        ) -> None: ...
        def _read_pending_counted(self, state: ThreadSteps) -> None: ...
        # (attach.py, steps.py)
        def _attach_adopted(self, root: nn.Module) -> None: ...
        def _compiled(self, kind: str = "compile") -> None: ...
        # (kept_calls.py, noting.py)
        def _read_pending(self, state: ThreadSteps) -> None: ...
        def _note(
            self,
            tensors: list[Any],
            state: ThreadSteps,
            name: str = "",
            module_type: str = "",
            role: str | None = None,
            budget: int | None = -1,
            reuse: bool = True,
            guard: Any = None,
            seen: dict[int, Any] | None = None,
            output: bool = False,
        ) -> list[RawTensor]: ...
        def _warm(self, items: list[ViewItem]) -> None: ...
        def _finish_call(
            self,
            name: str,
            module_type: str,
            root: str,
            role: str | None,
            inputs: list[RawTensor],
            items: list[ViewItem] | None,
            plain: list[Any] | None = None,
        ) -> None: ...
        # (hook_makers.py)
        def _make_pre_hook(
            self,
            name: str,
            owner: Any = None,
            module_type: str = "",
            role: str | None = None,
            view: ModuleView | None = None,
            compile_checked: bool = False,
        ) -> Callable[..., None]: ...
        def _make_post_hook(
            self,
            name: str,
            module_type: str,
            root: str,
            owner: Any = None,
            role: str | None = None,
            view: ModuleView | None = None,
            inputs_after: bool = False,
            compile_checked: bool = False,
        ) -> Callable[..., None]: ...
        def _make_around(
            self,
            name: str,
            module_type: str,
            root: str,
            role: str | None,
            view: ModuleView | None,
            pre: Callable[..., None] | None,
            post: Callable[..., None],
        ) -> Callable[..., Any]: ...
        # (building.py)
        def _build_step(self, item: FinishedStep, on_worker: bool = True) -> None: ...
        def _drain_graphs(self, final: bool = False) -> None: ...

"""Process state shared by the SGLang hooks: where records go, what is known so far.

The target's capture list and the draft's config arrive at different moments (the
target is configured before the draft is built or loads, or the other way round in a
script), so the latest of each is kept here and the capture check runs when the second
one arrives; ``checked_pairs`` and ``join_emitted`` keep it from running or saying
anything twice.
Findings that could repeat every step are emitted once and counted afterwards
(:func:`emit_once`, the recorder's ``once``: the count reaches the file at close).

    >>> state.use_recorder(my_recorder)   # tests; a server uses runtime.recorder()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...records import Capture
from ..core.state import EngineState, HookState


@dataclass
class State(HookState):
    capture: Capture | None = None
    draft_config: dict[str, Any] | None = None
    draft_config_source: str = ""
    algorithm: str | None = None
    eagle3_draft: bool = False
    checked_pairs: set[tuple[Any, Any]] = field(default_factory=set)  # (capture key, config key) / (capture key, code)
    join_emitted: set[tuple[Any, ...]] = field(default_factory=set)  # findings of the capture join already emitted
    accept_step: int = 0
    accept_window: list[Any] = field(default_factory=list)
    accept_sum: float = 0.0  # the per-step mean accept lengths so far, summed (the run's mean for a finding)
    accept_steps: int = 0
    accept_pending: list[tuple[list[int], int]] = field(default_factory=list)  # (correct drafts, proposed)
    stale_checks: int = 0  # draft-extend input-width checks so far (sampled after the first ones)
    accept_drain_for: Any = None  # the recorder that drains accept_pending at reads and close
    rank_set: bool = False
    captures_emitted: int = 0
    tracer: Any = None  # the tracer of a test's own recorder (a server uses runtime.tracer())
    rope_pending: list[Any] = field(default_factory=list)  # weakrefs: drafts loaded before any target (scripts)
    rope_targets: list[Any] = field(default_factory=list)  # weakrefs: the targets built since the last reset
    in_capture: int = 0  # > 0 while a CUDA-graph runner warms up and captures (hook time there is start-up cost)

    @property
    def once(self) -> _Said:
        """The keys said through :func:`emit_once` (``key in STATE.once``); the recorder keeps them."""
        return _Said(self)


class _Said:
    def __init__(self, st: State) -> None:
        self.st = st

    def __contains__(self, key: object) -> bool:
        rec = self.st.recorder if self.st.recorder is not None else recorder()
        return isinstance(key, str) and rec.said(key)


STATE = State()
SHARED = EngineState("sglang", globals(), State)
# The names the hooks call (state.recorder(), state.lock(), ...), bound to this engine's STATE.
reset, lock, use_recorder, recorder, emit = SHARED.reset, SHARED.lock, SHARED.use_recorder, SHARED.recorder, SHARED.emit
internal_error = SHARED.internal_error


def tracer() -> Any:
    """The tracing engine the SGLang module hooks feed (imports torch)."""
    if STATE.recorder is None:
        from ... import runtime

        return runtime.tracer()
    if STATE.tracer is None or STATE.tracer.recorder is not STATE.recorder:
        from ...hooks.engine import Tracer

        STATE.tracer = Tracer(STATE.recorder)
        STATE.tracer.defer_stats = False  # SGLang's kernels write in place unversioned (Tracer.defer_stats)
    return STATE.tracer


def emit_once(key: str, make: Any) -> None:
    """Emit the finding ``make()`` the first time ``key`` is seen; count repeats on it.

    ``Recorder.once``: the repeats reach the file in the ``stats`` record at close
    (``once_counts[key]``, the finding carries ``once_key``); in memory the finding's
    ``evidence["occurrences"]`` follows along.
    """
    recorder().once(key, make)

"""Process state shared by the vLLM hooks: where records go and what is known so far.

The target's capture (at ``set_aux_hidden_state_layers``) and the draft's config (at the
draft's construction, or vLLM's speculators reader) arrive in either order, in the same
worker process: the capture checks run when the second one arrives, once per pair. A
finding is emitted once per process (``emitted``); repeats of per-step findings are
counted by the recorder (``emit_once``).

    >>> state.use_recorder(my_recorder)   # tests; a server uses runtime.recorder()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...hooks.identity import ByIdentity
from ...records import Capture
from ..core.state import EngineState, HookState


@dataclass
class State(HookState):
    capture: Capture | None = None
    runner: str | None = None  # "v1" | "mrv2" while a runner sets the capture up, then what it was
    draft_config: dict[str, Any] | None = None
    draft_config_source: str = ""
    checked: set[tuple[Any, ...]] = field(default_factory=set)
    # The captures recorded per model, by the model itself: one built after another was freed
    # may reuse its id, and keyed by id its capture (and its first-forward check) went unrecorded.
    captures_of: ByIdentity[set[str]] = field(default_factory=ByIdentity)
    emitted: set[tuple[Any, ...]] = field(default_factory=set)
    # Acceptance: vLLM builds one SpecDecodingStats per scheduler step and observes each
    # request's draft on it; a step is complete when the next step's object arrives.
    accept_stats: Any = None
    accept_counts: list[int] = field(default_factory=list)
    accept_k: int = 0
    accept_step: int = 0
    accept_window: list[Any] = field(default_factory=list)
    accept_sum: float = 0.0  # the per-step mean accept lengths so far, summed (the run's mean for a finding)
    accept_steps: int = 0
    accept_drain_for: Any = None
    # Each held count's request sampling (None: not said), and the one the scheduler's
    # make_spec_decoding_stats read for the observe_draft it is about to call.
    accept_sampling: list[Any] = field(default_factory=list)
    accept_next_sampling: Any = None
    # Per running request: [drafts accepted, verify steps], until it is freed (acceptance_workload).
    accept_requests: dict[str, list[int]] = field(default_factory=dict)
    freed_requests: int = 0
    accept_peak_batch: int = 0  # the largest batch of the windows already judged (the drain is judged against it)
    # The draft's rotary against the target's: the models seen (weakly) and the pairs compared.
    rope_drafts: list[Any] = field(default_factory=list)
    rope_targets: list[Any] = field(default_factory=list)
    rope_checked: set[tuple[int, int]] = field(default_factory=set)
    # SPECTRACE_REPLAY's captures, one per draft built in this process.
    replays: list[Any] = field(default_factory=list)
    # ... and the target's next-token choices at the same rows (spectrace probe), one per target.
    target_taps: list[Any] = field(default_factory=list)


STATE = State()
SHARED = EngineState("vllm", globals(), State)
# The names the hooks call (state.recorder(), state.lock(), ...), bound to this engine's STATE.
recorder, emit, internal_error = SHARED.recorder, SHARED.emit, SHARED.internal_error
reset, lock, use_recorder = SHARED.reset, SHARED.lock, SHARED.use_recorder


def emit_finding(found: Any) -> None:
    """Emit a finding unless the very same one was emitted already in this process."""
    key = (found.code, found.severity, found.module, found.message)
    with lock():
        if key in STATE.emitted:
            return
        STATE.emitted.add(key)
    recorder().emit(found)

"""Accept lengths per verify step, from the CPU lists SGLang already builds (no device sync).

0.5.17 and 0.5.23 call ``EAGLEWorkerV2.on_verify_complete_cpu(num_correct_drafts_per_req,
batch_size)`` once the accept counts are on the host; an accept length is the correct
drafts plus the bonus token. Older SGLang (``speculative/eagle_worker.py``, EAGLEWorker v1)
returns ``accept_length_per_req_cpu`` from ``verify``; that reader is best effort.
A rolling window feeds the core's ``check_acceptance`` (acceptance_collapse, once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...checks.calls import COLLAPSE_WINDOW, check_acceptance
from ...records import Acceptance
from . import state

ACCEPT_BATCH = 16  # verify steps held before their records are built (two collapse windows)


def _proposed(worker: Any) -> int:
    for attr in ("speculative_num_steps",):
        value = getattr(worker, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(worker, "speculative_num_draft_tokens", None)
    return max(int(value) - 1, 1) if isinstance(value, int) else 1


def record_step(correct: Sequence[int], k: int) -> Acceptance:
    correct = list(map(int, correct))
    # accepted_per_position[i] = requests with more than i correct drafts: the batch less
    # those with at most i, counted by list.count (C speed; a Python loop over the batch
    # was half of this hook's time). Counts outside 0..k are clamped, as a step can't
    # accept fewer than none or more than it proposed.
    at_most = 0
    per_position = [0] * k
    clamped = min(correct, default=0) < 0 or max(correct, default=0) > k
    values = [min(max(c, 0), k) for c in correct] if clamped else correct
    for i in range(k):
        at_most += values.count(i)
        per_position[i] = len(values) - at_most
    # Built without validation: every field is computed right here from ints (once per
    # verify step of a server, validation was a third of the hook's time).
    record = Acceptance.model_construct(
        step=state.STATE.accept_step,
        accept_lengths=[c + 1 for c in correct],
        draft_tokens=k,
        accepted_per_position=per_position,
    )
    state.STATE.accept_step += 1
    state.emit(record)
    window = state.STATE.accept_window
    window.append(record)
    # Checked once per full window of verify steps, not on every step's sliding window:
    # a collapse lasts far longer than one window, and this runs on every step of a server.
    if len(window) >= COLLAPSE_WINDOW:
        if "acceptance_collapse" not in state.STATE.once:
            for found in check_acceptance(list(window)):
                state.emit_once(found.code, lambda found=found: found)
        window.clear()
    return record


def drain() -> None:
    """Build the records of the verify steps held by ``hold_step``, in order."""
    # One drain at a time: a read on another thread (records(), close at exit) and the
    # hook's own drain would otherwise number their steps interleaved.
    with state.lock():
        st = state.STATE
        pending, st.accept_pending = st.accept_pending, []
        for correct, k in pending:
            record_step(correct, k)


def hold_step(correct: list[int], k: int) -> None:
    """Keep one verify step's raw counts; build records a batch at a time.

    On a live server this hook runs once per verify step between the engine's own work,
    with its code and data cold in the caches: measured there, building and writing a
    record cost 54-68 us per step, against 19 us in a loop. Appending two values is the
    per-step cost; the batch of records is built warm, every ``ACCEPT_BATCH`` steps, and
    before anything reads the recorder or closes it (a SIGKILL loses at most one batch).
    """
    st = state.STATE
    with state.lock():  # a drain on another thread swaps the list: never append to the old one
        st.accept_pending.append((correct, k))
        held = len(st.accept_pending)
    if held == 1:
        # A new batch: the recorder it will reach drains it before reads and at close
        # (looked up once per batch, not on every step).
        rec = state.recorder()
        if st.accept_drain_for is not rec:
            rec.add_drain(drain)
            st.accept_drain_for = rec
    if held >= ACCEPT_BATCH:
        drain()


def after_verify_complete_cpu(result: Any, *args: Any, **kwargs: Any) -> None:
    """HookRegistry AFTER: ``(result, self, num_correct_drafts_per_req, batch_size=0)``."""
    try:
        correct = kwargs.get("num_correct_drafts_per_req", args[1] if len(args) > 1 else None)
        if correct:
            hold_step(list(correct), _proposed(args[0]))
    except Exception as exc:
        state.internal_error("accept lengths", exc)
    return None


def after_v1_verify(result: Any, *args: Any, **kwargs: Any) -> None:
    """Older EAGLEWorker.verify: look for ``accept_length_per_req_cpu`` in what it returns."""
    try:
        items = result if isinstance(result, tuple) else (result,)
        for item in items:
            lengths = getattr(item, "accept_length_per_req_cpu", None)
            if isinstance(lengths, list) and lengths:
                hold_step(list(lengths), _proposed(args[0]))  # v1 counted accepted drafts, bonus excluded
                return None
    except Exception as exc:
        state.internal_error("accept lengths (v1)", exc)
    return None

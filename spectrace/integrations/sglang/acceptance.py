"""Accept lengths per verify step, from the CPU lists SGLang already builds (no device sync).

0.5.17 and 0.5.23 call ``EAGLEWorkerV2.on_verify_complete_cpu(num_correct_drafts_per_req,
batch_size)`` once the accept counts are on the host; an accept length is the correct
drafts plus the bonus token. Older SGLang (``speculative/eagle_worker.py``, EAGLEWorker v1)
returns ``accept_length_per_req_cpu`` from ``verify``; that reader is best effort.
A rolling window feeds the core's ``check_acceptance`` (acceptance_collapse, once).

The hook only holds each step's raw counts; records are built ``ACCEPT_BATCH`` steps at a
time (:func:`drain`), and before anything reads the recorder or closes it.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ...checks.acceptance_positions import PositionTally
from ...checks.acceptance_sampling import check_synthetic_acceptance
from ...checks.calls import check_acceptance
from ...checks.drift import DriftTracker
from ...records import Acceptance
from ...rules.acceptance import COLLAPSE_MEAN, COLLAPSE_WINDOW, mean_from_sums
from . import state

# A step's sampling: (greedy, temperatures, top_ps, top_ks) per request, and their prompt
# lengths; temperatures to top_ks are None for an all-greedy batch (SGLang's own
# is_all_greedy, no per-request read), the prompt lengths None but on one step in
# PROMPT_EVERY (drift compares like prompts per window; a read on every step would cost the
# engine's thread a pass over the batch).
Sampling = tuple[list[bool], list[float] | None, list[float] | None, list[int] | None, list[int] | None]
_SAMPLING_KEYS = ("greedy", "temperatures", "top_ps", "top_ks", "prompt_tokens")
PROMPT_EVERY = 8

ACCEPT_BATCH = 16  # verify steps held before their records are built (two collapse windows)
HELD_MAX = 64 * ACCEPT_BATCH  # past this the engine's thread builds them itself (bounded memory)


def _proposed(worker: Any) -> int:
    value = getattr(worker, "speculative_num_steps", None)
    if isinstance(value, int) and value > 0:
        return value
    value = getattr(worker, "speculative_num_draft_tokens", None)
    return max(int(value) - 1, 1) if isinstance(value, int) else 1


def _record_maker() -> Callable[..., Acceptance]:
    """How an Acceptance record is made: pydantic's ``model_construct`` or the same thing inline.

    Every field is computed here from ints, so records are built without validation.
    ``model_construct`` still walks every field's aliases and defaults in Python (2.7 us
    a record, over a quarter of the batch build); setting the four slots it sets, through
    their own setters, costs a fifth of that. The inline maker is used only if its record comes out exactly as
    ``model_construct``'s does, every slot included (a pydantic that sets something else
    gets the real one).
    """
    new = Acceptance.__new__

    def slot(name: str) -> Any:
        # The slot's own setter, as model_construct's object.__setattr__ would find it
        # (looked up once here, not per record).
        return next(cls.__dict__[name] for cls in Acceptance.__mro__ if name in cls.__dict__).__set__

    try:
        set_dict, set_fields, set_extra, set_private = map(
            slot, ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
        )
    except Exception:  # a pydantic without these slots: model_construct it is
        set_dict = None

    def inline(
        step: int, accept_lengths: list[int], draft_tokens: int, per_position: list[int], sampling: Sampling | None = None
    ) -> Acceptance:
        record = new(Acceptance)
        values = {
            "type": "acceptance",
            "step": step,
            "accept_lengths": accept_lengths,
            "draft_tokens": draft_tokens,
            "accepted_per_position": per_position,
            "greedy": None,
            "temperatures": None,
            "top_ps": None,
            "top_ks": None,
            "prompt_tokens": None,
        }
        fields = {"step", "accept_lengths", "draft_tokens", "accepted_per_position"}
        if sampling is not None:
            for key, value in zip(_SAMPLING_KEYS, sampling):
                if value is not None:
                    values[key] = value
                    fields.add(key)
        set_dict(record, values)
        set_fields(record, fields)
        set_extra(record, {})
        set_private(record, None)
        return record

    def construct(
        step: int, accept_lengths: list[int], draft_tokens: int, per_position: list[int], sampling: Sampling | None = None
    ) -> Acceptance:
        extra: dict[str, Any] = {k: v for k, v in zip(_SAMPLING_KEYS, sampling) if v is not None} if sampling is not None else {}
        return Acceptance.model_construct(
            step=step, accept_lengths=accept_lengths, draft_tokens=draft_tokens, accepted_per_position=per_position, **extra
        )

    if set_dict is None:
        return construct
    try:
        a, b = inline(3, [2, 1], 2, [1, 0]), construct(3, [2, 1], 2, [1, 0])
        c, d = (
            inline(3, [2, 1], 2, [1, 0], ([True, False], [0.0, 1.0], [1.0, 0.9], [1, 20], [4, 9])),
            construct(3, [2, 1], 2, [1, 0], ([True, False], [0.0, 1.0], [1.0, 0.9], [1, 20], [4, 9])),
        )
        slots = {"__dict__", *(name for cls in Acceptance.__mro__ for name in getattr(cls, "__slots__", ()))}
        same = (
            not Acceptance.__pydantic_post_init__
            and list(a.__dict__.items()) == list(b.__dict__.items())
            and all(getattr(a, s) == getattr(b, s) and type(getattr(a, s)) is type(getattr(b, s)) for s in slots)
            and a.model_dump_json() == b.model_dump_json()
            and a == b
            and list(c.__dict__.items()) == list(d.__dict__.items())
            and c.model_fields_set == d.model_fields_set
            and c.model_dump_json() == d.model_dump_json()
        )
    except Exception:
        same = False
    return inline if same else construct


_make_record = _record_maker()
_PLUS_ONE = bytes((i + 1) % 256 for i in range(256))  # bytes.translate table: count -> accept length


def _clamped_positions(correct: list[int], k: int) -> list[int]:
    # Counts outside 0..k are clamped, as a step can't accept fewer than none or more
    # than it proposed.
    values = [min(max(c, 0), k) for c in correct]
    per_position, at_most = [0] * k, 0
    for i in range(k):
        at_most += values.count(i)
        per_position[i] = len(values) - at_most
    return per_position


def _ints(values: list[int]) -> str:
    # A list of plain ints as JSON: its repr without the spaces (C code, no per-item Python).
    return repr(values).replace(" ", "")


def acceptance_line(
    step: int, accept_lengths: list[int], draft_tokens: int, per_position: list[int], sampling: Sampling | None = None
) -> str:
    """The JSON line of an Acceptance record, written directly (a fifth of pydantic's cost).
    Plain ints only; ``tests/integrations/sglang/test_sglang_integration.py`` holds it to ``model_dump_json``."""
    extra = ""
    if sampling is not None:
        # Rarer than the counts (a sampled batch): json's own writer, in the record's field order.
        extra = "".join(f',"{k}":{json.dumps(v, separators=(",", ":"))}' for k, v in zip(_SAMPLING_KEYS, sampling) if v is not None)
    return (
        f'{{"type":"acceptance","step":{step},"accept_lengths":{_ints(accept_lengths)},'
        f'"draft_tokens":{draft_tokens},"accepted_per_position":{_ints(per_position)}{extra}}}'
    )


def _build(st: state.State, held: list[Any], rec: Any, as_lines: bool = False) -> Acceptance | None:
    """Build, emit and window the records of ``held`` steps, in order (under the state lock).

    Returns the last record built (None with ``as_lines``: the records then go to the
    recorder as their JSON lines, and objects are built only if a collapse is checked). A
    step whose counts are not numbers is counted as an internal error and skipped; the
    others still get their records.
    """
    as_lines = as_lines and not rec.needs_call_objects
    emit, make = rec.emit, _make_record
    lines: list[str] = []
    window = st.accept_window
    check = not rec.said("acceptance_collapse")
    step = st.accept_step
    record = None
    extras = _extras(st)
    drift = extras.drift
    try:
        for item in held:
            # (counts, k, sampling); a (counts, k) pair held by an older caller has no sampling.
            correct, k = item[0], item[1]
            sampling = item[2] if len(item) > 2 else None
            try:
                # sum() is int only if every count is (or is a bool): the lists SGLang builds
                # with .tolist() pass as they are; numpy or torch scalars and floats become
                # ints, as the record holds ints (list(map(int)) on every step cost as
                # much as the rest of the counting).
                try:
                    total = sum(correct)
                    plain = type(total) is int
                except TypeError:
                    plain = False
                if not plain:
                    correct = list(map(int, correct))
                    total = sum(correct)
                n = len(correct)
                # accepted_per_position[i] = requests with more than i correct drafts: the
                # batch less those with at most i. Counted on the counts as bytes (a Python
                # loop over the batch was half of this hook's time; list.count on the list
                # is twice bytes() and bytes.count): bytes() takes ints in 0..255 only, and
                # when the counts of 0..k don't add up to the batch, some fall outside and
                # are clamped.
                fast = k < 255
                if fast:
                    try:
                        as_bytes = bytes(correct)
                    except (ValueError, TypeError):
                        fast = False
                if fast:
                    per_position, at_most = [0] * k, 0
                    for i in range(k):
                        at_most += as_bytes.count(i)
                        per_position[i] = n - at_most
                    fast = at_most + as_bytes.count(k) == n
                if fast:
                    accept_lengths = list(as_bytes.translate(_PLUS_ONE))  # every count is at most k < 255
                else:
                    per_position = _clamped_positions(correct, k)
                    accept_lengths = [c + 1 for c in correct]
                if sampling is not None and len(sampling[0]) != n:
                    sampling = None  # not this step's batch (paired by order): unknown rather than wrong
                if as_lines:
                    lines.append(acceptance_line(step, accept_lengths, k, per_position, sampling))
                    kept: Any = (step, accept_lengths, k, sampling)
                else:
                    kept = record = make(step, accept_lengths, k, per_position, sampling)
            except Exception as exc:
                state.internal_error("accept lengths", exc)
                continue
            step += 1
            if not as_lines:
                emit(record)
            # The step's mean accept length, as check_acceptance computes it (an empty step
            # counts toward the window but has no mean).
            step_mean = mean_from_sums(total + n, n)
            window.append((kept, step_mean))
            extras.positions.add_counts(step - 1, n, per_position)
            if step_mean is not None:
                st.accept_sum += step_mean
                st.accept_steps += 1
                # Drift: a window of verify steps closes every DRIFT_STEPS; checked then, said once.
                greedy_n = sum(sampling[0]) if sampling is not None else None
                prompts = sampling[4] if sampling is not None and len(sampling) > 4 else None
                prompt_sum = sum(prompts) if prompts is not None and len(prompts) == n else None
                if drift.add_sums(step - 1, total + n, n, greedy_n, prompt_sum) is not None and not drift.said:
                    found_drift = drift.check(source="sglang.acceptance")
                    if found_drift:
                        rec.emit_lines(lines)  # the steps go before the finding they show
                        lines = []
                        for found in found_drift:
                            state.emit_once(found.code, lambda found=found: found)
            # Checked once per full window of verify steps, not on every step's sliding
            # window: a collapse lasts far longer than one window.
            if len(window) >= COLLAPSE_WINDOW:
                # Later positions dead behind a healthy first: judged on the run's sums, once per window.
                if not extras.positions.said:
                    found_positions = extras.positions.check(engine="sglang", source="sglang.acceptance")
                    if found_positions:
                        rec.emit_lines(lines)  # the steps go before the finding they show
                        lines = []
                        for found in found_positions:
                            state.emit_once(found.code, lambda found=found: found)
                if check:
                    means = [m for _, m in window if m is not None]
                    # check_acceptance decides and words the finding; the window's mean, the
                    # same sum it takes, only spares calling it on the steps of a healthy
                    # draft (most of them).
                    if len(means) >= COLLAPSE_WINDOW and sum(means) / len(means) <= COLLAPSE_MEAN + 1e-9:
                        rec.emit_lines(lines)  # the steps go before the finding they show
                        lines = []
                        records = [r if isinstance(r, Acceptance) else make(r[0], r[1], r[2], [], r[3]) for r, _ in window]
                        run_mean = (st.accept_sum / st.accept_steps, st.accept_steps)
                        for found in check_acceptance(records, run_mean=run_mean, run_peak=extras.peak_batch):
                            state.emit_once(found.code, lambda found=found: found)
                        check = not rec.said("acceptance_collapse")
                # The run's largest batch, for the drain (a window where the batch empties).
                extras.peak_batch = max(
                    [extras.peak_batch, *(len(r.accept_lengths if isinstance(r, Acceptance) else r[1]) for r, _ in window)]
                )
                window.clear()
    finally:
        st.accept_step = step
        if lines:
            rec.emit_lines(lines)
    return record


def _take_held(st: state.State) -> list[Any]:
    # The list is never replaced, so the hook appends to it without a lock: what is here
    # now is taken from the front, and a step appended meanwhile (on the engine's thread)
    # lands past it and stays for the next build, in order. Callers hold the state lock,
    # so one build at a time numbers the steps.
    pending = st.accept_pending
    n = len(pending)
    held = pending[:n]
    del pending[:n]
    return held


def drain() -> None:
    """Build the records of the verify steps held by ``hold_step``, in order."""
    # One drain at a time: a read on another thread (records(), close at exit) and the
    # hook's own build would otherwise number their steps interleaved.
    with state.lock():
        st = state.STATE
        if st.accept_pending:
            rec = state.recorder()
            _build(st, _take_held(st), rec, as_lines=True)


def record_step(correct: Sequence[int], k: int) -> Acceptance:
    """Build and emit one verify step's record now (after the steps still held)."""
    with state.lock():
        st = state.STATE
        rec = state.recorder()
        if st.accept_pending:
            _build(st, _take_held(st), rec)
        record = _build(st, [(correct, k, None)], rec)
    if record is None:
        raise ValueError(f"accept counts are not numbers: {correct!r}")
    return record


def _batch_point(st: state.State, held: int) -> None:
    """The calls of :func:`hold_step` that do more than append (one in ``ACCEPT_BATCH``)."""
    if held == 1:
        # A new batch: the recorder it will reach drains it before reads and at close
        # (looked up once per batch, not on every step).
        rec = state.recorder()
        if st.accept_drain_for is not rec:
            rec.add_drain(drain)
            st.accept_drain_for = rec
            _say_if_synthetic()
    if held >= ACCEPT_BATCH:
        rec = state.recorder()
        if held < HELD_MAX and hasattr(rec, "drain_soon"):
            # The recorder's flush thread builds the batch (the drain registered above):
            # the engine's thread only appended. Once per batch, so the wake-up is rare.
            if held == ACCEPT_BATCH:
                rec.drain_soon()
            return
        lock = state.lock()
        # Too many held (the flush thread is behind): build here. A drain on another thread
        # (a read) is building the held steps right now: the engine's thread leaves it to
        # that one rather than wait; what it appends meanwhile is built by the next call.
        if lock.acquire(blocking=False):
            try:
                _build(st, _take_held(st), rec, as_lines=True)
            finally:
                lock.release()


def hold_step(correct: list[int], k: int) -> None:
    """Keep one verify step's raw counts; build records a batch at a time.

    On a live server this hook runs once per verify step between the engine's own work,
    with its code and data cold in the caches: measured there, building and writing a
    record cost 54-68 us per step, against 19 us in a loop. Appending the counts is the
    per-step cost (no lock: see :func:`_take_held`); the batch of records is built warm,
    every ``ACCEPT_BATCH`` steps, and before anything reads the recorder or closes it (a
    SIGKILL loses at most one batch). ``correct`` must be the hook's own copy.
    """
    st = state.STATE
    pending = st.accept_pending
    queue = _extras(st).sampling
    pending.append((correct, k, queue.popleft() if queue else None))  # type: ignore[arg-type]
    held = len(pending)
    if held == 1 or held >= ACCEPT_BATCH:
        _batch_point(st, held)


def after_verify_complete_cpu(result: Any, *args: Any, **kwargs: Any) -> None:
    """HookRegistry AFTER: ``(result, self, num_correct_drafts_per_req, batch_size=0)``."""
    try:
        # SGLang passes the counts by position and batch_size by name.
        correct = args[1] if len(args) > 1 else kwargs.get("num_correct_drafts_per_req")
        if correct:
            # A copy: the list is SGLang's (the adaptive controller gets it too). The
            # proposed count is read now, as an adaptive controller may change it.
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


# ------------------------------------------------------------------ sampling and drift
#
# Kept beside the engine's state (on the same object, so a reset drops them with it):
# the sampling of the batches verified and not yet counted, in order, and the drift
# windows of the run.


class _Extras:
    def __init__(self) -> None:
        self.sampling: deque[Sampling | None] = deque(maxlen=4)  # overlap scheduling keeps at most 2 in flight
        self.drift = DriftTracker()
        self.synthetic_checked = False
        self.peak_batch = 0  # the largest batch of the windows already judged
        self.positions = PositionTally()
        self.verified = 0  # verify calls seen (the prompt lengths are read on one in PROMPT_EVERY)


def _extras(st: state.State) -> _Extras:
    extras = st.__dict__.get("_spectrace_acceptance")
    if extras is None:
        extras = st.__dict__["_spectrace_acceptance"] = _Extras()
    return extras


def _say_if_synthetic() -> None:
    """SGLang's simulated acceptance makes every accept length synthetic: said once, loudly."""
    extras = _extras(state.STATE)
    if extras.synthetic_checked:
        return
    extras.synthetic_checked = True
    settings = {k: os.environ.get(k) for k in ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD")}
    for found in check_synthetic_acceptance("sglang", settings, source="sglang.acceptance"):
        state.emit_once(found.code, lambda found=found: found)


def sampling_of(batch: Any, prompts: bool = False) -> Sampling | None:
    """The batch's per-request sampling, from the host values SGLang keeps (no device read):
    its ``is_all_greedy`` flag, else each request's ``sampling_params``. Greedy is SGLang's
    own rule: top_k <= 1 (a temperature of 0 becomes top_k 1 when the request is made).
    With ``prompts``, each request's prompt length too (``origin_input_ids``)."""
    reqs = getattr(batch, "reqs", None)
    if not reqs:
        return None
    n = len(reqs)
    lengths = [len(r.origin_input_ids) for r in reqs] if prompts else None
    info = getattr(batch, "sampling_info", None)
    if info is not None and getattr(info, "is_all_greedy", None) is True:
        return ([True] * n, None, None, None, lengths)
    greedy: list[bool] = []
    temps: list[float] = []
    top_ps: list[float] = []
    top_ks: list[int] = []
    for req in reqs:
        params = req.sampling_params
        top_k = int(params.top_k)
        temp = float(params.temperature)
        is_greedy = top_k <= 1 or temp == 0.0
        greedy.append(is_greedy)
        # SGLang rewrites a temperature of 0 to 1 with top_k 1; the record says what was asked.
        temps.append(0.0 if is_greedy else temp)
        top_ps.append(float(params.top_p))
        top_ks.append(top_k)
    return (greedy, temps, top_ps, top_ks, lengths)


def before_verify(*args: Any, **kwargs: Any) -> None:
    """HookRegistry BEFORE on ``EAGLEWorkerV2.verify(self, batch, ...)``: the batch's sampling,
    paired in order with the accept counts ``on_verify_complete_cpu`` gets for it."""
    try:
        batch = args[1] if len(args) > 1 else kwargs.get("batch")
        extras = _extras(state.STATE)
        extras.verified += 1
        extras.sampling.append(sampling_of(batch, prompts=extras.verified % PROMPT_EVERY == 1))
    except Exception as exc:
        state.internal_error("verify sampling", exc)
    return None

"""Accepted drafts per position, from the host ints vLLM's scheduler already counts.

``SpecDecodingStats.observe_draft(num_draft_tokens, num_accepted_tokens)`` runs once per
request in a scheduler step, on that step's stats object (``SpecDecodingStats.new`` per
step, only when stats are logged). The hook appends one int; a step's record is built
when the next step's object arrives, and before anything reads the recorder or closes it.
An accept length is the accepted drafts plus the bonus token, as in SGLang's records.
No tensor is touched: nothing here can sync a device.
"""

from __future__ import annotations

from typing import Any

from ...checks.calls import check_acceptance
from ...checks.drift import DriftTracker
from ...records import Acceptance
from ...rules.acceptance import COLLAPSE_WINDOW, mean_accept_length
from . import state


def _build_step() -> None:
    """Turn the held step into an Acceptance record (under the state lock)."""
    st = state.STATE
    counts, k = st.accept_counts, st.accept_k
    st.accept_counts = []
    if not counts or k <= 0:
        return
    clamped = [min(max(int(c), 0), k) for c in counts]
    per_position = [sum(1 for c in clamped if c > i) for i in range(k)]
    record = Acceptance(step=st.accept_step, accept_lengths=[c + 1 for c in clamped], draft_tokens=k, accepted_per_position=per_position)
    st.accept_step += 1
    rec = state.recorder()
    rec.emit(record)
    st.accept_window.append(record)
    st.accept_sum += mean_accept_length(record.accept_lengths)
    st.accept_steps += 1
    # Drift: windows of verify steps, kept beside the engine's state (a reset drops them too).
    drift = st.__dict__.get("_spectrace_drift")
    if drift is None:
        drift = st.__dict__["_spectrace_drift"] = DriftTracker()
    if drift.add(record.step, record.accept_lengths) is not None and not drift.said:
        for found in drift.check(source="vllm.acceptance"):
            rec.once(found.code, lambda found=found: found)
    if len(st.accept_window) >= COLLAPSE_WINDOW:
        if not rec.said("acceptance_collapse"):
            for found in check_acceptance(st.accept_window, run_mean=(st.accept_sum / st.accept_steps, st.accept_steps)):
                from ...checks.vllm import SOURCE

                rec.once(found.code, lambda found=found: found.model_copy(update={"source": SOURCE}))
        st.accept_window = []


def drain() -> None:
    """Build the step still held (a read of the recorder, or its close)."""
    with state.lock():
        st = state.STATE
        if st.accept_counts:
            _build_step()
            st.accept_stats = None


def after_observe_draft(result: Any, *args: Any, **kwargs: Any) -> None:
    """``(result, self, num_draft_tokens, num_accepted_tokens)``."""
    stats = args[0] if args else None
    accepted = kwargs.get("num_accepted_tokens", args[2] if len(args) > 2 else None)
    if stats is None or accepted is None:
        return None
    with state.lock():
        st = state.STATE
        if st.accept_stats is not stats:
            if st.accept_counts:
                _build_step()
            st.accept_stats = stats
            st.accept_k = int(getattr(stats, "num_spec_tokens", 0) or 0)
            rec = state.recorder()
            if st.accept_drain_for is not rec:
                rec.add_drain(drain)
                st.accept_drain_for = rec
        st.accept_counts.append(int(accepted))
    return None


def note_speculative_config(spec: Any) -> None:
    """vLLM's speculative config, when the draft is built: synthetic rejection sampling makes
    every accept length in the trace synthetic, said once and loudly (acceptance_synthetic)."""
    try:
        from ...checks.acceptance_sampling import check_synthetic_acceptance

        method = getattr(spec, "rejection_sample_method", None)
        if method is None:
            return
        settings = {"rejection_sample_method": method, "synthetic_acceptance_rates": getattr(spec, "synthetic_acceptance_rates", None)}
        rec = state.recorder()
        for found in check_synthetic_acceptance("vllm", settings, source="vllm.acceptance"):
            rec.once(found.code, lambda found=found: found)
    except Exception as exc:
        state.internal_error("speculative config", exc)

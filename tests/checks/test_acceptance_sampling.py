"""Sampling-aware acceptance, simulated acceptance, drift, the drain and acceptance per position.

The checks first (records in, findings out), then the reference pipeline's speculative
sampling, then SGLang 0.5.23's own request objects: a real ``ScheduleBatch`` of real
``Req`` s with their ``SamplingParams``, read by the verify hook and paired with the accept
counts the worker's ``on_verify_complete_cpu`` gets. Every bug has a clean twin.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from spectrace.checks.acceptance_live import LiveAcceptance
from spectrace.checks.acceptance_sampling import check_synthetic_acceptance
from spectrace.checks.calls import COLLAPSE_WINDOW, check_acceptance
from spectrace.checks.drift import DRIFT_STEPS, DriftTracker, DriftWindow, check_acceptance_drift
from spectrace.records import RECORD_ADAPTER, Acceptance


def _steps(n: int, lengths: list[int], greedy: list[bool] | None, temps: list[float] | None = None, start: int = 0) -> list[Acceptance]:
    return [Acceptance(step=start + i, accept_lengths=list(lengths), draft_tokens=4, greedy=greedy, temperatures=temps) for i in range(n)]


# ------------------------------------------------------------------------------ the checks
def test_all_sampled_low_run_is_not_blamed_on_the_draft() -> None:
    found = check_acceptance(_steps(COLLAPSE_WINDOW, [1, 1], [False, False], [1.0, 1.0]))
    assert [f.code for f in found] == ["acceptance_sampled"]
    (one,) = found
    assert "overlap" in one.message and "temperature 1" in one.message
    assert "temperature 0" in (one.fix or "") and one.severity == "warning"
    assert one.evidence["greedy_requests"] == 0 and one.evidence["sampled_requests"] == 2 * COLLAPSE_WINDOW


def test_sampled_low_beside_healthy_greedy_says_the_wiring_is_healthy() -> None:
    # Window mean (1+1+1+1+2)/5 = 1.2: low overall, but the greedy request accepts 2... and 4.5 below.
    low = _steps(COLLAPSE_WINDOW, [1, 1, 1, 1, 2], [False, False, False, False, True], [1.0] * 4 + [0.0])
    (one,) = check_acceptance(low)
    assert one.code == "acceptance_sampled" and one.evidence["greedy_mean"] == 2.0
    assert "healthy" in one.message


def test_greedy_requests_low_too_is_still_a_collapse() -> None:
    both = _steps(COLLAPSE_WINDOW, [1, 1, 1], [False, False, True], [1.0, 1.0, 0.0])
    (one,) = check_acceptance(both)
    assert one.code == "acceptance_collapse" and one.evidence["greedy_mean"] == 1.0
    assert "greedy requests alone accept 1.00" in one.message


def test_without_sampling_the_collapse_is_as_before() -> None:
    (one,) = check_acceptance(_steps(COLLAPSE_WINDOW, [1], None))
    assert one.code == "acceptance_collapse" and "greedy_mean" not in one.evidence
    assert check_acceptance(_steps(COLLAPSE_WINDOW, [4, 5], [True, True])) == []


def test_live_window_reads_the_sampling_too() -> None:
    live = LiveAcceptance()
    found = []
    for record in _steps(COLLAPSE_WINDOW, [1], [False], [0.8]):
        found += live.observe(record)
    assert [f.code for f in found] == ["acceptance_sampled"] and found[0].source == "checks.acceptance_live"
    greedy = LiveAcceptance()
    assert [f.code for r in _steps(COLLAPSE_WINDOW, [1], [True]) for f in greedy.observe(r)] == ["acceptance_collapse"]


def test_records_without_sampling_read_and_write_as_before() -> None:
    old = '{"type":"acceptance","step":3,"accept_lengths":[2,1],"draft_tokens":4,"accepted_per_position":[1,0,0,0]}'
    record = RECORD_ADAPTER.validate_python(json.loads(old))
    assert isinstance(record, Acceptance) and record.greedy is None and record.model_dump_json() == old
    new = Acceptance(step=1, accept_lengths=[1], draft_tokens=2, greedy=[False], temperatures=[0.7], top_ps=[0.9], top_ks=[20])
    assert Acceptance.model_validate_json(new.model_dump_json()) == new


def test_synthetic_acceptance_is_said() -> None:
    (one,) = check_synthetic_acceptance("sglang", {"SGLANG_SIMULATE_ACC_LEN": "3.5"})
    assert one.code == "acceptance_synthetic" and "SYNTHETIC" in one.message
    assert check_synthetic_acceptance("sglang", {"SGLANG_SIMULATE_ACC_LEN": "-1"}) == []
    assert check_synthetic_acceptance("sglang", {}) == []
    (v,) = check_synthetic_acceptance("vllm", {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.8, 0.6]})
    assert "SYNTHETIC" in v.message
    assert check_synthetic_acceptance("vllm", {"rejection_sample_method": "standard"}) == []


def _windows(means: list[float], batches: list[float] | None = None) -> list[DriftWindow]:
    batches = batches or [8.0] * len(means)
    return [DriftWindow(i * 32, i * 32 + 31, m, int(32 * b), b) for i, (m, b) in enumerate(zip(means, batches))]


def test_drift_names_the_window_where_it_fell() -> None:
    means = [3.6, 3.5, 3.55, 3.6, 3.5, 3.6, 2.4, 2.3, 2.4, 2.35, 2.3, 2.4]
    (one,) = check_acceptance_drift(_windows(means))
    assert one.code == "acceptance_drift" and one.severity == "warning"
    assert one.evidence["fell_in_steps"] == [6 * 32, 6 * 32 + 31]
    assert "radix" in one.message and "prefix" in one.message


def test_drift_clean_twins() -> None:
    # Noise of the same size as the drop: no drift.
    assert check_acceptance_drift(_windows([3.5, 2.5, 3.6, 2.4, 3.5, 2.5, 3.4, 2.6, 3.0, 2.6, 3.1, 2.5])) == []
    # Acceptance lower at a far larger batch: not comparable, not drift.
    assert check_acceptance_drift(_windows([3.6] * 6 + [2.4] * 6, [4.0] * 6 + [32.0] * 6)) == []
    # Steady run.
    assert check_acceptance_drift(_windows([3.5] * 12)) == []
    # A dip that recovers.
    assert check_acceptance_drift(_windows([3.5] * 6 + [2.0, 3.5, 3.5, 3.5, 3.6, 3.5])) == []


def test_drift_tracker_folds_steps() -> None:
    tracker = DriftTracker()
    for step in range(12 * DRIFT_STEPS):
        tracker.add(step, [4, 4] if step < 6 * DRIFT_STEPS else [2, 2], [True, True])
    assert len(tracker.windows) == 12 and tracker.windows[0].greedy_share == 1.0
    assert [f.code for f in tracker.check()] == ["acceptance_drift"] and tracker.check() == []


# ------------------------------------------------------------------------ reference pipeline
@pytest.mark.slow
def test_reference_pipeline_at_temperature_one_is_never_a_wiring_finding() -> None:
    import spectrace
    from spectrace.eagle3.bugs import build_scenario
    from spectrace.eagle3.loop import speculate
    from spectrace.eagle3.pair import demo_prompts
    from spectrace.eagle3.watch import PipelineWatch
    from spectrace.settings import Settings

    scenario = build_scenario("healthy")
    prompt = demo_prompts()[0]
    settings = Settings(quiet=True)
    with spectrace.trace({"target": scenario.target, "draft": scenario.draft}, directory=None, settings=settings) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm, temperature=1.0)
        sampled = speculate(
            scenario.target,
            scenario.draft,
            prompt,
            k=4,
            max_new_tokens=24,
            on_step=watch.on_step,
            temperature=1.0,
            generator=torch.Generator().manual_seed(0),
        )
        findings = watch.finish()
    greedy = speculate(scenario.target, scenario.draft, prompt, k=4, max_new_tokens=24)
    print(f"healthy pair: greedy accept {greedy.mean_accept_length:.2f}, temperature 1.0 accept {sampled.mean_accept_length:.2f}")
    assert sampled.mean_accept_length < greedy.mean_accept_length
    assert all(r.greedy == [False] and r.temperatures == [1.0] for r in watch.acceptance)
    assert not [f for f in findings if f.code == "acceptance_collapse" or f.severity == "error"]


# ------------------------------------------------------------------ SGLang's own objects
@pytest.fixture(scope="module")
def sglang_installed():
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    from tests.helpers import sglang_harness as sh

    sh.setup()
    if "setproctitle" not in sys.modules:
        try:
            import setproctitle  # noqa: F401
        except ImportError:
            import types

            stub = types.ModuleType("setproctitle")
            stub.setproctitle = lambda title: None
            stub.getproctitle = lambda: ""
            sys.modules["setproctitle"] = stub
    from spectrace.integrations.sglang import state

    yield
    state.reset(_recorder())


def _recorder():
    from spectrace.recorder import Recorder
    from spectrace.settings import Settings

    return Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None)


@pytest.fixture
def sg(sglang_installed, monkeypatch):
    from spectrace.integrations.sglang import state

    monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN", raising=False)
    rec = _recorder()
    state.reset(rec)
    yield rec
    state.reset(_recorder())


def _batch(temperatures: list[float], prompt_len: int = 3):
    """A real ScheduleBatch of real Reqs, their SamplingParams normalised as the tokenizer manager does."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i, temp in enumerate(temperatures):
        params = SamplingParams(temperature=temp, top_p=0.95 if temp else 1.0)
        params.normalize(None)
        reqs.append(Req(f"r{i}", "", [1 + j % 50 for j in range(prompt_len)], params))
    return ScheduleBatch(reqs=reqs)


_WORKER = SimpleNamespace(speculative_num_steps=3)  # what the hook reads of the worker: k


def _verify(batch, correct: list[int]) -> None:
    from spectrace.integrations.sglang import acceptance

    acceptance.before_verify(_WORKER, batch)
    acceptance.after_verify_complete_cpu(None, _WORKER, correct, batch_size=len(correct))


def _records(rec) -> list[Acceptance]:
    return [r for r in rec.records() if isinstance(r, Acceptance)]


def test_sglang_batch_sampling_is_recorded(sg) -> None:
    from spectrace.integrations.sglang import acceptance

    batch = _batch([0.0, 1.0])
    print("SGLang's normalised params:", [(r.sampling_params.temperature, r.sampling_params.top_k) for r in batch.reqs])
    assert acceptance.sampling_of(batch) == ([True, False], [0.0, 1.0], [1.0, 0.95], [1, 1 << 30], None)
    assert acceptance.sampling_of(batch, prompts=True)[4] == [3, 3]
    _verify(batch, [3, 0])
    (record,) = _records(sg)
    assert record.accept_lengths == [4, 1] and record.greedy == [True, False] and record.temperatures == [0.0, 1.0]


def test_sglang_temperature_one_on_a_healthy_draft(sg) -> None:
    # Sampled requests accept ~1 while the greedy ones of the same steps accept 4: no collapse.
    for _ in range(2 * COLLAPSE_WINDOW):
        _verify(_batch([1.0, 1.0, 1.0, 1.0, 0.0]), [0, 0, 0, 0, 3])
    codes = [f.code for f in sg.findings()]
    assert "acceptance_collapse" not in codes


def test_sglang_all_sampled_low_run(sg) -> None:
    for _ in range(COLLAPSE_WINDOW):
        _verify(_batch([1.0, 1.0]), [0, 0])
    found = [f for f in sg.findings() if f.code.startswith("acceptance_")]
    assert [f.code for f in found] == ["acceptance_sampled"], [f.message for f in found]
    print(found[0].message)


def test_sglang_greedy_low_run_is_still_a_collapse(sg) -> None:
    for _ in range(COLLAPSE_WINDOW):
        _verify(_batch([0.0, 0.0]), [0, 0])
    assert [f.code for f in sg.findings() if f.code.startswith("acceptance_")] == ["acceptance_collapse"]


def test_sglang_simulated_acceptance_is_said_loudly(sg, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3.2")
    _verify(_batch([0.0]), [2])
    (one,) = [f for f in sg.findings() if f.code == "acceptance_synthetic"]
    assert "SGLANG_SIMULATE_ACC_LEN=3.2" in one.message


def test_drift_compares_windows_of_like_prompts() -> None:
    like = [DriftWindow(i * 32, i * 32 + 31, 3.5 if i < 6 else 2.0, 256, 8.0, 1.0, 200.0) for i in range(12)]
    (one,) = check_acceptance_drift(like)
    assert one.evidence["baseline_prompt_len"] == one.evidence["recent_prompt_len"] == 200.0
    longer = [w._replace(prompt_len=2000.0) if i >= 6 else w for i, w in enumerate(like)]
    assert check_acceptance_drift(longer) == []  # ten times longer prompts: another load, not drift
    tracker = DriftTracker(steps=2)
    tracker.add(0, [2, 3], [True, True], [10, 30])
    (window,) = [w for w in [tracker.add(1, [2], [True], [20])] if w is not None]
    assert window.prompt_len == 20.0 and window.requests == 3


def test_sglang_drift(sg) -> None:
    steps = 12 * DRIFT_STEPS
    for i in range(steps):
        _verify(_batch([0.0, 0.0, 0.0, 0.0]), [3, 3, 3, 2] if i < steps // 2 else [1, 1, 2, 1])
    (one,) = [f for f in sg.findings() if f.code == "acceptance_drift"]
    assert one.evidence["fell_in_steps"][0] == steps // 2
    print(one.message)


def test_sglang_drift_with_prompts_ten_times_longer_is_no_drift(sg) -> None:
    steps = 12 * DRIFT_STEPS
    for i in range(steps):
        late = i >= steps // 2
        _verify(_batch([0.0] * 4, prompt_len=40 if late else 4), [1, 1, 2, 1] if late else [3, 3, 3, 2])
    assert [f.code for f in sg.findings()] == []
    assert {p for r in _records(sg) for p in r.prompt_tokens or []} == {4, 40}  # read on one step in eight


def test_sglang_steady_run_has_no_drift(sg) -> None:
    for i in range(12 * DRIFT_STEPS):
        _verify(_batch([0.0, 0.0]), [3, 2] if i % 2 else [2, 3])
    assert [f.code for f in sg.findings()] == []


# ------------------------------------------------------------------------------ the drain
# A load's clients stop: no request arrives, and the steps that verify the stragglers
# accept little while the running batch empties. Those steps are not a collapse; the same
# steps at a steady batch are.
def _draining(batches: list[int], low: int = 1) -> list[Acceptance]:
    healthy = [Acceptance(step=i, accept_lengths=[4] * 8, draft_tokens=3) for i in range(COLLAPSE_WINDOW)]
    tail = [Acceptance(step=COLLAPSE_WINDOW + i, accept_lengths=[low] * n, draft_tokens=3) for i, n in enumerate(batches)]
    return healthy + tail


_EMPTYING = [7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1]


def test_the_window_where_the_batch_empties_is_no_collapse() -> None:
    assert check_acceptance(_draining(_EMPTYING)) == []
    live = LiveAcceptance()
    assert [f for r in _draining(_EMPTYING) for f in live.observe(r)] == [] and live.peak_batch == 8


def test_a_collapse_at_a_steady_batch_is_still_said_after_a_drain() -> None:
    steady = [3] * COLLAPSE_WINDOW  # the load came back, three requests, and accepts nothing
    (one,) = check_acceptance(_draining(_EMPTYING + steady))
    assert one.code == "acceptance_collapse"
    live = LiveAcceptance()
    assert [f.code for r in _draining(_EMPTYING + steady) for f in live.observe(r)] == ["acceptance_collapse"]
    # One request alone, all along: a steady batch of one is judged.
    (alone,) = check_acceptance([Acceptance(step=i, accept_lengths=[1], draft_tokens=3) for i in range(COLLAPSE_WINDOW)])
    assert alone.code == "acceptance_collapse"


def test_a_batch_that_shrinks_and_grows_is_judged() -> None:
    (one,) = check_acceptance(_draining([7, 5, 3, 1, 3, 5, 7, 8]))
    assert one.code == "acceptance_collapse"


def test_sglang_the_drain_of_a_load_is_no_collapse(sg) -> None:
    for _ in range(2 * COLLAPSE_WINDOW):
        _verify(_batch([0.0] * 8), [3] * 8)
    for n in _EMPTYING:
        _verify(_batch([0.0] * n), [0] * n)
    assert [f.code for f in sg.findings()] == []


def test_sglang_the_same_steps_at_a_steady_batch_collapse(sg) -> None:
    for _ in range(2 * COLLAPSE_WINDOW):
        _verify(_batch([0.0] * 8), [3] * 8)
    for _ in _EMPTYING:
        _verify(_batch([0.0] * 8), [0] * 8)
    assert [f.code for f in sg.findings()] == ["acceptance_collapse"]


# ------------------------------------------------------------------------------ per position
def test_later_positions_need_evidence_and_a_healthy_first() -> None:
    from spectrace.checks.acceptance_positions import PositionTally, check_later_positions

    few = PositionTally()
    few.add_counts(0, 20, [12, 0, 0])  # 12 accepted position 1: too few to judge position 2
    assert check_later_positions(few) == []
    weak = PositionTally()
    weak.add_counts(0, 400, [40, 0, 0])  # 10% at position 1: a weak draft, not a dead second step
    assert check_later_positions(weak) == []
    dead = PositionTally()
    dead.add_counts(0, 100, [60, 1, 0])
    (one,) = check_later_positions(dead)
    assert one.code == "later_positions_rejected" and "--enforce-eager" in (one.fix or "") and "--disable-cuda-graph" in (one.fix or "")
    assert check_later_positions(dead, engine="sglang")[0].fix.startswith("rerun with --disable-cuda-graph")
    one_token = PositionTally()
    one_token.add_counts(0, 100, [60])  # k = 1: no later position
    assert check_later_positions(one_token) == []


def test_sglang_later_positions_dead_behind_a_healthy_first(sg) -> None:
    for _ in range(2 * COLLAPSE_WINDOW):
        _verify(_batch([0.0] * 4), [1, 1, 0, 1])  # position 1 accepted by 3 of 4, never position 2
    found = sg.findings()
    assert [f.code for f in found] == ["later_positions_rejected"]
    assert found[0].evidence["engine"] == "sglang" and "--disable-cuda-graph" in (found[0].fix or "")


def test_sglang_a_draft_accepted_at_every_position_says_nothing(sg) -> None:
    for _ in range(2 * COLLAPSE_WINDOW):
        _verify(_batch([0.0] * 4), [3, 1, 0, 2])
    assert [f.code for f in sg.findings()] == []

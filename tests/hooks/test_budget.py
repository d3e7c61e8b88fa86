"""SPECTRACE_BUDGET: steps traced one in N, N measured so that tracing adds at most a share of a step."""

from __future__ import annotations

import pytest
import torch

import spectrace
from spectrace import settings as settings_mod
from spectrace.hooks.budget import BOOTSTRAP, GROWTH, MAX_INTERVAL, REPROBE, StepBudget
from spectrace.settings import BUDGET_MIN, Settings
from tests.helpers.models import tiny_llama


def drive(budget: StepBudget, steps: int, period: float, cost: float, start: float = 0.0) -> tuple[list[bool], float]:
    """Steps of ``period`` seconds from one start to the next, ``cost`` more when traced:
    the decisions, and the clock after."""
    now = start
    decided = []
    for _ in range(steps):
        traced = budget.decide(now)
        decided.append(traced)
        now += period + (cost if traced else 0.0)
    return decided, now


def gaps(decided: list[bool]) -> set[int]:
    """The distances between consecutive traced steps."""
    traced = [k for k, t in enumerate(decided) if t]
    return {j - i for i, j in zip(traced, traced[1:])}


def test_the_interval_holds_the_share_a_traced_step_adds():
    budget = StepBudget(0.03)
    # Steps of 10 ms, 3 ms more when traced: 3 / (N * 10) <= 3 % needs N = 10.
    decided, _ = drive(budget, 200, period=0.010, cost=0.003)
    assert decided[0]  # the first step is always traced
    assert decided[1 : 1 + 2 * BOOTSTRAP] == [False, True] * BOOTSTRAP  # alternating while measuring
    assert budget.interval == 10
    assert gaps(decided[100:]) == {10}  # one in ten, evenly
    assert budget.traced_steps + budget.untraced_steps == 200


def test_the_first_step_is_not_a_measure_and_the_floor_holds():
    budget = StepBudget(0.5, floor=4)
    assert budget.decide(0.0)  # a first forward that compiles for 30 s
    decided, _ = drive(budget, 100, period=0.01, cost=0.001, start=30.0)
    assert budget.interval == 4  # the cost alone would allow every step; SPECTRACE_SAMPLE=4 is the floor
    assert gaps(decided[50:]) == {4}


def test_room_for_every_step_still_leaves_one_out_now_and_then_and_follows_a_change():
    budget = StepBudget(0.5)
    decided, now = drive(budget, 10 * REPROBE, period=0.01, cost=0.001)
    assert budget.interval == 1
    assert decided[-REPROBE:].count(False) == 1  # a fresh untraced baseline, one step in REPROBE
    # The steps get cheaper while tracing costs the same: the interval follows.
    drive(budget, 400, period=0.0005, cost=0.001, start=now)
    assert budget.interval == 4  # 1 ms / (N * 0.5 ms) <= 50 %


def test_a_traced_step_as_dear_as_an_untraced_one_is_traced_one_in_a_hundred_under_one_percent():
    budget = StepBudget(0.01)
    drive(budget, 200, period=0.001, cost=0.001)  # (the interval grows 4, 16, 64, 100: GROWTH)
    assert budget.interval == 100  # 1 ms / (N * 1 ms) <= 1 %
    assert 0.0009 < budget.cost() < 0.0011 and 0.0009 < budget.period() < 0.0011


def test_the_setting_reads_a_share_or_a_percentage(capsys):
    settings_mod._bad_said.clear()
    assert Settings.from_env({"SPECTRACE_BUDGET": "3%"}).budget == 0.03
    assert Settings.from_env({"SPECTRACE_BUDGET": " 0.05 "}).budget == 0.05
    assert Settings.from_env({"SPECTRACE_BUDGET": "0"}).budget == 0.0
    assert Settings.from_env({}).budget == 0.0
    assert capsys.readouterr().err == ""
    for bad in ("3", "150%", "nan", "-1%", "lots"):
        assert Settings.from_env({"SPECTRACE_BUDGET": bad}).budget == 0.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all("SPECTRACE_BUDGET" in line and "every step traced" in line for line in err)
    assert Settings(budget=2.0).budget == 0.0


@pytest.fixture
def one_thread():
    """One torch thread, as under the suite's workers: a pool of two spinning against another
    process stretches a tiny step a hundredfold at random, and the budget measures steps."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_traced_model_under_a_budget_traces_fewer_steps_and_says_so(capsys, one_thread):
    """A real tiny Llama with statistics, whose traced steps cost more than the steps
    themselves on the CPU: under a 2 % budget most steps are left out, counted and said
    once; the traced steps are recorded as in a trace of every step."""
    model = tiny_llama(layers=4)
    inputs = [torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(i)) for i in range(120)]
    with torch.no_grad(), spectrace.trace(model, settings=Settings(budget=0.02)) as t:
        for ids in inputs:
            model(ids)
    budget = t.tracer.budget
    traced = sorted({c.step for c in t.calls()})
    assert traced[0] == 0 and len(traced) == budget.traced_steps
    assert budget.untraced_steps > len(inputs) // 2
    counters = t.recorder.counters
    assert counters.steps_untraced == budget.untraced_steps == len(inputs) - len(traced)
    assert counters.calls_seen == len(inputs) * len(t.hooked)  # every call counted, traced or not
    said = [line for line in capsys.readouterr().err.splitlines() if "SPECTRACE_BUDGET" in line]
    assert len(said) == 1 and "not covered" in said[0]
    with torch.no_grad(), spectrace.trace(model) as every:
        for step in traced[:3]:
            model(inputs[step])
    want = {(c.module, tuple(tuple(m.shape) for m in c.outputs)) for c in every.calls()}
    assert {(c.module, tuple(tuple(m.shape) for m in c.outputs)) for c in t.calls() if c.step in traced[:3]} == want
    layers = [m for c in t.calls() if ".layers." in c.module for m in c.outputs]
    assert layers and all(m.stats is not None for m in layers)  # (an embedding's output keeps none: privacy)


def pair_loop(settings: Settings, iterations: int, drafts: int) -> tuple[spectrace.Trace, dict[int, set[str]]]:
    """A loop of a target forward and ``drafts`` draft forwards (two tiny Llamas): its trace,
    and the models each recorded step's calls came from."""
    target, draft = tiny_llama(layers=2), tiny_llama(layers=1)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), spectrace.trace({"target": target, "draft": draft}, settings=settings) as t:
        for _ in range(iterations):
            target(ids)
            for _ in range(drafts):
                draft(ids)
    by_step: dict[int, set[str]] = {}
    for c in t.calls():
        by_step.setdefault(c.step, set()).add(c.module.split(".")[0])
    return t, by_step


def test_sampling_takes_whole_loop_iterations_of_a_target_and_its_draft():
    """A loop that runs a target forward and then two draft forwards: with one step in 2
    traced, counting every forward alike traced the target's forwards only (steps 0, 2, 4
    ... fall on the target every other iteration, never on a draft's first forward at an
    even interval); by iteration, every traced iteration holds the target and its drafts."""
    t, by_step = pair_loop(Settings(sample=2), 6, drafts=2)
    assert sorted(by_step) == [0, 1, 2, 6, 7, 8, 12, 13, 14]  # iterations 0, 2 and 4, whole
    assert [by_step[s] for s in (0, 1, 2)] == [{"target"}, {"draft"}, {"draft"}]
    assert t.recorder.counters.steps_untraced == 9


def test_a_budget_traces_whole_iterations_too(one_thread):
    _t, by_step = pair_loop(Settings(budget=0.02), 60, drafts=1)
    steps = sorted(by_step)
    assert len(steps) < 60  # most iterations left out
    assert all(by_step[s] == ({"target"} if s % 2 == 0 else {"draft"}) for s in steps)
    assert {s + 1 for s in steps if s % 2 == 0} == {s for s in steps if s % 2 == 1}  # each traced target with its draft


def test_what_a_traced_step_leaves_to_the_step_after_it_counts_as_its_cost():
    """A traced step 1 ms dearer that also makes the step after it 2 ms dearer (records
    written by a thread, the model's code cold again) costs the loop 3 ms: 3 / (N * 10)
    <= 3 % needs N = 10. Comparing a traced step with its neighbour alone would see 1 ms."""
    budget = StepBudget(0.03)
    now, after_traced, decided = 0.0, False, []
    for _ in range(600):
        traced = budget.decide(now)
        decided.append(traced)
        now += 0.010 + (0.001 if traced else 0.0) + (0.002 if after_traced else 0.0)
        after_traced = traced
    assert budget.interval == 10
    assert gaps(decided[400:]) == {10}


def test_spectraces_own_time_is_a_floor_under_a_cost_the_periods_cannot_resolve():
    """On a noisy host the periods' medians may differ by nothing: the time spectrace spent
    in each traced step (handed in by the engine) still holds the interval up."""
    budget = StepBudget(0.03)
    now = 0.0
    for k in range(200):
        traced = budget.decide(now)
        if traced:
            budget.spent(0.002)  # 2 ms of its own, which the loop's periods do not show
        now += 0.010 + (0.004 if k % 2 else 0.0)  # periods alternating 10 and 14 ms whatever is traced
    assert budget.cost() >= 0.002
    assert budget.interval >= 6  # 2 / (N * ~10-14) <= 3 %


def test_shapes_only_leaves_out_the_steps_of_modules_on_torchs_hooks_too():
    """lm_head is on torch's hooks (nn.Linear has many untraced instances); in shapes-only
    mode its post-hook used to keep a call of a step left out, recording it anyway."""
    model = tiny_llama(layers=2)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    for modules in (["lm_head"], ["model.layers.*"]):
        with torch.no_grad(), spectrace.trace(model, modules=modules, stats="off", settings=Settings(sample=4)) as t:
            for _ in range(8):
                model(ids)
        assert sorted({c.step for c in t.calls()}) == [0, 4], modules
        counters = t.recorder.counters
        assert counters.steps + counters.steps_untraced == 8 and counters.steps_untraced == 6


@pytest.mark.parametrize("warm_ups", [1, 2])
def test_a_draft_that_runs_first_does_not_lead_the_loop(warm_ups):
    """A draft run before the loop (a warm-up) used to lead for good: a target-only loop
    after it was traced at every step or never; with a target beside it the traced pairs
    were a draft and the next iteration's target."""
    target, draft = tiny_llama(layers=2), tiny_llama(layers=1)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), spectrace.trace({"target": target, "draft": draft}, settings=Settings(sample=4)) as t:
        for _ in range(warm_ups):
            draft(ids)
        for _ in range(40):
            target(ids)
    assert len({c.step for c in t.calls() if c.module.startswith("target.")}) == 10
    with torch.no_grad(), spectrace.trace({"target": target, "draft": draft}, settings=Settings(sample=2)) as t:
        for _ in range(warm_ups):
            draft(ids)
        for _ in range(12):
            target(ids)
            draft(ids)
    by_step: dict[int, set[str]] = {}
    for c in t.calls():
        by_step.setdefault(c.step, set()).add(c.module.split(".")[0])
    loop = {s: m for s, m in by_step.items() if s >= warm_ups}  # target at warm_ups + 2k, its draft right after
    traced_targets = [s for s, m in loop.items() if m == {"target"}]
    assert len(traced_targets) == 6 and all(loop.get(s + 1) == {"draft"} for s in traced_targets)
    assert all((s - warm_ups) % 2 == 0 for s in traced_targets)


def test_a_lead_that_stops_running_gives_way():
    """Two models neither of which is known as a draft: the first to run leads, and gives
    way once it has not run for LEAD_LAPSE forwards of the other."""
    from spectrace.hooks.engine import LEAD_LAPSE

    first, second = tiny_llama(layers=1), tiny_llama(layers=1)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), spectrace.trace([first, second], settings=Settings(sample=4)) as t:
        first(ids)
        for _ in range(LEAD_LAPSE + 40):
            second(ids)
    late = sorted(s for s in {c.step for c in t.calls()} if s > LEAD_LAPSE + 1)
    assert len(late) == 10 and {b - a for a, b in zip(late, late[1:])} == {4}


def test_a_root_hooked_under_another_keeps_its_inputs_in_traced_steps():
    """A root that is also a hooked module of another root is called alone: its pre-hook
    runs before its own step is decided, and used to take the decision of the step before
    (a traced step's record without inputs)."""

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny_llama(layers=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).logits

    outer = Outer()
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    for stats in ("basic", "full", "off"):
        roots = {"draft": outer.inner, "target": outer}
        with torch.no_grad(), spectrace.trace(roots, modules=["inner", "*lm_head"], stats=stats, settings=Settings(sample=2)) as t:
            for _ in range(6):
                outer.inner(ids)
        inner = [(c.step, len(c.inputs)) for c in t.calls() if c.module.endswith("inner")]
        assert inner == [(0, 1), (2, 1), (4, 1)], (stats, inner)
        assert t.recorder.counters.steps_untraced == 3


def test_a_step_marked_again_keeps_its_decision_and_is_counted_once():
    """A loop that marks the same step before its target and before its draft: one decision
    per marked step (the budget measures whole steps), counted once."""
    target, draft = tiny_llama(layers=2), tiny_llama(layers=1)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    for settings in (Settings(sample=2), Settings(budget=0.5)):
        with torch.no_grad(), spectrace.trace({"target": target, "draft": draft}, settings=settings) as t:
            for n in range(40):
                t.set_step(n)
                target(ids)
                t.set_step(n)
                draft(ids)
        by_step: dict[int, set[str]] = {}
        for c in t.calls():
            by_step.setdefault(c.step, set()).add(c.module.split(".")[0])
        assert all(m == {"target", "draft"} for m in by_step.values())
        assert t.recorder.counters.steps_untraced == 40 - len(by_step)
        if settings.budget:
            assert t.tracer.budget.traced_steps + t.tracer.budget.untraced_steps == 40


def test_a_share_too_small_to_compute_is_refused_and_never_raises_into_the_model(capsys):
    settings_mod._bad_said.clear()
    assert Settings.from_env({"SPECTRACE_BUDGET": "1e-320"}).budget == 0.0
    assert "SPECTRACE_BUDGET" in capsys.readouterr().err
    with pytest.raises(ValueError):
        StepBudget(1e-320)
    budget = StepBudget(BUDGET_MIN)
    decided, _ = drive(budget, 100, period=1e-300, cost=1.0)  # a ratio beyond any interval
    assert budget.interval <= MAX_INTERVAL and decided[0]


def test_a_cold_start_raises_the_interval_step_by_step_not_for_thousands_of_steps():
    """Two traced steps a second slower once (lazy set-up) among the first measured, then
    3 ms on 10 ms steps at 3 %: the interval grows at most GROWTH times an estimate, and is
    back at 10 within a few dozen steps (the medians alone held it at 3344)."""
    budget = StepBudget(0.03)
    now, traced_count, decided = 0.0, 0, []
    for _ in range(400):
        traced = budget.decide(now)
        decided.append(traced)
        extra = 0.0
        if traced:
            traced_count += 1
            extra = 0.003 + (1.0 if traced_count in (2, 3) else 0.0)
        now += 0.010 + extra
    assert max(gaps(decided)) <= GROWTH * 10
    assert budget.interval == 10 and gaps(decided[200:]) == {10}

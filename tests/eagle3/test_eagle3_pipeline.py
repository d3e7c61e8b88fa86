"""The EAGLE-3 reference pipeline on the shipped trained tiny pair (real models, no mocks)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from spectrace.eagle3 import bugs, pair
from spectrace.eagle3.draft import DraftConfig, Eagle3Draft
from spectrace.eagle3.loop import speculate
from spectrace.eagle3.target import Eagle3Target, tiny_deepseek_v3, tiny_llama
from spectrace.rules.conventions import engine_boundaries

K = 4


@pytest.fixture(scope="module")
def scenarios() -> dict[str, bugs.Scenario]:
    torch.manual_seed(0)
    return {name: bugs.build_scenario(name) for name in bugs.BUGS}


@pytest.fixture(scope="module")
def healthy_accept(scenarios: dict[str, bugs.Scenario]) -> float:
    return scenarios["healthy"].run(k=K)


# ----------------------------------------------------------------------------- target capture


def test_capture_follows_engine_convention_and_concats_those_layers() -> None:
    target = Eagle3Target(pair.load_target_model(), [-1, 1, 3], convention="sglang_llama")
    assert target.capture == engine_boundaries([-1, 1, 3], "sglang_llama", 6)
    assert target.capture.boundaries == [0, 2, 4]
    seen: list[int] = []
    target.aux_concat.register_forward_hook(lambda mod, args, out: seen.append(len(args)))
    ids = torch.tensor(pair.demo_prompts()[0])
    with torch.no_grad():
        out = target(ids)
        hs = target.model.model(ids[None], output_hidden_states=True).hidden_states
    assert seen == [3]
    assert out.hidden_states.shape == (ids.numel(), 3 * target.hidden_size)
    torch.testing.assert_close(out.hidden_states, torch.cat([hs[0][0], hs[2][0], hs[4][0]], dim=-1))


def test_capture_disabled_falls_back_to_final_normed_state_silently() -> None:
    target = Eagle3Target(pair.load_target_model(), [-1, 1, 3], aux_enabled=False)
    calls: list[int] = []
    target.aux_concat.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor(pair.demo_prompts()[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            out = target(ids)
            normed = target.model.model(ids[None]).last_hidden_state[0]
    assert calls == []
    torch.testing.assert_close(out.hidden_states, normed)


def test_ids_past_the_end_are_dropped_to_a_short_capture() -> None:
    target = Eagle3Target(pair.load_target_model(), [1, 5, 6], convention="sglang_llama")
    assert target.capture.boundaries == [2]
    assert target.capture.dropped_ids == [5, 6]
    assert target.capture.short
    with torch.no_grad():
        assert target(torch.tensor([1, 2, 3])).hidden_states.shape == (3, 64)


def test_trainer_conventions_name_the_same_layers() -> None:
    specforge = Eagle3Target(tiny_llama(), [-1, 1, 3], convention="specforge")
    speculators = Eagle3Target(tiny_llama(), [0, 2, 4], convention="speculators")
    assert specforge.capture.boundaries == speculators.capture.boundaries == [0, 2, 4]


def test_deepseek_target_capture_rule() -> None:
    target = Eagle3Target(tiny_deepseek_v3(), [1, 2, 3], convention="sglang_deepseek")
    assert target.capture.boundaries == [2, 3, 4]  # +1 because the first id is 1
    with torch.no_grad():
        assert target(torch.tensor([3, 4, 5, 6])).hidden_states.shape == (4, 3 * target.hidden_size)
    broken = Eagle3Target(tiny_deepseek_v3(), [-1, 2, 3], convention="sglang_deepseek")
    with pytest.raises(RuntimeError, match="captured 2 of 3"):
        broken(torch.tensor([3, 4]))


# ----------------------------------------------------------------------------- draft


def _fc_calls(draft: Eagle3Draft, width: int) -> int:
    calls: list[int] = []
    handle = draft.model.fc.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        out = draft(torch.tensor([1, 2, 3]), torch.randn(3, width))
    handle.remove()
    assert torch.isfinite(out.logits).all()
    return len(calls)


def test_fc_runs_only_when_width_differs_from_hidden() -> None:
    draft = Eagle3Draft(DraftConfig(target_hidden_size=64))
    assert _fc_calls(draft, 3 * 64) == 1
    assert _fc_calls(draft, 64) == 0  # SGLang's silent bypass


def test_load_weights_drops_unknown_names_silently(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    tensors, _ = pair.load_draft_checkpoint()
    draft = Eagle3Draft(DraftConfig.from_dict(pair.load_draft_checkpoint()[1]))
    offered = pair.as_loadable(tensors) + [("model.extra_head.weight", torch.zeros(4, 4))]
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings():
        warnings.simplefilter("error")
        draft.load_weights(offered)
    assert caplog.records == []
    assert capsys.readouterr() == ("", "")
    assert draft.load_report.ignored == ["model.extra_head.weight"]
    # midlayer.* maps to model.layers.0.*, q/k/v stack into qkv_proj, d2t becomes hot_token_id.
    layer = draft.model.layers[0]
    q = tensors["midlayer.self_attn.q_proj.weight"].float()
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight[: q.shape[0]], q)
    torch.testing.assert_close(draft.hot_token_id, tensors["d2t"] + torch.arange(tensors["d2t"].numel()))
    assert "t2d" not in draft.load_report.written


def test_older_loader_drops_layers0_while_0523_maps_it() -> None:
    tensors, config = pair.load_draft_checkpoint()
    speculators = pair.speculators_checkpoint(tensors)
    older = Eagle3Draft(DraftConfig.from_dict(config), engine_version="older")
    older.load_weights(pair.as_loadable(speculators))
    assert sorted(older.load_report.ignored) == sorted(n for n in speculators if n.startswith("layers.0."))
    assert any(n.startswith("model.midlayer.") for n in older.engine_param_names())
    new = Eagle3Draft(DraftConfig.from_dict(config), engine_version="0.5.23")
    new.load_weights(pair.as_loadable(speculators))
    assert new.load_report.ignored == []


def test_norm_before_residual_is_ignored_by_the_engine_only() -> None:
    config = DraftConfig(norm_before_residual=True)
    assert not Eagle3Draft(config).model.decoder_layer.norm_before_residual
    assert Eagle3Draft(config, honor_norm_before_residual=True).model.decoder_layer.norm_before_residual


def test_shipped_config_records_what_the_draft_was_trained_on() -> None:
    _, config = pair.load_draft_checkpoint()
    assert config["trained_aux_boundaries"] == [0, 2, 4]
    assert config["trainer_convention"] == "specforge"
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 1, 3]
    assert config["draft_vocab_size"] < config["vocab_size"]


# ----------------------------------------------------------------------------- speculation


def test_speculation_is_lossless_and_counts_steps(scenarios: dict[str, bugs.Scenario]) -> None:
    s = scenarios["healthy"]
    prompt = pair.demo_prompts()[2]
    steps: list[tuple[int, int, list[bool]]] = []
    result = speculate(s.target, s.draft, prompt, k=K, max_new_tokens=24, on_step=lambda *a: steps.append(a))
    assert result.generated == s.target.greedy(torch.tensor(prompt), 24)
    assert len(steps) == result.steps == len(result.accept_lengths)
    assert all(1 <= a <= K + 1 for a in result.accept_lengths)
    assert sum(result.accepted_per_position) == sum(a - 1 for a in result.accept_lengths)
    assert [sum(mask) + 1 for _, _, mask in steps] == result.accept_lengths


def test_healthy_pair_accepts_at_least_two(healthy_accept: float) -> None:
    assert healthy_accept >= 2.0


@pytest.mark.parametrize("name", ["fc_bypass", "embedding_vs_layer"])
def test_wiring_bugs_lower_acceptance_clearly(scenarios: dict[str, bugs.Scenario], healthy_accept: float, name: str) -> None:
    broken = scenarios[name].run(k=K)
    assert broken < 1.6
    assert healthy_accept - broken >= 1.0


def test_every_scenario_builds_and_runs(scenarios: dict[str, bugs.Scenario]) -> None:
    prompts = pair.demo_prompts()[:2]
    for name, s in scenarios.items():
        accept = s.run(prompts, k=K, max_new_tokens=10)
        assert 1.0 <= accept <= K + 1, name
        assert s.algorithm == ("EAGLE" if name == "eagle_algorithm" else "EAGLE3")
        assert s.trained_boundaries == [0, 2, 4]
        assert set(s.draft.load_report.offered) == set(s.checkpoint)
    assert not scenarios["fc_bypass"].target.aux_enabled
    assert not scenarios["eagle_algorithm"].target.aux_enabled
    assert scenarios["embedding_vs_layer"].target.capture.boundaries == [2, 4, 5]
    assert scenarios["off_by_one"].target.capture.boundaries == [1, 3, 5]
    assert scenarios["off_by_one"].trainer_convention == "speculators"
    assert scenarios["capture_id_past_end"].target.capture.boundaries == [2]
    assert scenarios["layers0_names"].draft.load_report.ignored
    assert "lm_head.weight" not in scenarios["lm_head_missing"].checkpoint
    assert scenarios["d2t_missing"].draft.hot_token_id is None
    assert scenarios["norm_before_residual"].draft_config["norm_before_residual"] is True
    assert scenarios["healthy"].draft.load_report.ignored == []


def test_the_pair_runs_on_one_thread_and_gives_the_count_back() -> None:
    import torch

    from spectrace.eagle3 import build_scenario, demo_prompts, speculate

    pair = build_scenario("healthy")
    seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        speculate(
            pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=6, on_step=lambda *_: seen.append(torch.get_num_threads())
        )
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

"""A missing parameter must be reported whatever its memory held before the load.

On a GPU, SGLang's parameters start as uninitialised memory (often NaN). A float
checksum reads NaN != NaN as "changed" and once hid a missing ``lm_head.weight``
(accept length 1.06, no ``weights_missing``). These tests fill every parameter with
NaN, random bytes (NaNs and infs among them) or zeros before the load, then run the
real loaders: SGLang 0.5.23's ``LlamaForCausalLMEagle3.load_weights`` through
spectrace's hook, and the reference draft through ``PipelineWatch.load``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from spectrace.hooks.weights import _fingerprint, changed, observe_load

FILLS = ["nan", "garbage", "zeros"]


def fill_(model: nn.Module, how: str, seed: int = 0) -> None:
    """What a parameter may hold before any loader ran: NaN, random bytes or zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if how == "zeros":
                p.data.zero_()
            elif how == "nan" and p.is_floating_point():
                p.data.fill_(math.nan)
            else:  # random bytes: every bit pattern, NaNs and infs included
                raw = p.data.view(-1).view(torch.uint8)
                raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
                if p.is_floating_point() and p.numel() >= 3:
                    p.data.view(-1)[:3] = torch.tensor([math.nan, math.inf, -math.inf])


# ------------------------------------------------------------------ the change test itself
def _nan_param(n: int) -> nn.Parameter:
    return nn.Parameter(torch.full((n,), math.nan))


@pytest.mark.parametrize("budget", [None, [1 << 20]], ids=["checksum", "copy"])
@pytest.mark.parametrize("n", [8, 40_000], ids=["small", "large"])
def test_nan_before_and_after_with_the_same_bits_is_unchanged(budget, n):
    p = _nan_param(n)
    before = _fingerprint(p, budget)
    assert before.comparable
    assert not changed(before, p)
    p.data.copy_(torch.full((n,), math.nan))  # written over with the very same bits
    assert not changed(before, p)


@pytest.mark.parametrize("budget", [None, [1 << 20]], ids=["checksum", "copy"])
@pytest.mark.parametrize("n", [8, 40_000], ids=["small", "large"])
def test_nan_before_other_bits_after_is_changed(budget, n):
    p = _nan_param(n)
    before = _fingerprint(p, budget)
    p.data.view(torch.int32)[n // 2] = 0x7FC00001  # still a NaN, another payload
    assert math.isnan(p[n // 2].item())
    assert changed(before, p)


@pytest.mark.parametrize("budget", [None, [1 << 20]], ids=["checksum", "copy"])
def test_bit_changes_float_equality_misses(budget):
    p = nn.Parameter(torch.zeros(64))
    before = _fingerprint(p, budget)
    p.data[3] = -0.0  # == 0.0 as a float, another bit pattern
    assert changed(before, p)
    q = nn.Parameter(torch.arange(50_000, dtype=torch.float32))
    before = _fingerprint(q, budget)
    q.data[[10, 20]] = q.data[[20, 10]]  # same float sum, elements swapped
    assert changed(before, q)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int64, torch.bool]
)
def test_every_dtype_compares_by_bits(dtype):
    t = torch.zeros(300, dtype=torch.float32).to(dtype)
    for budget in (None, [1 << 20]):
        before = _fingerprint(t, budget)
        assert before.comparable and not changed(before, t)
        t2 = t.clone()
        t2.view(-1).view(torch.uint8)[5] = 1
        t.copy_(t2)
        assert changed(before, t)
        t.zero_()


def test_empty_non_contiguous_and_replaced_tensors():
    empty = nn.Parameter(torch.empty(0, 4))
    before = _fingerprint(empty)
    assert not changed(before, empty)

    p = nn.Parameter(torch.full((6, 70_000), math.nan).t())  # non-contiguous, checksum path
    assert not p.is_contiguous()
    before = _fingerprint(p)
    assert not changed(before, p)
    p.data[5, 1] = 1.0
    assert changed(before, p)

    q = nn.Parameter(torch.full((4,), math.nan))
    before = _fingerprint(q)
    assert changed(before, nn.Parameter(q.data))  # another Parameter object: re-assigned
    q.data = torch.full((4,), math.nan)  # same object, new storage
    assert changed(before, q)


class _Tiny(nn.Module):
    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False, device=device)
        self.b = nn.Linear(4, 4, bias=False, device=device)
        self.c = nn.Linear(4, 4, bias=False, device=device)


@pytest.mark.parametrize("how", FILLS)
def test_loaders_that_bypass_weight_loader_count_as_written(how):
    model = _Tiny()
    fill_(model, how)

    def load(items):
        for name, tensor in items:
            if name == "a.weight":
                model.a.weight.data.copy_(tensor)  # a direct copy, no weight_loader call
            elif name == "b.weight":
                model.b.weight = nn.Parameter(tensor.clone())  # a re-assigned Parameter
            # c.weight: offered, never loaded

    ckpt = {k: torch.randn(4, 4) for k in ("a.weight", "b.weight", "c.weight")}
    _, record = observe_load(model, load, ckpt.items(), module="tiny")
    assert record.written == ["a.weight", "b.weight"]
    assert record.missing == ["c.weight"]


@pytest.mark.parametrize("how", FILLS)
def test_loader_calls_count_even_when_the_bits_stay(how):
    model = _Tiny()
    fill_(model, how)
    same = {n: p.detach().clone() for n, p in model.named_parameters()}

    def load(items):
        params = dict(model.named_parameters())
        for name, tensor in items:
            params[name].weight_loader(params[name], tensor)

    _, record = observe_load(model, load, [("a.weight", same["a.weight"])], module="tiny")
    assert record.written == ["a.weight"] and record.missing == ["b.weight", "c.weight"]


def test_meta_parameters_rely_on_loader_calls_only():
    model = _Tiny(device="meta")

    def load(items):
        params = dict(model.named_parameters())
        for name, tensor in items:
            if name == "a.weight":
                params[name].weight_loader(params[name], tensor)
        model.b.weight.data = torch.empty(4, 4, device="meta")  # no bits to compare: not a write

    _, record = observe_load(model, load, [("a.weight", torch.empty(4, 4, device="meta"))], module="tiny")
    assert record.written == ["a.weight"]
    assert record.missing == ["b.weight", "c.weight"]
    assert not hasattr(model.a.weight, "weight_loader")  # the wrapper is gone again


# ------------------------------------------------------------------ the real SGLang draft
sglang_only = pytest.mark.sglang


def _sglang():
    pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
    pytest.importorskip("transformers")
    from tests.integrations.sglang import test_sglang_integration as si

    return si


try:  # the fixtures and checkpoint helpers of the SGLang integration tests
    import sglang  # noqa: F401

    from tests.integrations.sglang.test_sglang_integration import installed  # noqa: F401  (a pytest fixture; rec: this folder's conftest)
except ImportError:  # pragma: no cover - skipped below
    pass


def _sglang_draft(si, how: str):
    from tests.helpers import sglang_harness as sh

    draft = sh.build_sglang_eagle3_draft(sh.draft_config(), seed=None)
    fill_(draft, how)
    return draft


def _weights_record(si, recorder):
    from spectrace.records import Weights

    (record,) = si._of(recorder, Weights)
    return record


@sglang_only
@pytest.mark.parametrize("how", FILLS)
def test_sglang_missing_lm_head_is_reported_under_any_fill(rec, how):
    si = _sglang()
    draft = _sglang_draft(si, how)
    ckpt = {k: v for k, v in si._full_draft_weights(draft).items() if k != "lm_head.weight"}
    draft.load_weights(list(ckpt.items()))
    record = _weights_record(si, rec)
    assert record.missing == ["lm_head.weight"]
    assert "lm_head.weight" not in record.written
    assert "model.embed_tokens.weight" not in record.missing  # SGLang gives the draft the target's
    assert "model.embed_tokens.weight" not in record.written  # ... and nothing wrote it
    (missing,) = [f for f in rec.findings() if f.code == "weights_missing"]
    assert missing.evidence["missing"] == ["lm_head.weight"]
    assert "draft_vocab_size" in missing.fix and "load_lm_head_from_target" in missing.fix
    assert [c for c in si._codes(rec) if c.startswith("weights_")] == ["weights_missing"]


@sglang_only
@pytest.mark.parametrize("how", FILLS)
def test_sglang_full_checkpoint_is_clean_under_any_fill(rec, how):
    si = _sglang()
    draft = _sglang_draft(si, how)
    draft.load_weights(list(si._full_draft_weights(draft).items()))
    record = _weights_record(si, rec)
    params = {n for n, _ in draft.named_parameters()}
    assert record.missing == [] and record.ignored == []
    assert set(record.written) == (params - {"model.embed_tokens.weight"}) | {"hot_token_id"}
    assert [c for c in si._codes(rec) if c.startswith("weights_")] == []


@sglang_only
@pytest.mark.parametrize("how", FILLS)
def test_sglang_missing_d2t_is_reported_under_any_fill(rec, how):
    si = _sglang()
    draft = _sglang_draft(si, how)
    ckpt = {k: v for k, v in si._full_draft_weights(draft).items() if k != "d2t"}
    draft.load_weights(list(ckpt.items()))
    record = _weights_record(si, rec)
    assert record.missing == ["d2t"]
    (missing,) = [f for f in rec.findings() if f.code == "weights_missing"]
    assert missing.evidence["missing"] == ["d2t"] and "d2t" in missing.fix


@sglang_only
def test_sglang_missing_lm_head_and_d2t_fix_names_both(rec):
    si = _sglang()
    draft = _sglang_draft(si, "nan")
    ckpt = {k: v for k, v in si._full_draft_weights(draft).items() if k not in ("d2t", "lm_head.weight")}
    draft.load_weights(list(ckpt.items()))
    (missing,) = [f for f in rec.findings() if f.code == "weights_missing"]
    assert missing.evidence["missing"] == ["lm_head.weight", "d2t"]
    assert "lm_head.weight" in missing.fix and "d2t" in missing.fix


# ------------------------------------------------------------------ the reference draft
def _reference_load(scenario_name: str, how: str):
    from spectrace import api
    from spectrace.eagle3.bugs import build_scenario
    from spectrace.eagle3.watch import PipelineWatch
    from spectrace.records import Weights
    from spectrace.settings import Settings

    scenario = build_scenario(scenario_name, load=False)
    fill_(scenario.draft, how)
    with api.trace({"target": scenario.target, "draft": scenario.draft}, profile="eagle3", settings=Settings(quiet=True)) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm)
        watch.load(scenario.checkpoint)
        records = t.recorder.records()
        findings = t.recorder.findings()
    (record,) = [r for r in records if isinstance(r, Weights)]
    return scenario.draft, record, [f for f in findings if f.code.startswith("weights_")]


@pytest.mark.parametrize("how", FILLS)
def test_reference_draft_missing_lm_head_is_reported_under_any_fill(no_spectrace_env, how):
    _, record, found = _reference_load("lm_head_missing", how)
    assert record.missing == ["lm_head.weight"]
    assert "model.embed_tokens.weight" not in record.missing + record.written
    assert [f.code for f in found] == ["weights_missing"]
    assert found[0].evidence["missing"] == ["lm_head.weight"]


@pytest.mark.parametrize("how", FILLS)
def test_reference_draft_full_checkpoint_is_clean_under_any_fill(no_spectrace_env, how):
    draft, record, found = _reference_load("healthy", how)
    assert record.missing == [] and record.ignored == [] and found == []
    params = {n for n, _ in draft.named_parameters()}
    assert set(record.written) == (params - {"model.embed_tokens.weight"}) | {"hot_token_id"}

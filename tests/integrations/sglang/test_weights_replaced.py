"""Weights replaced after load, and the engine's vocabulary map, on SGLang 0.5.23's own objects.

A draft config with ``"draft_vocab_size": null`` makes SGLang's ``LlamaForCausalLMEagle3``
set ``load_lm_head_from_target``; ``EAGLEWorkerV2.init_lm_head`` then calls
``set_embed_and_head`` with the target's head, after the draft's trained ``lm_head`` was
loaded. The bug is first shown on the engine's objects (the head before and after the
worker's ``init_lm_head`` step), then spectrace names it at the draft's first forward.
The clean twin (``draft_vocab_size`` set) keeps its head and says nothing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.checks.replaced import ReplacedWeight, check_replaced_weights
from spectrace.integrations.sglang import weights as st_weights
from tests.helpers import sglang_harness as sh
from tests.helpers.sglang_harness import DRAFT_VOCAB, VOCAB

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def installed():
    yield from sh.installed("sglang.srt.models.llama", "sglang.srt.models.llama_eagle3", proctitle=True)


def _checkpoint(draft, rows: int, d2t: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A trained draft's tensors under SpecForge's names, its own lm_head included."""
    out = sh.checkpoint(draft, seed=7, lm_head_rows=rows)
    if d2t is not None:
        out["d2t"] = d2t
    return out


def _init_lm_head(draft, target) -> None:
    """The EAGLE-3 branch of SGLang 0.5.23's ``EAGLEWorkerV2.init_lm_head``, step for step, on the
    engine's own functions: the worker's module imports the scheduler chain (uvicorn and more,
    absent on this CPU build), so its branch is written out here, calling what it calls."""
    from sglang.srt.speculative.pp_draft_embedding import resolve_target_embed_and_head

    embed, head = resolve_target_embed_and_head(target, draft_model=draft)
    if getattr(draft, "load_lm_head_from_target", False):
        draft.set_embed_and_head(embed, head)
    else:
        draft.set_embed(embed)


def _pair(draft_vocab: int | None):
    target = sh.build_sglang_llama_target(sh.tiny_llama_config(), layer_ids=[0, 1, 2])
    draft = sh.build_sglang_eagle3_draft(sh.draft_config(draft_vocab_size=draft_vocab))
    rows = draft_vocab or VOCAB
    d2t = torch.arange(DRAFT_VOCAB) * 3 if draft_vocab else None  # target ids 4i, inside the vocabulary
    ckpt = _checkpoint(draft, rows, d2t)
    draft.load_weights(list(ckpt.items()))
    return target, draft, ckpt


@pytest.mark.parametrize("bug", [True, False])
def test_trained_head_replaced_by_the_worker(rec, bug: bool) -> None:
    target, draft, ckpt = _pair(None if bug else DRAFT_VOCAB)
    trained = ckpt["lm_head.weight"]
    before = draft.lm_head.weight.detach().clone()
    assert torch.equal(before[: trained.shape[0]], trained)  # the load wrote the trained head
    _init_lm_head(draft, target)
    after = draft.lm_head.weight
    print(
        f"draft_vocab_size={'null' if bug else DRAFT_VOCAB}: load_lm_head_from_target={draft.load_lm_head_from_target}; "
        f"lm_head[0,:3] after load {before[0, :3].tolist()}, after init_lm_head {after[0, :3].tolist()}; "
        f"shares the target's storage: {after.data_ptr() == target.lm_head.weight.data_ptr()}"
    )
    # Reproduction on the engine's objects: the worker's sharing step swaps in the target's head.
    assert (after is target.lm_head.weight) is bug
    assert torch.equal(after[: trained.shape[0]], trained) is not bug

    ids = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(1))
    sh.run_draft(draft, ids, sh.run_target(target, ids).hidden_states)
    found = [f for f in rec.findings() if f.code == "weights_replaced_after_load"]
    if not bug:
        assert found == []
        assert [f.code for f in rec.findings() if f.severity == "error"] == []
        return
    (one,) = found
    print(one.message, "| fix:", one.fix)
    assert one.severity == "error" and one.evidence["parameters"] == ["lm_head.weight"]
    assert one.evidence["how"] == {"lm_head.weight": "replaced"} and one.evidence["moment"] == "first forward"
    assert "set_embed_and_head" in one.message and '"draft_vocab_size": null' in one.message
    assert f'"draft_vocab_size": {VOCAB}' in one.fix
    # Said once: later forwards compare nothing more.
    sh.run_draft(draft, ids, sh.run_target(target, ids).hidden_states)
    assert len([f for f in rec.findings() if f.code == "weights_replaced_after_load"]) == 1


def test_shared_embedding_the_checkpoint_lacked_says_nothing(rec) -> None:
    # The usual case: the checkpoint has no embed_tokens, set_embed gives the target's.
    target, draft, _ = _pair(DRAFT_VOCAB)
    _init_lm_head(draft, target)
    assert draft.model.embed_tokens.weight is target.model.embed_tokens.weight
    st_weights.check_replaced_now(draft)
    assert [f for f in rec.findings() if f.code == "weights_replaced_after_load"] == []


def test_engine_hot_map_checked_at_load(rec) -> None:
    # d2t = arange while t2d holds the real hot set: SGLang builds hot_token_id = 2i and says nothing.
    draft = sh.build_sglang_eagle3_draft(sh.draft_config(draft_vocab_size=DRAFT_VOCAB))
    ckpt = _checkpoint(draft, DRAFT_VOCAB, torch.arange(DRAFT_VOCAB))
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[torch.arange(DRAFT_VOCAB) * 4] = True  # the real hot set: target ids 4i
    ckpt["t2d"] = t2d
    draft.load_weights(list(ckpt.items()))
    hot = draft.hot_token_id.tolist()
    print("SGLang hot_token_id from d2t = arange:", hot[:6], "...")
    assert hot[:4] == [0, 2, 4, 6]
    (one,) = [f for f in rec.findings() if f.code == "vocab_map_invalid"]
    assert one.evidence.get("arange_default") is True


def test_engine_hot_map_clean_twin(rec) -> None:
    draft = sh.build_sglang_eagle3_draft(sh.draft_config(draft_vocab_size=DRAFT_VOCAB))
    ckpt = _checkpoint(draft, DRAFT_VOCAB, torch.arange(DRAFT_VOCAB) * 3)  # target ids 4i: rising, inside 128
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[torch.arange(DRAFT_VOCAB) * 4] = True
    ckpt["t2d"] = t2d
    draft.load_weights(list(ckpt.items()))
    assert [f for f in rec.findings() if f.code == "vocab_map_invalid"] == []


def test_pure_check_words() -> None:
    assert check_replaced_weights([], moment="first forward") == []
    (one,) = check_replaced_weights(
        [ReplacedWeight("lm_head.weight", "changed"), ReplacedWeight("fc.weight", "changed")], moment="CUDA-graph capture"
    )
    assert "2 trained draft tensors" in one.message and "overwritten in place" in one.message
    assert one.evidence["moment"] == "CUDA-graph capture" and one.fix

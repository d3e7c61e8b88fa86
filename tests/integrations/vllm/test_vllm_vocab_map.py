"""vocab_map_invalid at vLLM's draft load, on vLLM 0.32's own ``Eagle3LlamaForCausalLM`` (CPU).

A trainer's placeholder ``d2t = arange`` beside a ``t2d`` that marks the real hot set: vLLM
loads d2t into ``draft_id_to_target_id`` and proposes draft id i as target id
``i + d2t[i]`` = 2i, checking nothing. Shown first on the engine's parameter, then named
by spectrace at the load; the clean twin (d2t the offsets of the marked ids) says nothing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU venv")
torch = pytest.importorskip("torch")

from spectrace.records import Finding
from tests.helpers import vllm_harness as vh

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def installed():
    yield from vh.installed("vllm.model_executor.models.llama_eagle3")


HOT = torch.arange(vh.DRAFT_VOCAB) * 4  # the draft vocabulary the draft was trained on: target ids 4i


def _load(tmp_path, d2t: torch.Tensor):
    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, _ = vh.build(vc)
    ckpt = vh.checkpoint(draft, d2t=False)
    t2d = torch.zeros(vh.VOCAB, dtype=torch.bool)
    t2d[HOT] = True
    ckpt.update(d2t=d2t, t2d=t2d)
    draft.load_weights(ckpt.items())
    return draft


def _maps(rec) -> list[Finding]:
    return [r for r in rec.records() if isinstance(r, Finding) and r.code == "vocab_map_invalid"]


def test_arange_d2t_beside_the_real_t2d(rec, tmp_path) -> None:
    draft = _load(tmp_path, torch.arange(vh.DRAFT_VOCAB))
    proposed = (torch.arange(vh.DRAFT_VOCAB) + draft.draft_id_to_target_id).tolist()
    print("vLLM proposes draft ids 0..3 as target ids", proposed[:4], "; t2d marks", HOT[:4].tolist())
    assert proposed[:4] == [0, 2, 4, 6]  # the engine's own map: 2i, not the trained 4i
    (one,) = _maps(rec)
    print(one.message)
    assert one.severity == "error" and one.module == "draft.draft_id_to_target_id"
    assert one.evidence["arange_default"] is True
    assert "t2d marks another set of target ids" in one.message


def test_clean_twin_offsets_of_the_marked_ids(rec, tmp_path) -> None:
    draft = _load(tmp_path, HOT - torch.arange(vh.DRAFT_VOCAB))
    assert (torch.arange(vh.DRAFT_VOCAB) + draft.draft_id_to_target_id).tolist() == HOT.tolist()
    assert _maps(rec) == []
    assert [r.code for r in rec.records() if isinstance(r, Finding) and r.severity == "error"] == []

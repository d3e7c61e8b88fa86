"""Under ``SPECTRACE=1`` a step is one forward of the root module: ``generate()`` of N
tokens is N steps (the prefill and N-1 decodes), each with its own number, and a plain
``model(ids)`` call is one step. A real tiny Hugging Face Llama in a fresh interpreter,
activated by the installed ``.pth`` bootstrap with no code change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers import paths

ROOT = paths.ROOT

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {root!r})
    from tests.helpers.models import tiny_llama
    model = tiny_llama(layers=2).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        if {mode!r} == "generate":
            out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
            assert out.shape == (1, 9), out.shape
        else:
            model(ids)
    """
)


def _steps(tmp_path: Path, mode: str) -> dict[int, list[dict]]:
    """Run the script under SPECTRACE=1; the call records of its trace, by step."""
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(root=str(ROOT), mode=mode))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(tmp_path / "traces"))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = sorted((tmp_path / "traces").glob("trace-*.jsonl"))
    assert len(files) == 1, (files, proc.stderr)
    by_step: dict[int, list[dict]] = defaultdict(list)
    for line in files[0].read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "call":
            by_step[record["step"]].append(record)
    return dict(by_step)


@pytest.mark.slow
def test_generate_of_five_tokens_is_five_steps(tmp_path: Path) -> None:
    steps = _steps(tmp_path, "generate")
    assert sorted(steps) == [0, 1, 2, 3, 4], sorted(steps)
    for step, calls in steps.items():
        # Each step is one whole forward: every module once, embedding first, head last.
        modules = [c["module"] for c in calls]
        assert modules[0].endswith("embed_tokens") and modules[-1].endswith("lm_head"), (step, modules)
        assert len(modules) == len(set(modules)), (step, modules)
    # The prefill reads the 4 prompt tokens; each decode step reads the one new token.
    token_dims = [steps[s][0]["inputs"][0]["shape"][-1] for s in sorted(steps)]
    assert token_dims == [4, 1, 1, 1, 1], token_dims


def test_plain_forward_is_one_step(tmp_path: Path) -> None:
    steps = _steps(tmp_path, "forward")
    assert list(steps) == [0], sorted(steps)
    assert [c["module"].rsplit(".", 1)[-1] for c in steps[0]][-1] == "lm_head"

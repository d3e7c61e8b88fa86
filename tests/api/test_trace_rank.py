"""``spectrace.trace()`` takes the rank the environment names, as the process recorder does.

Under torchrun (``RANK=3``), a script that calls ``trace()`` beside ``SPECTRACE=1`` wrote
two traces of one process that disagreed on its rank (the API's said none), and the metrics
counted the process twice (``spectrace_info`` under two rank labels).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import spectrace
from spectrace.eagle3.target import tiny_llama


def _header(path: str) -> dict[str, object]:
    return json.loads(Path(path).read_text().splitlines()[0])


@pytest.mark.parametrize(("env", "rank"), [({"RANK": "3"}, 3), ({"SPECTRACE_RANK": "5", "RANK": "3"}, 5), ({}, None)])
def test_trace_names_the_environments_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rank: int | None) -> None:
    for key in ("RANK", "SPECTRACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path)) as t:
        model(torch.tensor([[1, 2]]))
    assert t.path is not None
    assert _header(t.path)["rank"] == rank
    assert (f"-rank{rank}" in Path(t.path).name) is (rank is not None)

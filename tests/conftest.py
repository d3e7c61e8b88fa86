"""Shared fixtures: tiny real Hugging Face models built from configs (nothing downloaded).

Helpers that tests import are in tests/helpers/; this file holds fixtures only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.demo_cache import DemoCache
from tests.helpers.models import tiny_deepseek_v3, tiny_llama

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # DeepSeek routing is torch.compiled; eager is faster for tiny models
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers sharing two cores: OpenMP pools of two threads each spin against each other
    # and tiny-model tests crawl. One thread per worker keeps the cores busy, not fighting.
    # The same for the processes a test starts (the demo in a tmux pane, a bench script):
    # two demos side by side took 66 s with a pool each, 15 s with one thread each.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def llama():
    return tiny_llama()


@pytest.fixture
def deepseek():
    return tiny_deepseek_v3()


@pytest.fixture
def no_spectrace_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SPECTRACE") or name.startswith("OTEL_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> DemoCache:
    """The demo's scenarios, each run once for the whole test run (all xdist workers share the
    run's temporary root: a worker's own is a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return DemoCache((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "demo-cache")


@pytest.fixture(scope="module")
def bypass(tmp_path_factory: pytest.TempPathFactory, demo_cache: DemoCache) -> Path:
    """The demo's fc_bypass scenario, traced: a real trace of the EAGLE-3 pipeline."""
    out = tmp_path_factory.mktemp("demo")
    demo_cache.run("fc_bypass", out, reference=False)
    return out / "fc_bypass"

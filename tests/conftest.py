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
# Every model here is tiny (64 wide): torch's thread pool costs more than it saves, and two
# workers on two cores with a pool each spin against each other (tests/eagle3 took 71 s wall
# and 91 CPU-s with the pool, 39 s and 37 CPU-s with one thread). One thread for the suite,
# its workers and every process a test starts (the demo in a tmux pane, a server, a bench
# script), whether or not xdist runs it.
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


@pytest.fixture(scope="session")
def vllm_replay_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One live vLLM CPU server run with replay inputs kept, for every test that reads one
    (replay, probe); each module copies it (:func:`tests.helpers.vllm_server.replay_served`)."""
    from tests.helpers import vllm_server as vs

    return vs.replay_served(tmp_path_factory.mktemp("vllm-replay"))

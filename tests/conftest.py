"""Shared fixtures: tiny real Hugging Face models built from configs (nothing downloaded)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # DeepSeek routing is torch.compiled; eager is faster for tiny models
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: OpenMP pools of two threads each spin against each other
    # and tiny-model tests crawl. One thread per worker keeps the cores busy, not fighting.
    # The same for the processes a test starts (the demo in a tmux pane, a bench script):
    # two demos side by side took 66 s with a pool each, 15 s with one thread each.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def load_script(path: str | os.PathLike[str]) -> ModuleType:
    """A script of the repository (bench/, scripts/) imported as a module by its path,
    registered in sys.modules under its file name (dataclasses look their module up there)."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tiny_llama(layers: int = 4, hidden: int = 64, vocab: int = 128):
    from spectrace.eagle3.target import tiny_llama as build

    return build(vocab_size=vocab, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden)


def tiny_deepseek_v3(layers: int = 3):
    from spectrace.eagle3.target import tiny_deepseek_v3 as build

    return build(num_layers=layers)


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


@pytest.fixture(scope="module")
def bypass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's fc_bypass scenario, traced: a real trace of the EAGLE-3 pipeline."""
    from spectrace.demo import run_scenario

    out = tmp_path_factory.mktemp("demo")
    run_scenario("fc_bypass", str(out), None)
    return out / "fc_bypass"

"""A small pure-torch EAGLE-3 reference pipeline with SGLang 0.5.23 semantics.

Importing the package is cheap: the models (torch, transformers) load on first use.

    >>> from spectrace.eagle3 import build_scenario, speculate, demo_prompts
    >>> scenario = build_scenario("healthy")
    >>> speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=40).mean_accept_length
    5.0
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Eagle3Target": "target",
    "TargetOutput": "target",
    "AuxConcat": "target",
    "tiny_llama": "target",
    "tiny_deepseek_v3": "target",
    "Eagle3Draft": "draft",
    "DraftConfig": "draft",
    "DraftOutput": "draft",
    "speculate": "loop",
    "SpecResult": "loop",
    "mean_accept_length": "loop",
    "BUGS": "bugs",
    "BugSpec": "bugs",
    "Scenario": "bugs",
    "build_scenario": "bugs",
    "measure_all": "bugs",
    "demo_prompts": "pair",
    "load_target_model": "pair",
    "load_draft": "pair",
    "load_draft_checkpoint": "pair",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spectrace.eagle3' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)

"""One traced process of a test fleet: the reference EAGLE-3 pipeline under one scenario.

Runs one demo prompt traced, with the environment's settings (``SPECTRACE_METRICS_PORT``
serves the metrics), prints ``ready`` once the trace is closed, then stays up for Prometheus
to scrape until its standard input closes.

    $ SPECTRACE_METRICS_PORT=9400 python tests/scripts/fleet_member.py fc_bypass TRACE_DIR
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from spectrace import api
from spectrace.eagle3.bugs import build_scenario
from spectrace.eagle3.loop import speculate
from spectrace.eagle3.pair import demo_prompts
from spectrace.eagle3.watch import PipelineWatch
from spectrace.settings import Settings


def main(name: str, directory: str) -> None:
    settings = dataclasses.replace(Settings.from_env(), quiet=True)
    scenario = build_scenario(name, load=False)
    with api.trace({"target": scenario.target, "draft": scenario.draft}, profile="eagle3", directory=directory, settings=settings) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm)
        watch.load(scenario.checkpoint)
        scenario.draft.set_embed(scenario.target.get_embed())
        with torch.no_grad():
            speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=16, on_step=watch.on_step)
        watch.finish()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes the pipe


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

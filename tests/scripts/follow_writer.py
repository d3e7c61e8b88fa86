"""A serving loop that keeps appending to its trace: the tiny EAGLE-3 pair, traced.

    python follow_writer.py TRACE_DIR CONTROL_DIR

It serves the demo prompts over and over, healthy, until ``CONTROL_DIR/switch`` exists;
then it switches the target's aux capture off live (the ``fc_bypass`` bug of
``spectrace.eagle3.bugs``: the draft gets 64-wide states, fc is skipped, acceptance
collapses) and goes on serving. It finishes (the watch's whole-run checks, the trace
closed) when ``CONTROL_DIR/stop`` exists, or after ``DEADLINE_S`` whatever happens.
It writes ``CONTROL_DIR/ready`` once serving and ``CONTROL_DIR/switched`` after the
switch, each holding the verify steps served so far.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from spectrace import api
from spectrace.eagle3.bugs import build_scenario
from spectrace.eagle3.loop import speculate
from spectrace.eagle3.pair import demo_max_new_tokens, demo_prompts
from spectrace.eagle3.watch import PipelineWatch
from spectrace.settings import Settings

DEADLINE_S = 180.0
STEP_PAUSE_S = 0.03  # a server's pace, and room on the CPU for the viewer


def main(trace_dir: str, control: str) -> int:
    started = time.monotonic()
    scenario = build_scenario("healthy", load=False)
    settings = Settings(quiet=True, flush_seconds=0.2)
    steps = 0
    switched = False

    def flag(name: str) -> bool:
        return os.path.exists(os.path.join(control, name))

    def mark(name: str) -> None:
        with open(os.path.join(control, name + ".tmp"), "w") as fh:
            fh.write(str(steps))
        os.replace(os.path.join(control, name + ".tmp"), os.path.join(control, name))

    with api.trace({"target": scenario.target, "draft": scenario.draft}, profile="eagle3", directory=trace_dir, settings=settings) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm)
        watch.load(scenario.checkpoint)
        scenario.draft.set_embed(scenario.target.get_embed())

        def on_step(step: int, accept_length: int, mask: list[bool]) -> None:
            nonlocal steps
            watch.on_step(step, accept_length, mask)
            steps += 1
            time.sleep(STEP_PAUSE_S)

        mark("ready")
        with torch.no_grad():
            while not flag("stop") and time.monotonic() - started < DEADLINE_S:
                if not switched and flag("switch"):
                    scenario.target.aux_enabled = False  # the capture switched off under a running server
                    switched = True
                    mark("switched")
                for prompt in demo_prompts():
                    speculate(scenario.target, scenario.draft, prompt, k=4, max_new_tokens=demo_max_new_tokens(), on_step=on_step)
                    if flag("stop") or (not switched and flag("switch")):
                        break
        watch.finish()
    mark("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

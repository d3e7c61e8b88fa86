"""The demo's scenarios: every EAGLE-3 wiring bug, reproduced, traced and diagnosed.

Runs the trained tiny target/draft pair healthy and under each bug switch, with
tracing on, writes one trace folder per scenario, and prints a few lines per scenario
that fit 80 columns: its mean accept length and trace folder, what is wrong (the root
cause's code and what was seen) and its one fix. ``--details`` shows every finding of
each scenario: what was seen, the cause, the fix. Progress goes to stderr. The command
line is :mod:`spectrace.cli.demo`.

    $ spectrace demo                    # all scenarios into ./spectrace-demo/
    $ spectrace demo --bug fc_bypass    # one scenario
    $ spectrace view spectrace-demo/fc_bypass
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .present.findings import cut as _cut
from .present.findings import heads
from .records import Finding, Fingerprint
from .settings import Settings

if TYPE_CHECKING:
    from rich.text import Text

DEFAULT_OUT = "spectrace-demo"
K = 4


@dataclass
class ScenarioResult:
    name: str
    description: str
    accept_length: float
    findings: list[Finding]
    trace_dir: str
    seconds: float
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


def reference_fingerprint() -> Fingerprint:
    """The healthy pipeline's fused-input fingerprint on training-language samples.

    This stands for the fingerprint a team records while generating training data
    (``spectrace fingerprint``): same layers, same data distribution.
    """
    import torch

    from .eagle3.bugs import build_scenario
    from .eagle3.fingerprint import FingerprintCollector
    from .eagle3.pair import make_language, sample_language
    from .eagle3.watch import NUM_AUX

    healthy = build_scenario("healthy")
    collector = FingerprintCollector(NUM_AUX)
    lang = make_language()
    samples = sample_language(lang, 8, 48, torch.Generator().manual_seed(7))
    with torch.no_grad():
        for row in samples:
            collector.observe(healthy.target(row).hidden_states)
    result = collector.result("target.aux_concat", list(healthy.target.capture.boundaries))
    assert result is not None
    return result


def run_scenario(name: str, out_dir: str, reference: Fingerprint | None, k: int = K) -> ScenarioResult:
    """Build scenario ``name``, run the demo prompts traced, and collect its findings."""
    import torch

    from . import api
    from .eagle3.bugs import BUGS, build_scenario
    from .eagle3.loop import speculate
    from .eagle3.pair import demo_max_new_tokens, demo_prompts
    from .eagle3.watch import PipelineWatch

    started = time.perf_counter()
    scenario = build_scenario(name, load=False)
    trace_dir = os.path.join(out_dir, name)
    _clear_old_traces(trace_dir)
    settings = Settings(quiet=True)
    accept: list[int] = []
    with api.trace({"target": scenario.target, "draft": scenario.draft}, profile="eagle3", directory=trace_dir, settings=settings) as t:
        watch = PipelineWatch(t, scenario.target, scenario.draft, scenario.draft_config, algorithm=scenario.algorithm, reference=reference)
        watch.load(scenario.checkpoint)
        scenario.draft.set_embed(scenario.target.get_embed())
        try:
            with torch.no_grad():
                for prompt in demo_prompts():
                    result = speculate(
                        scenario.target, scenario.draft, prompt, k=k, max_new_tokens=demo_max_new_tokens(), on_step=watch.on_step
                    )
                    accept += result.accept_lengths
        except RuntimeError as exc:  # an engine that fails loudly (DeepSeek count check) is a result too
            accept = []
            t.recorder.internal_error(f"pipeline raised: {exc}")
        findings = watch.finish()
    mean = sum(accept) / len(accept) if accept else 0.0
    return ScenarioResult(
        name=name,
        description=BUGS[name].description,
        accept_length=mean,
        findings=findings,
        trace_dir=trace_dir,
        seconds=time.perf_counter() - started,
        steps=len(accept),
    )


def _clear_old_traces(trace_dir: str) -> None:
    # A re-run replaces the scenario's trace; files from earlier runs would read as more processes.
    if os.path.isdir(trace_dir):
        for entry in os.listdir(trace_dir):
            if entry.startswith("trace-") and entry.endswith(".jsonl"):
                os.remove(os.path.join(trace_dir, entry))


INDENT = "  "  # as the presenter indents a scenario's findings


def _headline(r: ScenarioResult, name_width: int, width: int) -> list[Text]:
    """The scenario's name, accept length and trace folder; a folder too long for the line
    goes on its own line beneath (a path is never cut: it is there to be copied)."""
    from rich.text import Text

    line = Text(f"{r.name:<{name_width}}  {r.accept_length:>6.2f}  ")
    lines = [line]
    if len(line) + len(r.trace_dir) <= width:
        line.append(r.trace_dir, style="cyan")
    else:
        line.rstrip()
        lines.append(Text(INDENT + "trace: "))
        lines[-1].append(r.trace_dir, style="cyan")
    if not r.findings:
        if len(lines[-1]) + len("  no findings") <= width:
            lines[-1].append("  no findings", style="green")
        else:
            lines.append(Text(INDENT + "no findings", style="green"))
    return lines


def report_lines(results: list[ScenarioResult], width: int = 80, details: bool = False) -> list[Text]:
    """The demo's screen, each line at most ``width`` wide (a trace folder longer than the
    screen aside): per scenario its accept length and trace folder, what is wrong and the
    one fix; with ``details``, every finding's seen text, cause and fix, root causes first
    (the view's judgement)."""
    from rich.text import Text

    from .present.renderables import demo_details, demo_summary

    name_width = max([len("scenario"), *(len(r.name) for r in results)])
    lines = [
        Text(_cut(f"spectrace demo: EAGLE-3 pipeline, k={K}; accept = tokens accepted per verify", width), style="bold"),
        # A healthy 4.76 at k=4 reads as a bug without it.
        Text(_cut(f"(up to k+1 = {K + 1}: a verify also keeps the target's own next token, the bonus)", width), style="dim"),
        Text(_cut(f"{'scenario':<{name_width}}  {'accept':>6}  trace folder, then what is wrong and the fix", width), style="bold"),
    ]
    for r in results:
        lines += _headline(r, name_width, width)
        if r.findings:
            lines += demo_details(r.findings, width) if details else demo_summary(r.findings, width)
    return lines


def root_causes(findings: list[Finding]) -> list[Finding]:
    """The findings that head the report, most severe first, one per code: those that follow
    from no other (:mod:`spectrace.checks.root_causes` decides)."""
    return heads(findings)

"""``spectrace demo``: every EAGLE-3 wiring bug, reproduced, traced and diagnosed.

Runs the trained tiny target/draft pair healthy and under each bug switch, with
tracing on, writes one trace folder per scenario, and prints one line per scenario
(mean accept length and the root cause's code) so the whole run fits one screen;
``--details`` adds every finding's code and one-line cause. Progress goes to stderr.

    $ spectrace demo                    # all scenarios into ./spectrace-demo/
    $ spectrace demo --bug fc_bypass    # one scenario
    $ spectrace view spectrace-demo/fc_bypass
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .records import SEVERITY_RANK, Finding, Fingerprint
from .settings import Settings

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


def _table(results: list[ScenarioResult], details: bool = False) -> Any:
    """One line per scenario: accept length, the root cause and how many findings follow
    from it; with ``details``, every finding's code and cause beneath."""
    from rich.table import Table

    # The run's time goes under the table: a title wider than the table would wrap.
    table = Table(title=f"spectrace demo: EAGLE-3 pipeline, k={K}", show_lines=details)
    table.add_column("scenario", no_wrap=True)
    table.add_column("accept", justify="right", no_wrap=True)
    table.add_column("root cause" if not details else "findings: code, then the cause", overflow="fold")
    for r in results:
        roots = root_causes(r.findings)
        if not roots:
            summary = "[green]no findings[/]"
        else:
            style = {"error": "bold red", "warning": "yellow", "info": "dim"}
            first = roots[0]
            more = len({f.code for f in r.findings}) - 1
            summary = f"[{style[first.severity]}]{first.code}[/]" + (f" [dim](+{more} more)[/]" if more > 0 else "")
        if details:
            lines = [summary]
            seen: set[str] = set()
            for f in sorted(r.findings, key=lambda f: SEVERITY_RANK[f.severity]):
                if f.code not in seen:
                    seen.add(f.code)
                    lines.append(f"  {f.code}: {_short(f.message)}")
            summary = "\n".join(lines)
        table.add_row(r.name, f"{r.accept_length:.2f}", summary)
    return table


def root_causes(findings: list[Finding]) -> list[Finding]:
    """The findings that head the report, most severe first, one per code: those that follow
    from no other (:mod:`spectrace.checks.root_causes` decides)."""
    from .checks.root_causes import root_causes as judge

    seen: set[str] = set()
    heads: list[Finding] = []
    judged = judge(findings)
    for f, j in sorted(zip(findings, judged), key=lambda fj: SEVERITY_RANK[fj[0].severity]):
        if j.root is None and f.code not in seen:
            seen.add(f.code)
            heads.append(f)
    return heads


def _short(message: str, limit: int = 90) -> str:
    # The cause's first clause; the whole message is in the trace and in `spectrace view`.
    text = message.split("; ")[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    from .eagle3.bugs import BUGS

    parser = argparse.ArgumentParser(
        prog="spectrace demo",
        description="Run the tiny EAGLE-3 pipeline healthy and under every bug switch, traced.",
        epilog="scenarios: "
        + ", ".join(BUGS)
        + "\nthen: spectrace view DIR/<scenario>"
        + "\n\nexamples:\n  spectrace demo                          every scenario, into ./spectrace-demo"
        + "\n  spectrace demo --bug fc_bypass --out d  one scenario, into ./d/fc_bypass",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bug", action="append", choices=list(BUGS), help="run only this scenario (repeatable)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the traces (default: ./{DEFAULT_OUT})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--details", action="store_true", help="every finding's code and cause under its scenario")
    args = parser.parse_args(argv)

    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    started = time.perf_counter()
    names = args.bug or list(BUGS)
    reference = reference_fingerprint()
    results = []
    for n, name in enumerate(names, 1):
        # Progress on stderr, so that --json and a pipe still get only the results.
        sys.stderr.write(f"[{n}/{len(names)}] {name} ...")
        sys.stderr.flush()
        result = run_scenario(name, args.out, reference)
        results.append(result)
        sys.stderr.write(f" accept {result.accept_length:.2f}, {result.seconds:.1f} s\n")
    total = time.perf_counter() - started
    if args.json:
        import json

        print(
            json.dumps(
                {
                    "seconds": round(total, 2),
                    "scenarios": [
                        {
                            "name": r.name,
                            "accept_length": round(r.accept_length, 3),
                            "steps": r.steps,
                            "trace_dir": r.trace_dir,
                            "findings": [f.model_dump(mode="json") for f in r.findings],
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )
        return 0
    from rich.console import Console

    console = Console()
    console.print(_table(results, details=args.details))
    console.print(f"{len(results)} scenario{'s' if len(results) != 1 else ''} in {total:.1f} s.")
    console.print(f"Traces in {os.path.join(args.out, '<scenario>')}. Read one with: spectrace view {os.path.join(args.out, names[-1])}")
    if not args.details:
        console.print("Every finding and its cause: spectrace demo --details, or spectrace view.")
    healthy = [r for r in results if r.name == "healthy"]
    if healthy and healthy[0].errors:
        sys.stderr.write("spectrace demo: the healthy scenario produced an error finding (a false positive)\n")
        return 1
    return 0


def fingerprint_main(argv: list[str] | None = None) -> int:
    """``spectrace fingerprint --out FILE``: record the reference pipeline's fused-input fingerprint."""
    parser = argparse.ArgumentParser(
        prog="spectrace fingerprint",
        description="Record per-chunk statistics of the fused draft input cat(hs[b0], hs[b1], hs[b2]) "
        "from the healthy reference pipeline. In your own data generation, use "
        "spectrace.eagle3.fingerprint.FingerprintCollector on the fused states and save_fingerprint().",
        epilog="example: spectrace fingerprint --out reference.json, then SPECTRACE_FINGERPRINT=reference.json "
        "compares a traced run's fused input with it",
    )
    parser.add_argument("--out", required=True, help="where to write the fingerprint JSON")
    args = parser.parse_args(argv)
    from .eagle3.fingerprint import save_fingerprint

    fp = reference_fingerprint()
    save_fingerprint(fp, args.out)
    print(f"wrote {args.out}: {len(fp.chunks)} chunks of {fp.chunk_width}, boundaries {fp.boundaries}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

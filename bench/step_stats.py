"""Host time of one eager step's statistics on CUDA, away from any model: this code beside
another revision's, in one process.

    python bench/step_stats.py --base-dir DIR [--tensors 40] [--numel 4096] [--rounds 12]

A decode step's statistics are a few dozen small tensors. Each step here is what the read
pass and the step's end do with them: ``StepStats.add`` for each tensor (held for a
batched launch), then ``start_readback`` (the batched launches, the rows' copy to pinned
memory behind an event). The host time of that, from the first ``add`` to the return of
``start_readback``, is the figure; the read-back is then waited for, untimed, and checked
against float64. ``DIR`` holds ``spectrace_base/`` (``bench/ab_versions.py --export``);
the two versions alternate, round by round, so a shared host's drift hits both alike.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_step(readback: Any, xs: list[torch.Tensor]) -> tuple[float, list[Any]]:
    """(host seconds of one step's statistics, its rows)."""
    step = readback.StepStats(defer=True)
    start = time.perf_counter()
    for x in xs:
        step.add(x, reuse=False)
    pending = step.start_readback()
    took = time.perf_counter() - start
    return took, pending.values()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-dir", help="a folder holding spectrace_base/ (bench/ab_versions.py --export)")
    parser.add_argument("--tensors", type=int, default=40, help="tensors per step (a decode step's hooked outputs)")
    parser.add_argument("--numel", type=int, default=4096, help="elements per tensor (a batch-1 hidden state)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=50, help="steps per version and round")
    parser.add_argument("--json", help="write the figures to this file as JSON")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/step_stats.py: needs a CUDA device")
    versions = {"working tree": "spectrace"}
    if args.base_dir:
        sys.path.insert(0, args.base_dir)
        versions = {f"base ({args.base_dir})": "spectrace_base", **versions}
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(0)
    xs = [(torch.randn(args.numel, generator=gen, dtype=torch.float64) + i).to(device, torch.bfloat16) for i in range(args.tensors)]
    want = [float(x.double().sum()) for x in xs]
    modules = {}
    for label, package in versions.items():
        fused = importlib.import_module(f"{package}.hooks.fused_stats")
        if not fused.prepare(device):
            raise SystemExit(f"bench/step_stats.py: the fused kernel failed its check ({label})")
        modules[label] = importlib.import_module(f"{package}.hooks.readback")
        for _ in range(5):  # compile and warm every path
            one_step(modules[label], xs)
    times: dict[str, list[float]] = {label: [] for label in versions}
    for round_ in range(args.rounds):
        order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
        for label in order:
            per_round = []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                took, rows = one_step(modules[label], xs)
                per_round.append(took)
            # (each version's rows are checked once a round: the sums as float64 gives them)
            if any(row is None or abs(row[0] - w) > 1e-6 * max(1.0, abs(w)) for row, w in zip(rows, want)):
                raise SystemExit(f"bench/step_stats.py: {label} read back wrong sums")
            times[label].append(statistics.median(per_round) * 1e6)
    result: dict[str, Any] = {"tensors": args.tensors, "numel": args.numel, "dtype": "bfloat16", "rounds": args.rounds, "steps": args.steps}
    for label, medians in times.items():
        q = statistics.quantiles(medians, n=4) if len(medians) > 1 else [medians[0]] * 3
        result[label] = {"host_us_per_step_median": round(statistics.median(medians), 1), "iqr": [round(q[0], 1), round(q[2], 1)]}
        print(f"{label:28s} host time per step {statistics.median(medians):8.1f} us (IQR {q[0]:.1f}-{q[2]:.1f}) for {args.tensors} tensors")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""Device time a traced step adds, kernel by kernel: bare and traced steps under torch.profiler.

    python3 bench/kernel_time.py --shape 4x512 [--stats basic] [--steps 4] [--json FILE]

Runs ``bench/overhead.py``'s pair (Llama-8B-shaped target and its EAGLE-3-shaped draft) on
CUDA, profiles ``--steps`` bare steps, the same steps traced, and bare steps again (the
control: what drifts between two bare runs is the device's), and prints per step: the
kernels' summed device time, the span from the first kernel's start to the last one's end,
the wall time (median of six synchronized steps), and the kernels whose device time changed
most (spectrace's own launches, and the model's kernels that got slower or faster beside
them). A device-bound step (prefill) pays what its kernels add; the span minus the kernels'
time is where the device waited for the host.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from overhead import build, machine, make_step  # noqa: E402

import spectrace  # noqa: E402
from spectrace.settings import Settings  # noqa: E402


def wall_ms(step: Any, n: int = 6) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def profile(step: Any, steps: int) -> dict[str, Any]:
    """Kernel time per step by kernel name, and the step's device figures."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: collections.Counter[str] = collections.Counter()
    launches: collections.Counter[str] = collections.Counter()
    for e in events:
        by_name[e.name[:70]] += e.device_time / steps
        launches[e.name[:70]] += 1 / steps
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    return {
        "kernels_ms": round(sum(by_name.values()) / 1e3, 3),
        "span_ms": round((spans[-1][1] - spans[0][0]) / steps / 1e3, 3) if spans else 0.0,
        "wall_ms": round(wall_ms(step), 3),
        "by_kernel_us": dict(by_name),
        "launches": dict(launches),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="4x512", help="BATCHxTOKENS")
    p.add_argument("--size", default="llama8b")
    p.add_argument("--stats", default="basic", choices=("off", "basic", "full"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs CUDA")
    shape = tuple(int(v) for v in args.shape.split("x"))
    target, draft, ids, aux, info = build(args.size, "cuda", shape)
    step = make_step(target, draft, ids, aux)
    bare = profile(step, args.steps)
    with spectrace.trace({"target": target, "draft": draft}, settings=Settings(), stats=args.stats) as traced_session:
        traced = profile(step, args.steps)
        traced_session.tracer.finish_step(wait=True)
    # Bare again, after: the control. A model kernel that reads slower traced than in both
    # bare runs is the trace's doing; one that drifted between the bare runs is the device's.
    again = profile(step, args.steps)

    def change(fig: dict[str, Any], name: str) -> tuple[float, float]:
        return (
            round(fig["by_kernel_us"].get(name, 0.0) - bare["by_kernel_us"].get(name, 0.0), 1),
            round(fig["launches"].get(name, 0.0) - bare["launches"].get(name, 0.0), 1),
        )

    names = set(bare["by_kernel_us"]) | set(traced["by_kernel_us"]) | set(again["by_kernel_us"])
    top = sorted(((name, change(traced, name)) for name in names), key=lambda kv: -abs(kv[1][0]))[:14]
    for label, fig in (("bare", bare), ("traced", traced), ("bare again", again)):
        print(f"{label:10} kernels {fig['kernels_ms']:.3f} ms a step, span {fig['span_ms']:.3f} ms, wall {fig['wall_ms']:.3f} ms")
    print(
        f"the trace adds {traced['kernels_ms'] - bare['kernels_ms']:.3f} ms of kernel time a step "
        f"(bare again: {again['kernels_ms'] - bare['kernels_ms']:+.3f} ms); by kernel, against the first bare run "
        "(us a step traced, launches a step, us a step bare again):"
    )
    for name, (us, n) in top:
        print(f"  {us:9.1f} us  {n:6.1f}  {change(again, name)[0]:9.1f} us  {name}")
    if args.json:
        out = {
            "command": "python3 bench/kernel_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(),
            "model": info,
            "stats": args.stats,
            "steps": args.steps,
            "bare": {k: v for k, v in bare.items() if k not in ("by_kernel_us", "launches")},
            "traced": {k: v for k, v in traced.items() if k not in ("by_kernel_us", "launches")},
            "bare_again": {k: v for k, v in again.items() if k not in ("by_kernel_us", "launches")},
            "changed_us_and_launches": dict(top),
            "bare_again_changed_us": {name: change(again, name)[0] for name, _ in top},
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

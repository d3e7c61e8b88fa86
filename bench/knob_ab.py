"""One setting of spectrace's, several values, side by side in one process.

    python3 bench/knob_ab.py --knob spectrace.hooks.readback.DEFER_TENSOR_BYTES=8388608,33554432 \
        --shape 4x512 --device cuda [--stats basic] [--rounds 12] [--reps 6] [--json FILE]

Runs ``bench/overhead.py``'s pair (the Llama-8B-shaped target and its EAGLE-3-shaped
draft; ``--size``) traced once per value of a module-level constant, beside bare steps
and bare steps again (the control: the same code as bare, timed as another variant),
interleaved round by round in an order that rotates, so the device's and the host's drift
hit every variant alike. A constant that the code reads at each use (a size limit, a
batch size) can be compared this way without two checkouts. Prints, per variant, the
median over rounds of (its median step / bare's median step that round) with the
quartiles, and on CUDA the device time of spectrace's own kernels per step (one
torch.profiler pass per variant after the timed rounds).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from overhead import build, machine, make_step, quartiles, timer  # noqa: E402

import spectrace  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

OWN_KERNELS = ("stats_partials", "graph_slot")  # spectrace's kernels, by name prefix


def parse_knob(text: str) -> tuple[Any, str, list[int | float | str]]:
    """``pkg.module.NAME=v1,v2`` -> (the module, NAME, [v1, v2]); numbers stay numbers."""
    target, _, values = text.partition("=")
    module_name, _, attr = target.rpartition(".")
    if not module_name or not values:
        raise SystemExit(f"--knob: expected pkg.module.NAME=v1,v2, not {text!r}")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise SystemExit(f"--knob: {module_name} has no {attr}")

    def number(v: str) -> int | float | str:
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    return module, attr, [number(v) for v in values.split(",")]


def own_kernel_us(step: Callable[[], None], steps: int) -> float:
    """Device time of spectrace's kernels per step (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith(OWN_KERNELS))
    return round(total / steps, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--knob", required=True, help="pkg.module.NAME=v1,v2,... (a module-level constant)")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--size", default="llama8b")
    p.add_argument("--shape", default="4x512", help="BATCHxTOKENS")
    p.add_argument("--stats", default="basic", choices=("off", "basic", "full"))
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--reps", type=int, default=6, help="timed steps per variant a round")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    module, attr, values = parse_knob(args.knob)
    original = getattr(module, attr)
    shape = tuple(int(v) for v in args.shape.split("x"))
    target, draft, ids, aux, info = build(args.size, args.device, shape)  # type: ignore[arg-type]
    step = make_step(target, draft, ids, aux)
    models = {"target": target, "draft": draft}
    cuda = args.device == "cuda"
    if cuda:
        from spectrace.hooks import fused_stats

        fused_stats.prepare("cuda")
    time_one = timer(args.device)
    variants: list[str] = ["bare", "bare again", *(f"{attr}={v}" for v in values)]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    kernel_us: dict[str, float] = {}

    def run(name: str, profile_kernels: bool = False) -> None:
        if name.startswith("bare"):
            step()  # (a warm step, as a traced variant takes one inside its trace)
            if profile_kernels:
                kernel_us[name] = own_kernel_us(step, 2)
                return
            samples[name].append(statistics.median(time_one(step) for _ in range(args.reps)))
            return
        setattr(module, attr, values[variants.index(name) - 2])
        try:
            with spectrace.trace(models, settings=Settings(), stats=args.stats) as t:
                step()
                if profile_kernels:
                    kernel_us[name] = own_kernel_us(step, 2)
                else:
                    samples[name].append(statistics.median(time_one(step) for _ in range(args.reps)))
                t.tracer.finish_step(wait=True)
        finally:
            setattr(module, attr, original)

    for _ in range(3):
        step()
    for rnd in range(args.rounds):
        shift = rnd % len(variants)
        order = variants[shift:] + variants[:shift]
        for name in order[::-1] if rnd % 2 else order:
            run(name)
    if cuda:
        for name in variants:
            run(name, profile_kernels=True)
    bare = samples["bare"]
    table: dict[str, Any] = {}
    for name in variants:
        ratios = [m / b for m, b in zip(samples[name], bare)]
        q1, q3 = quartiles(ratios)
        table[name] = {
            "ms": round(statistics.median(samples[name]), 3),
            "ratio": round(statistics.median(ratios), 4),
            "ratio_q1": q1,
            "ratio_q3": q3,
            **({"own_kernels_us_per_step": kernel_us[name]} if name in kernel_us else {}),
        }
        extra = f", spectrace's kernels {kernel_us[name]:.1f} us a step" if name in kernel_us else ""
        print(f"{name:34} {table[name]['ms']:9.3f} ms  {table[name]['ratio']:.4f}x (IQR {q1:.4f}-{q3:.4f}){extra}")
    if args.json:
        out = {
            "command": "python3 bench/knob_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(),
            "model": info,
            "stats": args.stats,
            "rounds": args.rounds,
            "reps": args.reps,
            "variants": table,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

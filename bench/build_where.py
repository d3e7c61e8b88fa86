"""Where a device step's records are built, side by side in one run: by the host at a later
step's end (the default), by the record worker thread, or not at all.

    python bench/build_where.py --device cuda --size llama8b --shapes 1x1,64x1,4x512 [--json FILE]
    python bench/build_where.py --device meta --size tiny     # a host-bound stand-in on any machine

Runs ``bench/overhead.py``'s pair (a Llama target and its EAGLE-3-shaped draft) untraced
(``bare``) and traced in shapes-only and statistics mode, each three ways: ``shapes`` /
``stats`` as spectrace runs (the host builds the queued steps whose statistics have landed,
``RecordWorker.build_landed_here``), ``*_worker`` (every device step built by the record
worker thread: ``Tracer.offload = "always"``, as before that), and ``*_nobuild`` (no record
text at all: the statistics still land and their buffers go back; the floor of the other
two). Rounds interleave the variants, rotating and reversing their order; each figure is the
median over rounds of (variant median / bare median of the same round), with its IQR.
On ``meta`` (shapes only, no compute) a step is all host work: a host-bound loop whose
steps are device steps, on a CPU-only machine too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import overhead  # noqa: E402

import spectrace  # noqa: E402
from spectrace.hooks import engine  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

VARIANTS = ("bare", "shapes", "shapes_worker", "shapes_nobuild", "stats", "stats_worker", "stats_nobuild")
_BUILD = engine.Tracer._build_step


def _no_build(self: Any, item: Any, on_worker: bool = True) -> None:
    """The statistics land and their buffers go back to the pool; no record is written."""
    readback = getattr(item, "readback", None)
    if readback is not None:
        readback.values()


def measure(size: str, device: str, shape: tuple[int, int], rounds: int, reps: int) -> dict[str, Any]:
    build_device = "cpu" if device == "meta" else device
    target, draft, ids, aux, info = overhead.build(size, build_device, shape)
    if device == "meta":
        target, draft, ids = target.to("meta"), draft.to("meta"), ids.to("meta")
        from transformers import masking_utils

        # Its check for packed sequences reads position values, which meta tensors lack.
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
    step = overhead.make_step(target, draft, ids, aux)
    models = {"target": target, "draft": draft}
    timed = overhead.timer(device)  # (a device sync before and after on CUDA)
    settings = Settings()
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(3):
        step()
    for rnd in range(rounds):
        order = list(VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)])
        if rnd % 2:
            order.reverse()
        for variant in order:
            if variant == "bare":
                for _ in range(2):
                    step()
                samples[variant].append(statistics.median(timed(step) for _ in range(reps)))
                continue
            if variant.endswith("_nobuild"):
                engine.Tracer._build_step = _no_build  # type: ignore[method-assign]
            try:
                with spectrace.trace(models, settings=settings, stats="off" if variant.startswith("shapes") else "basic") as t:
                    if variant.endswith("_worker"):
                        t.tracer.offload = "always"
                    for _ in range(2):
                        step()
                    samples[variant].append(statistics.median(timed(step) for _ in range(reps)))
                    t.tracer.finish_step()
            finally:
                engine.Tracer._build_step = _BUILD  # type: ignore[method-assign]
    table: dict[str, Any] = {}
    for variant in VARIANTS:
        ratios = [m / b for m, b in zip(samples[variant], samples["bare"])]
        q1, q3 = overhead.quartiles(ratios)
        table[variant] = {
            "ms": round(statistics.median(samples[variant]), 3),
            "ratio": round(statistics.median(ratios), 4),
            "ratio_q1": q1,
            "ratio_q3": q3,
        }
    return {"model": info, "device": device, "rounds": rounds, "reps": reps, "table": table}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "meta"), default="cuda" if torch.cuda.is_available() else "meta")
    p.add_argument("--size", default="tiny", choices=sorted(overhead.SIZES))
    p.add_argument("--shapes", default="1x1,64x1", help="BATCHxTOKENS, comma-separated")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.device == "cuda":
        from spectrace.hooks import fused_stats

        fused_stats.prepare("cuda")  # compile and check the statistics kernel before timing
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device}
    with torch.no_grad():
        for shape in args.shapes.split(","):
            batch, tokens = (int(x) for x in shape.split("x"))
            out[shape] = res = measure(args.size, args.device, (batch, tokens), args.rounds, args.reps)
            for variant, row in res["table"].items():
                print(
                    f"{shape:6s} {variant:15s} {row['ms']:9.3f} ms  {row['ratio']:.4f}x  IQR {row['ratio_q1']:.4f}-{row['ratio_q3']:.4f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

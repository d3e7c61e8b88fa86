"""Host time spectrace adds per hooked module call, on a tiny CPU model (no GPU noise).

    python bench/host_cost.py [--repeats 5]

A tiny Llama (8 layers, hidden 64, 16 tokens) is so cheap that the difference between a
traced and a bare forward is almost all spectrace's Python: the figure to watch when
changing the hot path. Prints the median over repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from conftest import tiny_llama  # noqa: E402

import spectrace  # noqa: E402


def one(iters: int = 50) -> tuple[float, float, int]:
    model = tiny_llama(layers=8, hidden=64)
    ids = torch.randint(0, 128, (1, 16))

    def per_forward() -> float:
        for _ in range(3):  # warm-up
            model(ids)
        t0 = time.perf_counter()
        for _ in range(iters):
            model(ids)
        return (time.perf_counter() - t0) / iters

    with torch.no_grad():
        bare = per_forward()
        with spectrace.trace(model, stats="basic") as t:
            traced = per_forward()
            hooked = len(t.hooked)
    return bare, traced, hooked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    per_call = []
    for _ in range(args.repeats):
        bare, traced, hooked = one()
        per_call.append((traced - bare) / hooked * 1e6)
    print(
        f"hooked modules {hooked}; bare {bare * 1e3:.2f} ms; host time per hooked call: median {statistics.median(per_call):.0f} us "
        f"(repeats: {', '.join(f'{v:.0f}' for v in per_call)})"
    )


if __name__ == "__main__":
    main()

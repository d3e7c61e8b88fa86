"""Host time spectrace adds per hooked module call, on a tiny CPU model (no GPU noise).

    python bench/host_cost.py [--repeats 5] [--json FILE]
    python bench/host_cost.py --device cuda     # the same model on a GPU: the statistics
                                                # kernels' launches are host time too
    python bench/host_cost.py --sample 16       # and with every 16th step traced, beside

A tiny Llama (8 layers, hidden 64, 16 tokens) is so cheap that the difference between a
traced and a bare forward is almost all spectrace's Python: the figure to watch when
changing the hot path. One run measures the bare forward, shapes only (``stats="off"``)
and statistics (``stats="basic"``) side by side, each also with every call noted at its
hook (``*_at_once``: what keeping calls for one read saves), interleaved per repeat so the
machine's drift hits them all alike, then the bare forward again (the control: its wall
difference to bare is the noise of the wall figures), and prints the medians over repeats
with their IQRs. Alongside the wall-clock
difference it prints the hooks' own accounting: the time spent inside spectrace's hooks
and step wrapper per hooked call (``Tracer.host_ns``), the host's share of that
difference by construction.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import spectrace  # noqa: E402
from spectrace.eagle3.target import tiny_llama  # noqa: E402
from spectrace.hooks import engine, fused_stats  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

# shapes only, statistics; *_at_once: each call noted at its hook (engine.PENDING_CALLS = 1),
# what keeping calls for one read saves, in the same run
MODES = ("off", "basic", "off_at_once", "basic_at_once")
LABELS = {"off": "shapes only", "basic": "statistics", "off_at_once": "shapes only, at once", "basic_at_once": "statistics, at once"}


def per_step(step: Callable[[], Any], iters: int, cuda: bool) -> float:
    """Seconds of wall time per step, after a warm-up, the device's queue drained."""
    for _ in range(3):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda:
        torch.cuda.synchronize()  # the tiny model's kernels finish long before the host is done queueing them
    return (time.perf_counter() - t0) / iters


def time_hooks(tracer: Any, modules: Any, timed: Any, excluded: Any = None) -> None:
    """Put ``timed(hook)`` in place of each of the tracer's hooks on ``modules``: torch's
    forward hooks, and what its version calls from a class's forward (callwrap). Where
    that is one function around the module's own forward, ``excluded(forward)`` must take
    the forward's time back out of the count."""
    package = type(tracer).__module__.split(".")[0]  # spectrace, or ab_versions' spectrace_base
    try:
        callwrap = importlib.import_module(f"{package}.hooks.callwrap")
    except ImportError:  # a version from before callwrap
        callwrap = None
    for m in modules:
        for hooks in (m._forward_hooks, m._forward_pre_hooks):
            for key, fn in list(hooks.items()):
                if str(getattr(fn, "__module__", "")).startswith(package):
                    hooks[key] = timed(fn)
        if callwrap is None:
            continue
        if hasattr(callwrap, "retime"):  # one call around the forward
            if excluded is None:
                raise ValueError("time_hooks: this version calls one function around the forward: pass excluded")
            callwrap.retime(m, timed, excluded)
        else:  # a version whose class wrapper called the pre-hook and post-hook
            callwrap.rewrap(m, timed)


class HookClock:
    """Seconds counted inside spectrace's hooks: ``timed(fn)`` adds fn's time, ``excluded(fn)``
    takes it back (a module's own forward, run inside the counted call)."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.spent = 0.0
        self.clock = clock

    def timed(self, fn: Any) -> Any:
        return self._wrap(fn, 1.0)

    def excluded(self, fn: Any) -> Any:
        return self._wrap(fn, -1.0)

    def _wrap(self, fn: Any, sign: float) -> Any:
        clock = self.clock

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                self.spent += sign * (clock() - t0)

        return wrapper

    def install(self, tracer: Any, modules: Any) -> None:
        """Count every hook of ``tracer`` on ``modules`` and its step end (finish_step)."""
        time_hooks(tracer, modules, self.timed, self.excluded)
        tracer.finish_step = self.timed(tracer.finish_step)


def accounted_per_step(t: Any, roots: list[torch.nn.Module], step: Callable[[], Any], iters: int) -> float:
    """Seconds per step spent inside spectrace's hooks and its step end (the hooks' own
    accounting: each wrapped in a perf_counter timer, as bench/overhead.py does)."""
    clock = HookClock()
    clock.install(t.tracer, [m for root in roots for m in root.modules()])
    step()
    clock.spent = 0.0
    for _ in range(iters):
        step()
    return clock.spent / iters


def modes(sample: int = 1) -> tuple[str, ...]:
    """The traced modes of a run; with ``sample`` N > 1 also shapes only and statistics with
    every Nth step traced (``off_sampleN``, ``basic_sampleN``)."""
    return MODES + ((f"off_sample{sample}", f"basic_sample{sample}") if sample > 1 else ())


def label(mode: str) -> str:
    if "_sample" in mode:
        kind, n = mode.split("_sample")
        return f"{LABELS[kind]}, every {n}th step"
    return LABELS[mode]


def one(iters: int = 50, device: str = "cpu", sample: int = 1) -> dict[str, Any]:
    """One round: bare, shapes only and statistics on the same model, seconds per forward.
    A sampled mode runs a whole number of N steps (each N holds one traced step)."""
    model = tiny_llama(num_layers=8, hidden_size=64, intermediate_size=128).to(device)
    ids = torch.randint(0, 128, (1, 16), device=device)
    cuda = ids.is_cuda

    def forward() -> Any:
        return model(ids)

    out: dict[str, Any] = {}
    with torch.no_grad():
        out["bare"] = per_step(forward, iters, cuda)
        for mode in modes(sample):
            kept = engine.PENDING_CALLS
            engine.PENDING_CALLS = 1 if mode.endswith("_at_once") else kept
            n = sample if "_sample" in mode else 1
            steps = -(-iters // n) * n
            try:
                with spectrace.trace(model, stats=mode.split("_")[0], settings=Settings(sample=n)) as t:
                    out[mode] = per_step(forward, steps, cuda)
                    out["hooked"] = len(t.hooked)
                    out[f"{mode}_accounted"] = accounted_per_step(t, [model], forward, steps)
            finally:
                engine.PENDING_CALLS = kept
        out["bare_again"] = per_step(forward, iters, cuda)  # the control: bare against bare
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the figures to this file as JSON")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--sample", type=int, default=1, help="also trace every Nth step only (SPECTRACE_SAMPLE=N), side by side")
    args = parser.parse_args()
    from overhead import quartiles  # (the eager bench's IQR; it imports this module's clock)

    torch.set_num_threads(1)
    if args.device == "cuda":
        fused_stats.prepare("cuda")  # compile and check the statistics kernel before timing
    rounds = [one(args.iters, args.device, args.sample) for _ in range(args.repeats)]
    hooked = rounds[0]["hooked"]
    bare = statistics.median(r["bare"] for r in rounds)
    result: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(__file__, os.getcwd()), *sys.argv[1:]]),
        "device": args.device,
        "hooked_modules": hooked,
        "bare_forward_ms": round(bare * 1e3, 3),
        "repeats": args.repeats,
    }
    control = [(r["bare_again"] - r["bare"]) / hooked * 1e6 for r in rounds]
    low, high = quartiles(control)
    result["control_us_per_hooked_call"] = round(statistics.median(control), 1)
    result["control_us_per_hooked_call_iqr"] = [round(low, 1), round(high, 1)]
    print(f"hooked modules {hooked}; bare forward {bare * 1e3:.2f} ms (median of {args.repeats})")
    print(
        f"control     : bare again, the wall difference per hooked call: median {statistics.median(control):.1f} us "
        f"(IQR {low:.1f}-{high:.1f}): the noise of the wall figures below"
    )
    for mode in modes(args.sample):
        name = label(mode)
        per_call = [(r[mode] - r["bare"]) / hooked * 1e6 for r in rounds]
        med = statistics.median(per_call)
        traced = statistics.median(r[mode] for r in rounds)
        by_accounting = [r[f"{mode}_accounted"] / hooked * 1e6 for r in rounds]
        accounted = statistics.median(by_accounting)
        low, high = quartiles(by_accounting)
        result[name] = {
            "traced_forward_ms": round(traced * 1e3, 3),
            "us_per_hooked_call": round(med, 1),
            "us_per_hooked_call_repeats": [round(v, 1) for v in per_call],
            "us_per_hooked_call_accounting": round(accounted, 1),
            "us_per_hooked_call_accounting_iqr": [round(low, 1), round(high, 1)],
            "us_per_hooked_call_accounting_repeats": [round(v, 1) for v in by_accounting],
        }
        print(
            f"{name:12s}: traced {traced * 1e3:.2f} ms; host time per hooked call: median {med:.1f} us "
            f"(accounting {accounted:.1f} us, IQR {low:.1f}-{high:.1f}; repeats: {', '.join(f'{v:.0f}' for v in per_call)})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

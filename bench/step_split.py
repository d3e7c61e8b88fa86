"""Where a traced step's host time goes: inclusive timers on spectrace's own parts.

    python bench/step_split.py --size llama8b --shape 1x1 [--device cuda] [--json FILE]
    python bench/step_split.py --size llama8b --shape 1x1 --profile   # + torch.profiler's CUDA calls

Runs ``bench/overhead.py``'s pair (a Llama target and its EAGLE-3-shaped draft) traced in
shapes-only and statistics mode, and wraps the tracer's and the read-back's functions in
perf_counter timers (host thread only; the record worker is left alone). Each figure is the
median over steps of the milliseconds spent inside that function per step, its callees
included (``not_running``: the part of it the thread's CPU clock did not count, a wait for the
GIL or the device): the parts overlap (``_read_pending`` holds ``_note``; it runs inside
``finish_step`` and also from a hook, when a call's output cannot prove its values later).
The timers add their own cost, so the sum exceeds what ``bench/overhead.py`` accounts.
``buffers_made``: statistics buffers built so far (a steady loop builds none after its first
step). ``--profile``: the CUDA runtime calls of five steps (``cudaHostAlloc`` in a steady loop
is a buffer built again) and the host time of the spectrace parts around them.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import overhead  # noqa: E402
from host_cost import HookClock  # noqa: E402

import spectrace  # noqa: E402
from spectrace.hooks import building, engine, kept_calls, noting, readback, worker  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

PARTS = [
    (engine.Tracer, ["_keep", "_read_pending", "_note", "finish_step", "_finish_call", "_build_step"]),
    (readback.StepStats, ["add", "launch_held", "start_readback", "_hold", "_remember"]),
    # The tracer's module functions live with their job; a name imported into two modules is
    # patched in each (each module's global is what its code calls).
    (engine, ["_device_busy"]),
    (noting, ["stats_supported", "describe"]),
    (kept_calls, ["stats_supported", "describe", "collect", "collect_kwargs"]),
    (building, ["call_texts"]),
    (readback, ["_route", "launch_multi", "copy_rows", "_copy_slots"]),
    (worker.RecordWorker, ["submit", "idle", "build_landed_here"]),
]


def instrument(spent: dict[str, float], waited: dict[str, float], counts: collections.Counter[str]) -> None:
    main = threading.main_thread()
    for owner, names in PARTS:
        for name in names:
            fn = getattr(owner, name, None)
            if fn is None:  # renamed: say so, rather than leave it out of the split unnoticed
                raise SystemExit(f"step_split: {getattr(owner, '__name__', owner)}.{name} is gone; update PARTS")

            def timed(*a: Any, __fn: Any = fn, __name: str = name, **k: Any) -> Any:
                if threading.current_thread() is not main:
                    return __fn(*a, **k)
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return __fn(*a, **k)
                finally:
                    spent[__name] += time.perf_counter() - t0
                    # The same span on the thread's CPU clock: what it did not spend running
                    # (waiting for the GIL while the record worker held it, or for the device).
                    waited[__name] += (time.perf_counter() - t0) - (time.thread_time() - c0)
                    counts[__name] += 1

            setattr(owner, name, timed)


def split(models: dict[str, Any], step: Any, dev: str, steps: int) -> dict[str, Any]:
    spent: dict[str, float] = collections.defaultdict(float)
    waited: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    instrument(spent, waited, counts)
    out: dict[str, Any] = {}
    for mode in ("off", "basic"):
        with spectrace.trace(models, settings=Settings(), stats=mode) as t:
            clock = HookClock()
            clock.install(t.tracer, (m for root in models.values() for m in root.modules()))
            per, parts, waits = [], [], []
            for i in range(steps + 5):
                t.tracer.finish_step()
                if dev == "cuda":
                    torch.cuda.synchronize()
                spent.clear()
                waited.clear()
                counts.clear()
                clock.spent = 0.0
                step()
                if dev == "cuda":
                    torch.cuda.synchronize()
                if i >= 5:  # (the first steps compile, allocate and warm)
                    per.append(clock.spent * 1e3)
                    parts.append({k: v * 1e3 for k, v in spent.items()})
                    waits.append({k: v * 1e3 for k, v in waited.items()})
            t.tracer.finish_step()
        names = set().union(*parts)
        med = {k: round(statistics.median(p.get(k, 0.0) for p in parts), 4) for k in names}
        out["shapes" if mode == "off" else "stats"] = {
            "hooks_ms_per_step": round(statistics.median(per), 3),
            "parts_ms_per_step": dict(sorted(med.items(), key=lambda kv: -kv[1])),
            "not_running_ms_per_step": {
                k: round(statistics.median(w.get(k, 0.0) for w in waits), 4) for k in sorted(med, key=lambda k: -med[k])
            },
            "calls_per_step": dict(counts),
            "buffers_made": readback._pool.made,
        }
    return out


def profile(models: dict[str, Any], step: Any) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    for owner, name in [(readback, "_copy_slots"), (readback, "launch_multi"), (readback.StepStats, "start_readback")]:
        fn = getattr(owner, name)

        def ranged(*a: Any, __fn: Any = fn, __name: str = name, **k: Any) -> Any:
            with record_function("spectrace::" + __name):
                return __fn(*a, **k)

        setattr(owner, name, ranged)
    out: dict[str, Any] = {}
    for mode in ("off", "basic"):
        with spectrace.trace(models, settings=Settings(), stats=mode) as t:
            for _ in range(3):
                step()
                t.tracer.finish_step()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    step()
                    torch.cuda.synchronize()
            t.tracer.finish_step()
        rows = {}
        for e in prof.key_averages():
            if e.key.startswith(("spectrace::", "cuda")) or e.key in ("aten::copy_", "aten::empty"):
                rows[e.key] = {"calls_per_step": e.count / 5, "us_per_step": round(e.cpu_time_total / 5, 1)}
        out["shapes" if mode == "off" else "stats"] = dict(sorted(rows.items(), key=lambda kv: -kv[1]["us_per_step"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="tiny", choices=sorted(overhead.SIZES))
    p.add_argument("--shape", default="1x1", help="BATCHxTOKENS")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profile", action="store_true", help="also torch.profiler's CUDA runtime calls (CUDA only)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    batch, tokens = (int(v) for v in args.shape.split("x"))
    if args.device == "cuda":
        from spectrace.hooks import fused_stats

        fused_stats.prepare("cuda")
    target, draft, ids, aux, info = overhead.build(args.size, args.device, (batch, tokens))
    step = overhead.make_step(target, draft, ids, aux)
    models = {"target": target, "draft": draft}
    out: dict[str, Any] = {"command": "python bench/step_split.py " + " ".join(sys.argv[1:]), "model": info}
    out["machine"] = overhead.machine()
    out["split"] = split(models, step, args.device, args.steps)
    if args.profile and args.device == "cuda":
        out["profile"] = profile(models, step)
    text = json.dumps(out, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

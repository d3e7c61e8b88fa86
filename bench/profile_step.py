"""Where a traced step's host time goes: cProfile of traced steps, plus launch costs.

    python bench/profile_step.py --device cuda [--size llama8b] [--out DIR]

Prints (and writes ``profile-<device>.txt``): the host time to *enqueue* one step (no
sync) bare and traced per mode, the top functions of a cProfile of traced statistics
steps, and micro-costs of the pieces a hook pays per tensor (a Triton launch, a torch
allocation, a pydantic record). The figures to read before changing the hot path.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from overhead import build, make_step  # noqa: E402


def enqueue_ms(step, dev: str, n: int = 8) -> float:
    """Median host time of one step call, the device drained before each."""
    ts = []
    for _ in range(n):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    if dev == "cuda":
        torch.cuda.synchronize()
    return statistics.median(ts)


def micro(dev: str) -> dict[str, float]:
    from spectrace.hooks import fused_stats as S
    from spectrace.hooks.readback import StepStats
    from spectrace.records import Call, TensorMeta

    x = torch.randn(2048, 4096, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    res: dict[str, float] = {}

    def per_us(fn, n: int = 2000) -> float:
        for _ in range(20):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        v = (time.perf_counter() - t0) / n * 1e6
        if dev == "cuda":
            torch.cuda.synchronize()
        return round(v, 2)

    def step_add() -> None:
        step = StepStats()
        for _ in range(32):
            step.add(x.view(-1, 4096)[:2048])  # a new view each time: no reuse
        step.start_readback()

    res["step_stats_add_us"] = round(per_us(step_add, 50) / 32, 2)
    res["torch_empty_us"] = per_us(lambda: torch.empty(264, 5, device=dev))
    if dev == "cuda" and S.load_triton() is not None:
        out = torch.empty(4, S.programs_for(x.device), 5, device=dev, dtype=torch.float64)
        res["triton_launch_us"] = per_us(lambda: S.launch_partials(x, out, 1))
        res["fused_ok_us"] = per_us(lambda: S.fused_ok(x))
    res["tensor_meta_us"] = per_us(lambda: TensorMeta(arg="input[0]", shape=[4, 512, 4096], dtype="bfloat16", device="cuda:0"))
    meta = TensorMeta(arg="input[0]", shape=[4, 512, 4096], dtype="bfloat16", device="cuda:0")
    res["call_us"] = per_us(
        lambda: Call(
            step=1,
            seq=1,
            module="target.model.layers.0",
            module_type="LlamaDecoderLayer",
            root="target",
            inputs=[meta],
            outputs=[meta],
            t_unix=0.0,
            graph_capture=False,
        )
    )
    res["shape_list_us"] = per_us(lambda: [int(s) for s in x.shape])
    res["is_capturing_us"] = (
        per_us(lambda: torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()) if dev == "cuda" else 0.0
    )
    return res


def sweep(dev: str) -> list[str]:
    """Device time of the fused kernel per launch shape, on hidden states and logits,
    each shape's result checked against float64 (a fast wrong shape is no candidate)."""
    from spectrace.hooks import fused_stats as S
    from spectrace.hooks.tensor_stats import reduce_partials

    tensors = {
        "hidden 4x512x4096": torch.randn(4 * 512, 4096, device=dev, dtype=torch.bfloat16),
        "logits 4x512x128256": torch.randn(4 * 512, 128256, device=dev, dtype=torch.bfloat16),
        "draft logits 4x512x32000": torch.randn(4 * 512, 32000, device=dev, dtype=torch.bfloat16),
        "decode 64x4096": torch.randn(64, 4096, device=dev, dtype=torch.bfloat16),
    }
    refs = {name: (x.double().sum().item(), x.double().square().sum().item(), x.double().abs().max().item()) for name, x in tensors.items()}
    saved = (S.BLOCK, S.WARPS, S.PROGRAMS_PER_SM, S.TILE)

    def reset() -> None:
        S.forget_programs()

    lines = ["fused kernel sweep (us per launch; programs/SM, BLOCK, warps, TILE; 'BAD' = disagrees with float64):"]
    shapes = [
        (8, 1024, 4, 4),
        (8, 2048, 8, 1),
        (8, 2048, 8, 4),
        (16, 1024, 4, 4),
        (4, 2048, 8, 4),
        (8, 1024, 4, 2),
        (8, 1024, 4, 8),
        (16, 1024, 4, 8),
        (8, 512, 4, 8),
        (8, 512, 2, 8),
    ]
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(60):  # bring the clocks up first: the first shape timed would pay for it
        a @ a
    del a
    for per_sm, block, warps, tile in shapes:
        S.BLOCK, S.WARPS, S.PROGRAMS_PER_SM, S.TILE = block, warps, per_sm, tile
        reset()
        out = torch.empty(2, S.programs_for(torch.device(dev)), 5, device=dev, dtype=torch.float64)
        row = []
        for name, x in tensors.items():
            S.launch_partials(x, out, 1)
            got = reduce_partials(out[1:2])[0].tolist()
            s, q, m = refs[name]
            good = abs(got[0] - s) <= 1e-9 * (q * x.numel()) ** 0.5 and abs(got[1] - q) <= 1e-9 * q and got[2] == m
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # Keep the device busy while the host queues the 20 launches: the events then
            # time the kernels back to back, not the host's launch rate.
            torch.cuda._sleep(4_000_000)
            e0.record()
            for _ in range(20):
                S.launch_partials(x, out, 1)
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) / 20 * 1e3
            gbs = x.numel() * x.element_size() / (us * 1e-6) / 1e9
            row.append(f"{name}: {us:.1f} us ({gbs:.0f} GB/s){'' if good else ' BAD'}")
        lines.append(f"  {per_sm:>2} {block:>5} {warps} {tile}: " + "; ".join(row))
    S.BLOCK, S.WARPS, S.PROGRAMS_PER_SM, S.TILE = saved
    reset()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default=None)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--shape", help="BATCHxTOKENS input instead of the size's (a decode-like step: 64x1)")
    parser.add_argument("--sweep", action="store_true", help="time the fused kernel's launch shapes first")
    args = parser.parse_args()
    import spectrace
    from spectrace.hooks import fused_stats as S
    from spectrace.settings import Settings

    dev = args.device
    size = args.size or ("llama8b" if dev == "cuda" else "medium")
    shape = tuple(int(v) for v in args.shape.split("x")) if args.shape else None
    target, draft, ids, aux, info = build(size, dev, shape)  # type: ignore[arg-type]
    step = make_step(target, draft, ids, aux)
    models = {"target": target, "draft": draft}
    if dev == "cuda":
        S.prepare(dev)
    lines = [f"model {info}"]
    if args.sweep and dev == "cuda":
        lines += sweep(dev)
        print("\n".join(lines), flush=True)
    for _ in range(3):
        step()
    lines.append(f"enqueue bare: {enqueue_ms(step, dev):.2f} ms")
    settings = Settings()
    for mode in ("off", "basic"):
        with spectrace.trace(models, settings=settings, stats=mode) as t:
            for _ in range(3):
                step()
            lines.append(f"enqueue traced stats={mode}: {enqueue_ms(step, dev):.2f} ms ({len(t.hooked)} modules)")
            t0 = time.perf_counter()
            t.tracer.finish_step()
            lines.append(f"  drain at the end: {(time.perf_counter() - t0) * 1e3:.2f} ms")
    for key, value in micro(dev).items():
        lines.append(f"micro {key}: {value}")
    with spectrace.trace(models, settings=settings, stats="basic") as t:
        for _ in range(3):
            step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step()
            if dev == "cuda":
                torch.cuda.synchronize()
        prof.disable()
    if dev == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with spectrace.trace(models, settings=settings, stats="basic"):
            step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as kprof:
                step()
                torch.cuda.synchronize()
        lines.append("device time by kernel (one traced statistics step):")
        lines.append(kprof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
        ours = [e for e in kprof.key_averages() if "stats_partials" in e.key]
        total_us = sum(getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)) for e in kprof.key_averages())
        for e in ours:
            us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
            lines.append(
                f"statistics kernel: {e.count} launches, {us:.1f} us device time in total, {100 * us / total_us:.2f} % of the step"
            )
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(35)
    st.sort_stats("cumulative").print_stats(45)
    text = "\n".join(lines) + "\n\n" + buf.getvalue()
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"profile-{dev}.txt"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()

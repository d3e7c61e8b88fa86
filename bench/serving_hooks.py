"""Host time spectrace adds to one SGLang verify step under CUDA graphs, by accounting.

    python bench/serving_hooks.py [--steps 20000] [--batch 32]

Under CUDA graphs no per-module hook runs in replay; what runs per decode step is the
patch-point wrappers that SGLang's HookRegistry (or the import hook) puts on the graph
runners and on ``on_verify_complete_cpu``. This wraps stand-in functions with those very
wrappers (``patching._wrap`` over the real ``POINTS``), calls them in the order one
EAGLE-3 decode step does, and compares with the same functions unwrapped, in one
process, interleaved. The recorder writes JSONL as on a server. Prints us per step; a
live server's step time (docs/sglang.md, "Overhead") turns that into a fraction.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spectrace.integrations.sglang import patching, state  # noqa: E402
from spectrace.integrations.sglang.points import POINTS  # noqa: E402
from spectrace.recorder import Recorder  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

# What one EAGLE-3 decode step calls, in order (SGLang 0.5.17 with CUDA graphs).
PER_STEP = (
    ("EAGLEDraftCudaGraphRunner.execute", "draft_graph_replay", "AFTER"),
    ("DecodeCudaGraphRunner.execute", "graph_replay", "AFTER"),
    ("EAGLEWorkerV2.on_verify_complete_cpu", "acceptance", "AFTER"),
    ("EAGLEDraftExtendCudaGraphRunner.execute", "draft_extend_stale_input", "BEFORE"),
    ("EAGLEDraftExtendCudaGraphRunner.execute", "draft_extend_graph_replay", "AFTER"),
)


class EAGLEDraftCudaGraphRunner:
    def execute(self, forward_batch: object = None) -> None:
        return None


class DecodeCudaGraphRunner(EAGLEDraftCudaGraphRunner):
    pass


class EAGLEDraftExtendCudaGraphRunner(EAGLEDraftCudaGraphRunner):
    pass


class EAGLEWorkerV2:
    speculative_num_steps = 3

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        return None


def build(wrapped: bool) -> list:
    """The per-step calls as bound callables, wrapped by the real patch points or not."""
    objects = {
        "EAGLEDraftCudaGraphRunner": EAGLEDraftCudaGraphRunner(),
        "DecodeCudaGraphRunner": DecodeCudaGraphRunner(),
        "EAGLEDraftExtendCudaGraphRunner": EAGLEDraftExtendCudaGraphRunner(),
        "EAGLEWorkerV2": EAGLEWorkerV2(),
    }
    calls = []
    for qualname, feature, kind in PER_STEP:
        cls_name, method = qualname.split(".")
        obj = objects[cls_name]
        fn = getattr(type(obj), method)
        if wrapped:
            point = next(p for p in POINTS if p.feature == feature and p.kind == kind and p.qualname.endswith(method))
            fn = patching._wrap(fn, point)
        calls.append((fn, obj))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    correct = [(i * 7) % 4 for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(Settings(quiet=True), directory=d)
        state.use_recorder(rec)
        variants = {"bare": build(False), "spectrace": build(True)}

        def run(calls: list) -> float:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                for fn, obj in calls:
                    if isinstance(obj, EAGLEWorkerV2):
                        fn(obj, correct, args.batch)
                    else:
                        fn(obj, None)
            return (time.perf_counter() - t0) / args.steps * 1e6

        per: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            for name in variants if r % 2 == 0 else list(variants)[::-1]:
                per[name].append(run(variants[name]))
        rec.close()
        counters = rec.counters
    bare, traced = statistics.median(per["bare"]), statistics.median(per["spectrace"])
    print(
        f"per verify step (median of {args.rounds} rounds x {args.steps} steps, batch {args.batch}): "
        f"bare {bare:.2f} us, with spectrace's wrappers {traced:.2f} us: spectrace adds {traced - bare:.2f} us"
    )
    print(
        f"accounting (hook_seconds / hook_calls): {counters.hook_seconds / max(counters.hook_calls, 1) * 1e6:.2f} us per hook call, "
        f"{counters.hook_calls} calls; records dropped {counters.records_dropped}"
    )
    steps = args.rounds * args.steps
    split = {k: round(v / steps * 1e6, 2) for k, v in sorted(counters.hook_seconds_by_feature.items(), key=lambda kv: -kv[1])}
    print(f"by hook, us per verify step: {split}")


if __name__ == "__main__":
    main()

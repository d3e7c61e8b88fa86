"""Host time spectrace adds to one SGLang verify step under CUDA graphs, by accounting.

    python bench/serving_hooks.py [--steps 20000] [--batch 32] [--gpu-us 2000]

Under CUDA graphs no per-module hook runs in replay; what runs per decode step is the
patch-point wrappers that SGLang's HookRegistry (or the import hook) puts on
``on_verify_complete_cpu`` and the draft-extend runner, and the ``ReplayGate`` in front
of each captured graph. This wraps stand-in functions with those very wrappers
(``patching.PATCHER.wrap`` over the real ``POINTS``), puts the real gates in front of stand-in
graphs of a backend that replays as SGLang's does, calls them in the order one EAGLE-3
decode step does, and compares with the same functions ungated and unwrapped, in one
process, interleaved. The recorder writes JSONL as on a server. Prints us per step; a
live server's step time (docs/sglang.md, "Overhead") turns that into a fraction.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import weakref
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spectrace.integrations.sglang import graph_stats, patching, state  # noqa: E402
from spectrace.integrations.sglang.points import POINTS  # noqa: E402
from spectrace.recorder import Recorder  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

# What one EAGLE-3 decode step calls, in order (SGLang 0.5.17, speculative v2, CUDA graphs):
# the three graph runners replay through their FullCudaGraphBackend (each graph behind its
# ReplayGate, which also counts every replay), the draft-extend runner's execute carries the
# stale-input check, and the verify step's CPU lists reach the acceptance hook.
PER_STEP = (
    ("FullCudaGraphBackend.replay", None, None, "draft"),
    ("FullCudaGraphBackend.replay", None, None, "verify"),
    ("EAGLEWorkerV2.on_verify_complete_cpu", "acceptance", "AFTER", None),
    ("EAGLEDraftExtendCudaGraphRunner.execute", "draft_extend_stale_input", "BEFORE", None),
    ("FullCudaGraphBackend.replay", None, None, "extend"),
)
SLOTS_PER_GRAPH = 8  # the trained tiny pair's graphs hold 25 slots in all


@dataclasses.dataclass(frozen=True)
class ShapeKey:  # as SGLang's (runner/shape_key.py): a new one for every replay
    size: int
    stream_idx: int | None = None
    variant_label: str | None = None


class Runner:
    """A graph runner as graph_stats reads it: its batch size and the real one of this replay."""

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.raw_bs = bs
        self.raw_num_token = None


class Graph:
    """A captured graph on the CPU: its replay launches nothing."""

    def replay(self) -> None:
        return None


class FullCudaGraphBackend:
    """SGLang's replay, as in 0.5.17 (``runner_backend/full_cuda_graph_backend.py``)."""

    def __init__(self) -> None:
        self._graphs: dict[Any, Any] = {}
        self._outputs: dict[Any, Any] = {}

    def replay(self, shape_key: object, static_forward_batch: object = None, **kwargs: Any) -> Any:
        self._graphs[shape_key].replay()
        return self._outputs[shape_key]


class EAGLEDraftExtendCudaGraphRunner:
    def execute(self, forward_batch: object = None) -> None:
        return None


class EAGLEWorkerV2:
    speculative_num_steps = 3

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        return None


def backends(batch: int, gated: bool) -> dict[str, tuple[FullCudaGraphBackend, ShapeKey]]:
    """One captured graph per runner; ``gated``: each with a statistics table of
    SLOTS_PER_GRAPH slots and its ReplayGate (the CPU has no graphs: the capture is the slot
    bookkeeping; a replay runs no kernels)."""
    import torch

    from spectrace.hooks.graph_slots import GraphSlots

    slots = None
    if gated:
        tracer = state.tracer()
        slots = GraphSlots("cpu", fused=False, sample=int(os.environ.get("BENCH_SAMPLE", "64")), ring=graph_stats.RING)
        tracer.graph_slots = slots
        graph_stats._slots.append(slots)
    hidden = torch.randn(batch, 64)
    out = {}
    for name in ("draft", "verify", "extend"):
        backend, key = FullCudaGraphBackend(), ShapeKey(batch)
        backend._graphs[key], backend._outputs[key] = Graph(), None
        out[name] = (backend, key)
        if slots is None:
            continue
        runner = Runner(batch)
        backend.runner = runner  # type: ignore[attr-defined]  # alive as long as the backend (graph_stats keeps a weakref)
        graph_stats._runners[id(backend)] = weakref.ref(runner)
        slots.begin_capture(graph_stats.table_key(backend, key), capture_bs=batch, label=f"{name}[{batch}]", meta={"mode": "DECODE"})
        for i in range(SLOTS_PER_GRAPH):
            slots.record(hidden, name=f"{name}.m{i}", role="hidden", module_type="Linear", arg="output")
        graph_stats.wrap_graph(backend, key, slots.end_capture(), slots)
    return out


def build(wrapped: bool, batch: int) -> list:
    """The per-step calls as (callable, args), wrapped by the real patch points and gated, or not."""
    worker, extend_runner = EAGLEWorkerV2(), EAGLEDraftExtendCudaGraphRunner()
    graphs = backends(batch, gated=wrapped)
    correct = [(i * 7) % 4 for i in range(batch)]
    calls = []
    for qualname, feature, kind, graph in PER_STEP:
        cls_name, method = qualname.split(".")
        classes = {"FullCudaGraphBackend": FullCudaGraphBackend, "EAGLEDraftExtendCudaGraphRunner": EAGLEDraftExtendCudaGraphRunner}
        cls = classes.get(cls_name, EAGLEWorkerV2)
        fn = getattr(cls, method)
        if wrapped and feature is not None:
            point = next(p for p in POINTS if p.feature == feature and p.kind == kind and p.qualname.endswith(method))
            fn = patching.PATCHER.wrap(fn, point)
        if graph is not None:
            backend, key = graphs[graph]
            calls.append((fn, (backend, key, None)))
        elif cls is EAGLEWorkerV2:
            calls.append((fn, (worker, correct, batch)))
        else:
            calls.append((fn, (extend_runner, None)))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    # A server's step waits on the GPU (the GIL released) between its host work: the record
    # worker builds then. Without a wait the worker competes with every hook for the GIL
    # at a replay rate no server reaches; 0 runs the steps back to back anyway.
    parser.add_argument("--gpu-us", type=float, default=2000.0, help="the GPU wait of one step, slept (default 2000)")
    args = parser.parse_args()
    gpu_s = args.gpu_us / 1e6
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(Settings(quiet=True), directory=d)
        state.use_recorder(rec)
        variants = {"bare": build(False, args.batch), "spectrace": build(True, args.batch)}

        def run(calls: list) -> float:
            spent = 0.0
            for _ in range(args.steps):
                t0 = time.perf_counter()
                for fn, fn_args in calls:
                    fn(*fn_args)
                spent += time.perf_counter() - t0
                if gpu_s:
                    time.sleep(gpu_s)
            return spent / args.steps * 1e6  # the host part of a step, the GPU wait left out

        per: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            for name in variants if r % 2 == 0 else list(variants)[::-1]:
                per[name].append(run(variants[name]))
        graph_stats._flush_cost()
        rec.close()
        counters = rec.counters
        readbacks, dropped = counters.graph_readbacks, counters.graph_readbacks_dropped
    bare, traced = statistics.median(per["bare"]), statistics.median(per["spectrace"])
    print(
        f"per verify step (median of {args.rounds} rounds x {args.steps} steps, batch {args.batch}, GPU wait {args.gpu_us:.0f} us): "
        f"bare {bare:.2f} us, with spectrace's wrappers {traced:.2f} us: spectrace adds {traced - bare:.2f} us"
    )
    print(
        f"accounting (hook_seconds / hook_calls): {counters.hook_seconds / max(counters.hook_calls, 1) * 1e6:.2f} us per hook call, "
        f"{counters.hook_calls} calls; records dropped {counters.records_dropped}"
    )
    steps = args.rounds * args.steps
    split = {k: round(v / steps * 1e6, 2) for k, v in sorted(counters.hook_seconds_by_feature.items(), key=lambda kv: -kv[1])}
    print(f"by hook, us per verify step: {split}")
    print(f"graph replays traced {counters.graph_replays_traced}, read back {readbacks}, dropped {dropped}")


if __name__ == "__main__":
    main()

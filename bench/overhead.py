"""spectrace overhead: every mode and both anchors on one model, in one process, interleaved.

    python bench/overhead.py --device cpu               # medium CPU model (8 layers, hidden 1024, seq 256)
    python bench/overhead.py --device cuda              # Llama-8B-shaped target + EAGLE-3 draft, bf16, 4x512
    python bench/overhead.py --device cpu --quick       # CI smoke: tiny model, 2 rounds

Variants, timed round-robin (each round runs every variant once, ``--reps`` forwards each):

- ``bare``: no spectrace at all;  ``off``: spectrace imported, ``SPECTRACE`` unset, hooks
  counted (must be 0): the spread of off/bare is the noise floor of the run;
- ``shapes``: ``spectrace.trace(..., stats="off")``;  ``stats``: ``stats="basic"``;
- with ``--sample N``: ``shapes_sampleN`` and ``stats_sampleN``, every Nth step traced
  (``SPECTRACE_SAMPLE=N``), each sample the mean of N consecutive steps (one traced);
- with ``--budget F``: ``stats_budget`` (``SPECTRACE_BUDGET=F``, steps traced one in N,
  N measured), each sample the mean of ``BUDGET_BLOCK`` steps after ``BUDGET_WARMIN``
  untimed ones per round (the budget's first estimates); the interval it chose and the
  cost it measured are kept beside the table;
- ``--variants a,b``: only these (bare is always run);
- anchors: ``.item()`` statistics hooks on the same modules, and
  ``torch.profiler(record_shapes=True)`` around the same step.

Ratios are per round (variant median / bare median of that round), then the median over
rounds. On CUDA also: a host-sync check of a traced forward, and the graph-safe section
(a captured 32-layer decode step, bare replay vs replay with in-graph statistics, refresh
on new inputs, values vs float64). Then the ``.pth`` bootstrap cost and a memory soak.
Writes ``overhead.md`` and ``overhead.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
for _name in [n for n in os.environ if n.startswith("SPECTRACE")]:
    del os.environ[_name]  # "off" means: installed, SPECTRACE unset

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

# --------------------------------------------------------------------------- models
SIZES = {
    # name: (layers, hidden, intermediate, heads, kv_heads, vocab, draft_vocab, batch, seq, dtype)
    "tiny": (2, 64, 128, 4, 2, 256, 128, 1, 16, "float32"),
    "medium": (8, 1024, 2816, 16, 8, 32000, 16000, 1, 256, "float32"),
    # a host-bound CPU step: its decode-like steps take a few ms, most of it Python
    "small": (8, 256, 704, 8, 4, 4096, 2048, 1, 64, "float32"),
    "llama8b": (32, 4096, 14336, 32, 8, 128256, 32000, 4, 512, "bfloat16"),
}


class Eagle3BenchDraft(nn.Module):
    """An EAGLE-3-shaped draft: fc (3h -> h) over three target layers, one Llama decoder
    layer, norm, and a draft-vocab lm_head (the attention reads h, not SGLang's 2h)."""

    def __init__(self, cfg: Any, draft_vocab: int) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        h = cfg.hidden_size
        one = LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1})
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.model = LlamaModel(one)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(aux) + self.model.embed_tokens(input_ids)
        out = self.model(inputs_embeds=hidden, use_cache=False).last_hidden_state
        return self.lm_head(out)


def build(
    size: str, device: str, shape: tuple[int, int] | None = None
) -> tuple[nn.Module, nn.Module, torch.Tensor, list[int], dict[str, Any]]:
    """The target, the draft, the input ids and the aux layers; ``shape`` (batch, tokens)
    overrides the size's input (a decode-like step is ``(64, 1)`` or ``(1, 1)``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter, heads, kv, vocab, dvocab, batch, seq, dtype = SIZES[size]
    if shape is not None:
        batch, seq = shape
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=max(4096, seq),
    )
    dt = getattr(torch, dtype)
    with torch.device(device):
        target = LlamaForCausalLM(cfg).to(dt).eval()
        draft = Eagle3BenchDraft(cfg, dvocab).to(dt).eval()
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    aux = sorted({min(1, layers - 1), layers // 2 - 1 if layers > 2 else 0, layers - 3 if layers > 3 else layers - 1})
    while len(aux) < 3:
        aux.append(aux[-1])
    info = {
        "size": size,
        "layers": layers,
        "hidden": hidden,
        "intermediate": inter,
        "vocab": vocab,
        "draft_vocab": dvocab,
        "batch": batch,
        "seq": seq,
        "dtype": dtype,
        "aux_layers": aux,
        "draft": f"fc {3 * hidden}->{hidden}, 1 decoder layer, lm_head {hidden}->{dvocab}",
    }
    return target, draft, ids, aux, info


def make_step(target: nn.Module, draft: nn.Module, ids: torch.Tensor, aux: list[int]) -> Callable[[], None]:
    @torch.no_grad()
    def step() -> None:
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        draft(ids, torch.cat([hs[i + 1] for i in aux], dim=-1))

    return step


# -------------------------------------------------------------------------- anchors
def item_stats_hooks(modules: list[nn.Module]) -> Callable[[], None]:
    """The naive approach: statistics with ``.item()`` in every hook (a sync each)."""

    def hook(_m: nn.Module, _a: Any, out: Any) -> None:
        o = out
        while isinstance(o, (tuple, list)):
            o = o[0]
        if hasattr(o, "logits"):
            o = o.logits
        elif hasattr(o, "last_hidden_state"):
            o = o.last_hidden_state
        if isinstance(o, torch.Tensor) and o.is_floating_point():
            f = o.detach().float()
            _ = (tuple(o.shape), f.mean().item(), f.std().item(), f.abs().max().item(), bool(torch.isnan(f).any().item()))

    handles = [m.register_forward_hook(hook) for m in modules]
    return lambda: [h.remove() for h in handles]


def empty_hooks(modules: list[nn.Module]) -> Callable[[], None]:
    """The floor of any tracer built on module hooks: a pre-hook and a forward hook that do
    nothing, registered as spectrace registers its own (with kwargs). What torch's call
    path costs once a module has hooks at all."""

    def pre(_m: nn.Module, _a: Any, _k: Any) -> None:
        return None

    def post(_m: nn.Module, _a: Any, _k: Any, _o: Any) -> None:
        return None

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in modules]
    handles += [m.register_forward_hook(post, with_kwargs=True) for m in modules]
    return lambda: [h.remove() for h in handles]


def count_hooks(*roots: nn.Module) -> int:
    """Hooks and forward wrappers owned by spectrace (transformers adds its own; not counted)."""

    def ours(fn: Any) -> bool:
        return str(getattr(fn, "__module__", "") or "").startswith("spectrace")

    n = 0
    for root in roots:
        for m in root.modules():
            n += sum(ours(f) for f in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))
            n += int("forward" in m.__dict__)
            n += int(bool(getattr(type(m).forward, "__spectrace_call_wrapper__", False)))  # a class's forward wrapped
    glob = (*nn.modules.module._global_forward_hooks.values(), *nn.modules.module._global_forward_pre_hooks.values())
    return n + sum(ours(f) for f in glob)


# --------------------------------------------------------------------------- timing
def timer(device: str) -> Callable[[Callable[[], None]], float]:
    def run(fn: Callable[[], None]) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    return run


DECODE_SHAPES = ((64, 1), (1, 1))  # batch x tokens: one new token per sequence, no KV context


# --budget: steps per timed sample, and untimed steps per round before the first sample (a
# budget alternates traced and untraced steps for its first 7, then settles its interval).
BUDGET_BLOCK = 16
BUDGET_WARMIN = 48


def decode_section(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The eager bench on decode-like steps: one token per sequence, so a step is short and
    host-bound and every microsecond a hook spends shows (prefill hides it behind the GPU).
    No KV context: attention over a context would only add device time."""
    results = out.setdefault("decode", {})
    for batch, tokens in DECODE_SHAPES:
        sub: dict[str, Any] = {}
        eager_section(args, sub, shape=(batch, tokens))
        results[f"{batch}x{tokens}"] = sub


def eager_section(args: argparse.Namespace, out: dict[str, Any], shape: tuple[int, int] | None = None) -> None:
    import spectrace
    from spectrace.hooks import fused_stats as S
    from spectrace.settings import Settings

    dev = args.device
    size = "tiny" if args.quick else ("llama8b" if dev == "cuda" else "medium")
    size = args.size or size
    target, draft, ids, aux, info = build(size, dev, shape)
    out["model"] = info
    step = make_step(target, draft, ids, aux)
    models = {"target": target, "draft": draft}
    fused = S.prepare(dev) if dev == "cuda" else False
    out["engine"] = {"fused_stats_kernel": fused}
    settings = Settings()  # SPECTRACE unset: defaults (record cap 100k, stats basic)
    assert not settings.enabled

    # Which modules spectrace hooks: the anchor uses the same set.
    with spectrace.trace(models, settings=settings, stats="off") as probe:
        hooked = list(probe.hooked)
    named = {f"{p}.{n}": m for p, root in models.items() for n, m in root.named_modules() if n}
    anchor_modules = [named[n] for n in hooked if n in named]
    out["hooked_modules"] = len(hooked)
    assert count_hooks(target, draft) == 0, "hooks left behind"

    time_one = timer(dev)
    samples: dict[str, list[list[float]]] = {}

    def run_variant(name: str, reps: int) -> None:
        ts: list[float] = []
        if name in ("bare", "off"):
            if name == "off":
                out["off_hooks"] = count_hooks(target, draft)
            for _ in range(args.variant_warmup):
                step()
            ts = [time_one(step) for _ in range(reps)]
        elif name in ("shapes", "stats", "shapes_at_once", "stats_at_once"):
            from spectrace.hooks import engine

            kept = engine.PENDING_CALLS
            if name.endswith("_at_once"):
                engine.PENDING_CALLS = 1  # each call noted at its hook: what keeping calls saves
            try:
                with spectrace.trace(models, settings=settings, stats="off" if name.startswith("shapes") else "basic") as t:
                    for _ in range(args.variant_warmup):
                        step()
                    ts = [time_one(step) for _ in range(reps)]
                    t.tracer.finish_step()
            finally:
                engine.PENDING_CALLS = kept
                if name == "stats":
                    calls = t.calls()
                    out["stats_filled"] = sum(m.stats is not None for c in calls[-len(hooked) :] for m in c.outputs)
        elif "_sample" in name:  # --sample N: every Nth step traced; a sample is the mean of N steps
            n = args.sample

            def steps() -> None:
                for _ in range(n):
                    step()
                    if dev == "cuda":
                        torch.cuda.synchronize()  # (as time_one does after each step)

            with spectrace.trace(models, settings=Settings(sample=n), stats="off" if name.startswith("shapes") else "basic") as t:
                for _ in range(args.variant_warmup):
                    step()
                ts = [time_one(steps) / n for _ in range(reps)]
                t.tracer.finish_step()
        elif name == "stats_budget":

            def block() -> None:
                for _ in range(BUDGET_BLOCK):
                    step()
                    if dev == "cuda":
                        torch.cuda.synchronize()  # (as time_one does after each step)

            with spectrace.trace(models, settings=Settings(budget=args.budget), stats="basic") as t:
                for _ in range(BUDGET_WARMIN):
                    step()
                ts = [time_one(block) / BUDGET_BLOCK for _ in range(reps)]
                t.tracer.finish_step()
                budget = t.tracer.budget
                chosen = out.setdefault("budget", {"fraction": args.budget, "interval": [], "cost_ms": [], "period_ms": []})
                chosen["interval"].append(budget.interval)
                chosen["cost_ms"].append(round(budget.cost() * 1e3, 3))
                chosen["period_ms"].append(round(budget.period() * 1e3, 3))
        elif name in ("anchor_empty_hooks", "anchor_item_hooks"):
            remove = (empty_hooks if name == "anchor_empty_hooks" else item_stats_hooks)(anchor_modules)
            try:
                for _ in range(args.variant_warmup):
                    step()
                ts = [time_one(step) for _ in range(reps)]
            finally:
                remove()
        elif name == "anchor_profiler_record_shapes":
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])

            def prof_step() -> None:
                with profile(activities=acts, record_shapes=True):
                    step()

            for _ in range(args.variant_warmup):
                prof_step()
            ts = [time_one(prof_step) for _ in range(max(1, reps // 2))]
        samples.setdefault(name, []).append(ts)

    # *_at_once: the same, each call noted at its hook instead of kept for one read (engine.PENDING_CALLS)
    variants = [
        "bare",
        "off",
        "shapes",
        "shapes_at_once",
        "stats",
        "stats_at_once",
        "anchor_empty_hooks",
        "anchor_item_hooks",
        "anchor_profiler_record_shapes",
    ]
    if args.sample > 1:
        variants += [f"shapes_sample{args.sample}", f"stats_sample{args.sample}"]
    if args.budget:
        variants.append("stats_budget")
    if args.variants:
        unknown = set(args.variants) - set(variants)
        if unknown:
            raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))} (known: {', '.join(variants)})")
        variants = ["bare"] + [v for v in variants if v in args.variants and v != "bare"]
    for _ in range(3):
        step()  # warm-up: allocator, kernels, first-use compiles
    t_start = time.perf_counter()
    for rnd in range(args.rounds):
        # Every variant takes every position equally often (bare included): with bare
        # always first, "off" (the same code as bare) read 1.010x, a position bias.
        shift = (rnd // 2) % len(variants)
        order = variants[shift:] + variants[:shift]
        if rnd % 2:
            order = order[::-1]
        for name in order:
            run_variant(name, args.reps)
    out["eager_seconds"] = round(time.perf_counter() - t_start, 1)
    assert count_hooks(target, draft) == 0, "hooks left behind"

    table = {}
    bare_rounds = [statistics.median(r) for r in samples["bare"]]
    bare_min = min(t for r in samples["bare"] for t in r)
    for name in variants:
        meds = [statistics.median(r) for r in samples[name]]
        ratios = [m / b for m, b in zip(meds, bare_rounds)]
        q1, q3 = quartiles(ratios)
        table[name] = {
            "ms": round(statistics.median([t for r in samples[name] for t in r]), 3),
            "ratio": round(statistics.median(ratios), 4),
            "ratio_q1": q1,
            "ratio_q3": q3,
            "ratio_of_mins": round(min(t for r in samples[name] for t in r) / bare_min, 4),
            "samples": sum(len(r) for r in samples[name]),
        }
    out["eager"] = table
    out["rounds"], out["reps"] = args.rounds, args.reps

    out["hook_time"] = hook_time(spectrace, models, settings, step, dev, 3 if args.quick else 10, args.sample, args.budget)
    bare_ms = table["bare"]["ms"]
    for mode, ms in out["hook_time"].items():
        out["hook_time"][mode] = {"ms_per_step": ms, "x_of_bare_median": round(1 + ms / bare_ms, 4)}
    if dev == "cuda":
        out["sync_check"] = sync_check(spectrace, models, settings, step)
    del target, draft
    if dev == "cuda":
        torch.cuda.empty_cache()


def hook_time(
    spectrace: Any,
    models: dict[str, nn.Module],
    settings: Any,
    step: Callable[[], None],
    dev: str,
    steps: int,
    sample: int = 1,
    budget: float = 0.0,
) -> dict[str, Any]:
    """Host time spent inside spectrace per step, by accounting, on each thread.

    On the host's thread: every spectrace hook and the tracer's finish_step, wrapped in a
    perf_counter timer (a finish_step that builds the records of earlier steps whose
    statistics have landed counts that build here). On the record worker: the time it
    spends building records (``thread_time``, CPU only: its waits for the statistics copy
    are not counted). Each figure is the mean over ``steps`` consecutive steps (a device
    sync after each, as the timed loop does), the median of three such runs; the step still
    queued after a run is built by the worker, on its count. With ``sample`` N > 1 also
    ``shapes_sampleN`` and ``stats_sampleN`` (every Nth step traced), over a whole number
    of N steps; with ``budget`` also ``stats_budget``, over ``BUDGET_WARMIN`` steps after as
    many untimed ones.
    """
    import threading

    result: dict[str, Any] = {}
    from spectrace.hooks import engine

    kept = engine.PENDING_CALLS
    sampled = (f"off_sample{sample}", f"basic_sample{sample}") if sample > 1 else ()
    for mode in ("off", "basic", "off_at_once", "basic_at_once", *sampled, *(("basic_budget",) if budget else ())):
        engine.PENDING_CALLS = 1 if mode.endswith("_at_once") else kept  # at_once: each call noted at its hook
        n = sample if "_sample" in mode else 1
        run_steps = -(-steps // n) * n
        chosen = dataclasses.replace(settings, sample=n)
        if mode == "basic_budget":
            chosen, run_steps = dataclasses.replace(settings, budget=budget), BUDGET_WARMIN
        with spectrace.trace(models, settings=chosen, stats=mode.split("_")[0]) as t:
            from host_cost import HookClock

            clock, worker_clock = HookClock(), HookClock(time.thread_time)
            clock.install(t.tracer, (m for root in models.values() for m in root.modules()))
            worker = getattr(t.tracer, "_worker", None)
            if worker is not None:
                build, timed_build = worker._build, worker_clock.timed(worker._build)
                # The thread's builds only: a host's own builds are inside its finish_step.
                worker._build = lambda item: (timed_build if threading.current_thread() is worker._thread else build)(item)
            per, per_worker = [], []
            for _ in range(BUDGET_WARMIN if mode == "basic_budget" else 1):
                step()
            for _ in range(3):
                t.tracer.finish_step()  # the worker is idle before each measured run
                clock.spent = worker_clock.spent = 0.0
                for _ in range(run_steps):
                    step()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                per.append(clock.spent * 1e3 / run_steps)
                t.tracer.finish_step()  # (its wait for the worker is not host work: not counted)
                per_worker.append(worker_clock.spent * 1e3 / run_steps)
        engine.PENDING_CALLS = kept
        name = mode.replace("off", "shapes", 1).replace("basic", "stats", 1)
        result[name] = round(statistics.median(per), 3)
        result[f"{name}_worker_thread"] = round(statistics.median(per_worker), 3)
    return result


def sync_check(spectrace: Any, models: dict[str, nn.Module], settings: Any, step: Callable[[], None]) -> dict[str, Any]:
    """Count host syncs of a bare and of a traced forward (warn mode), then try 'error' mode."""

    def syncs(fn: Callable[[], None]) -> tuple[int, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        hits = [w for w in caught if "synchroniz" in str(w.message)]
        return len(hits), sorted(
            {
                f"{os.path.relpath(w.filename, ROOT) if w.filename.startswith(ROOT) else os.path.basename(w.filename)}:{w.lineno}"
                for w in hits
            }
        )

    result: dict[str, Any] = {}
    torch.cuda.synchronize()
    result["bare_syncs"], result["bare_sites"] = syncs(step)
    with spectrace.trace(models, settings=settings, stats="basic") as t:
        step()
        t.tracer.finish_step()
        torch.cuda.synchronize()
        result["traced_syncs"], result["traced_sites"] = syncs(step)
        try:
            torch.cuda.set_sync_debug_mode("error")
            step()
            result["error_mode"] = "passed: no synchronizing call inside the traced forward"
        except RuntimeError as exc:
            result["error_mode"] = f"raised: {str(exc).splitlines()[0][:160]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
        calls = t.calls()  # reading drains the deferred copies (a sync here is fine)
        # The last whole step's float outputs (the error-mode step stops at its first sync);
        # an embedding's output is a function of one token id each row: none by design.
        whole = [c for c in calls if c.step == calls[-1].step - 1] if calls else []
        floats = [m for c in whole if "embed" not in c.module for m in c.outputs if m.dtype != "int64"]
        result["stats_filled_after_drain"] = bool(floats) and all(m.stats is not None for m in floats)
    result["spectrace_added_syncs"] = result["traced_syncs"] - result["bare_syncs"]
    return result


# ---------------------------------------------------------------------- graph-safe
def graph_section(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """A Llama-8B-shaped decode step (32 layers, matmuls only, bf16) captured as a CUDA graph."""
    from spectrace.hooks import fused_stats as S
    from spectrace.hooks import graph_slots as GS
    from spectrace.hooks.graph_slots import GraphSlots
    from spectrace.hooks.graphsafe import GraphStats

    dev, dt = "cuda", torch.bfloat16
    L, H, I = (4, 256, 512) if args.quick else (32, 4096, 14336)
    torch.manual_seed(0)
    # Scaled by 1/sqrt(fan-in) so 32 residual layers stay finite in bf16 (0.02 overflowed).
    W = [
        (
            torch.randn(H, 3 * H // 2, device=dev, dtype=dt) * (0.5 / H**0.5),
            torch.randn(H, H, device=dev, dtype=dt) * (0.5 / H**0.5),
            torch.randn(H, 2 * I, device=dev, dtype=dt) * (0.5 / H**0.5),
            torch.randn(I, H, device=dev, dtype=dt) * (0.5 / I**0.5),
        )
        for _ in range(L)
    ]

    def layer(x: torch.Tensor, w: tuple[torch.Tensor, ...]) -> torch.Tensor:
        a = (x @ w[0])[:, :H]
        x = x + a @ w[1]
        g, u = (x @ w[2]).chunk(2, -1)
        return x + (torch.nn.functional.silu(g) * u) @ w[3]

    res: dict[str, Any] = {"layers": L, "hidden": H, "fused_kernel": S.prepare(dev)}
    for batch in (1, 64):
        x0 = torch.randn(batch, H, device=dev, dtype=dt)
        stores = {
            "fused": GraphStats(2 * L + 1, dev),
            "fused_overlap": GraphStats(2 * L + 1, dev),
            "torch": GraphStats(2 * L + 1, dev, fused=False),
        }
        kept: dict[str, list[torch.Tensor]] = {}

        def step(gs: GraphStats | None, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
            x = x0
            for i, w in enumerate(W):
                x = layer(x, w)
                if gs is not None:
                    gs.record(f"layers.{i}", x)
                if keep is not None:
                    keep.append(x)  # keeps the graph pool from reusing it, for validation
            return x

        def warm_up(gs: GraphStats | None) -> None:
            # Three eager steps on a side stream before a capture, as torch's graph docs do.
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step(gs)
            torch.cuda.current_stream().wait_stream(s)

        def capture(gs: GraphStats | None, name: str, overlap: bool = False) -> torch.cuda.CUDAGraph:
            warm_up(gs)
            g = torch.cuda.CUDAGraph()
            keep: list[torch.Tensor] = []
            with torch.cuda.graph(g):
                if overlap and gs is not None:
                    with gs.overlapped():  # the kernels on a side branch of the graph
                        step(gs, keep)
                else:
                    step(gs, keep)
            kept[name] = keep
            return g

        graphs = {
            "bare": capture(None, "bare"),
            "bare_control": capture(None, "bare_control"),  # the same graph again: the run's noise floor
            "stats_fused": capture(stores["fused"], "stats_fused"),
            "stats_fused_overlap": capture(stores["fused_overlap"], "stats_fused_overlap", overlap=True),
            "stats_torch": capture(stores["torch"], "stats_torch"),
        }

        def capture_slots(name: str, overlap: bool = False) -> GraphSlots:
            # The serving integrations' path (hooks/graph_slots.py): masked kernels into one
            # graph's table, the rows of every replay read (the worst case: between two
            # read-backs the kernels read none). overlap=True: the kernels on a side branch
            # (graph_branch: only where nothing writes a recorded tensor in place, which
            # this step's functional layers do not).
            slots = GraphSlots(dev, capacity=2 * L + 1, sample=1, overlap=overlap)
            slots.warm(x0)
            warm_up(None)
            graphs[name] = torch.cuda.CUDAGraph()
            kept[name] = []
            with torch.cuda.graph(graphs[name]):
                slots.begin_capture(name, capture_bs=batch, label=name)
                x = x0
                for i, w in enumerate(W):
                    x = layer(x, w)
                    slots.record(x, name=f"layers.{i}", role="hidden", module_type="Layer", arg="output")
                    kept[name].append(x)
                slots.end_capture()
            slots.tables[name].real_bs.fill_(batch)
            return slots

        slots = capture_slots("slots")
        branch = capture_slots("slots_branch", overlap=True)
        # Two captures of one step differ by a steady 1-1.5 % at batch 1 (where the graph's
        # memory lands): --graph-captures K captures bare and the slots K times each, and
        # `pooled` compares the medians of the captures, round by round.
        pooled_slots = {"slots": slots}
        for i in range(2, args.graph_captures + 1):
            if i > 2:
                graphs[f"bare_c{i}"] = capture(None, f"bare_c{i}")
            pooled_slots[f"slots_c{i}"] = capture_slots(f"slots_c{i}")
        # Launch shapes to compare (--graph-blocks): the fewest blocks per program, fixed
        # at capture, in the same interleaved rounds.
        swept: dict[str, GraphSlots] = {}
        # (each module has its own default; a swept value equal to both is the default run)
        default_blocks = (S.MIN_BLOCKS_PER_PROGRAM, GS.MIN_BLOCKS_PER_PROGRAM)
        for blocks in args.graph_blocks:
            if blocks == default_blocks[0] == default_blocks[1]:
                continue
            S.MIN_BLOCKS_PER_PROGRAM = GS.MIN_BLOCKS_PER_PROGRAM = blocks
            try:
                stores[f"fused_b{blocks}"] = GraphStats(2 * L + 1, dev)
                graphs[f"stats_fused_b{blocks}"] = capture(stores[f"fused_b{blocks}"], f"stats_fused_b{blocks}")
                swept[f"slots_b{blocks}"] = capture_slots(f"slots_b{blocks}")
            finally:
                S.MIN_BLOCKS_PER_PROGRAM, GS.MIN_BLOCKS_PER_PROGRAM = default_blocks

        # The size below which the serving slots take the narrow launch (--graph-small).
        default_small = GS.SMALL_ELEMENTS
        for small in args.graph_small:
            if small == default_small:
                continue
            GS.SMALL_ELEMENTS = small
            try:
                swept[f"slots_small{small}"] = capture_slots(f"slots_small{small}")
            finally:
                GS.SMALL_ELEMENTS = default_small

        def time_graph(g: torch.cuda.CUDAGraph, n: int) -> float:
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                g.replay()
            e1.record()
            torch.cuda.synchronize()
            return e0.elapsed_time(e1) / n

        n = 20 if args.quick else 100
        rows: dict[str, list[float]] = {k: [] for k in graphs}
        names = list(graphs)
        for r in range(args.graph_rounds):
            # Each round starts at another variant: a fixed order gave the first one (bare)
            # a steady 1 % of its own against the same graph captured again.
            for k in names[r % len(names) :] + names[: r % len(names)]:
                rows[k].append(time_graph(graphs[k], n))
        entry: dict[str, Any] = {
            "replay_ms": {k: round(statistics.median(v), 4) for k, v in rows.items()},
            "ratio": {k: round(statistics.median([a / b for a, b in zip(v, rows["bare"])]), 4) for k, v in rows.items()},
            "ratio_iqr": {k: quartiles([a / b for a, b in zip(v, rows["bare"])]) for k, v in rows.items()},
        }
        # Refresh and validation, per store: replay, read, compare with float64 of the graph's own tensors.
        checked = [("fused", "stats_fused"), ("fused_overlap", "stats_fused_overlap"), ("torch", "stats_torch")] + [
            (k, f"stats_{k}") for k in stores if k.startswith("fused_b")
        ]
        for key, gname in checked:
            gs, g = stores[key], graphs[gname]
            g.replay()
            first = gs.read()
            errs = validate(first, kept[gname])
            x0.mul_(3.0).add_(0.5)
            g.replay()
            second = gs.read()
            errs2 = validate(second, kept[gname])
            changed = sum(first[k].mean != second[k].mean or first[k].std != second[k].std for k in first)
            entry[f"{key}_refresh"] = f"{changed}/{len(first)} slots changed after new inputs"
            entry[f"{key}_vs_float64"] = {k: max(errs[k], errs2[k]) for k in errs}
            x0.sub_(0.5).div_(3.0)
        if args.graph_captures > 1:
            bare_names = ["bare", "bare_control"] + [f"bare_c{i}" for i in range(3, args.graph_captures + 1)]
            ref = [statistics.median(rows[k][r] for k in bare_names) for r in range(args.graph_rounds)]
            ratios = [statistics.median(rows[k][r] for k in pooled_slots) / ref[r] for r in range(args.graph_rounds)]
            entry["pooled"] = {
                "bare_captures": bare_names,
                "slots_captures": list(pooled_slots),
                "slots_ratio": round(statistics.median(ratios), 4),
                "slots_ratio_iqr": quartiles(ratios),
                # each capture against the pooled bare: how far one capture alone may lie
                "each_capture_ratio": {
                    k: round(statistics.median(a / b for a, b in zip(rows[k], ref)), 4) for k in bare_names + list(pooled_slots)
                },
            }
        for name, table in {"slots": slots, "slots_branch": branch, **swept, **pooled_slots}.items():
            assert table.before_replay(name, batch)
            graphs[name].replay()
            assert table.after_replay(name, {})
            torch.cuda.synchronize()
            (readout,) = table.poll()
            worst = 0.0
            for info in readout.table.slots:
                want = float(kept[name][info.index].double().std(unbiased=False))
                worst = max(worst, abs(table.stats_of(readout, info)["std"] - want) / max(want, 1e-30))
            entry[f"{name}_vs_float64_std_rel"] = worst
        res[f"batch_{batch}"] = entry
        del graphs, kept
        torch.cuda.synchronize()
    out["graph"] = res


def quartiles(values: list[float]) -> list[float]:
    """[first, third] quartile of ``values`` (rounded), as the eager tables report them."""
    ordered = sorted(values)
    q = len(ordered) // 4
    return [round(ordered[q], 4), round(ordered[-1 - q], 4)]


def validate(got: dict[str, Any], tensors: list[torch.Tensor]) -> dict[str, float]:
    """Worst errors of GraphStats values against float64 statistics of the same tensors."""
    # The mean is compared relative to the std (an absolute error means nothing for a
    # residual stream of magnitude 1e4); std and absmax relative to themselves.
    worst = {"mean_err_over_std": 0.0, "std_rel": 0.0, "absmax_rel": 0.0, "counts_wrong": 0}
    for i, t in enumerate(tensors):
        s = got[f"layers.{i}"]
        r = t.double()
        if None in (s.mean, s.std, s.absmax):
            worst["counts_wrong"] += int(bool(torch.isfinite(r).all()))  # None is right only for non-finite data
            continue
        worst["mean_err_over_std"] = max(
            worst["mean_err_over_std"], abs(s.mean - r.mean().item()) / max(r.std(unbiased=False).item(), 1e-30)
        )
        worst["std_rel"] = max(worst["std_rel"], abs(s.std - r.std(unbiased=False).item()) / max(r.std().item(), 1e-30))
        worst["absmax_rel"] = max(worst["absmax_rel"], abs(s.absmax - r.abs().max().item()) / max(r.abs().max().item(), 1e-30))
        worst["counts_wrong"] += int(s.nan != int(torch.isnan(r).sum()) or s.inf != int(torch.isinf(r).sum()))
    return {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in worst.items()}


# ------------------------------------------------------------------------ bootstrap
def bootstrap_section(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """What the .pth line costs each interpreter start when SPECTRACE is unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    runs = 5 if args.quick else 30
    pth = os.path.join(ROOT, "bootstrap", "spectrace-bootstrap.pth")
    # Time the .pth line itself, as site.py runs it (exec of one line) at every start.
    probe = (
        "import sys,time;line=open(sys.argv[1]).read();"
        "t=time.perf_counter_ns();exec(line);d=time.perf_counter_ns()-t;"
        "print(int('spectrace' in sys.modules),d)"
    )
    ns, imported = [], False
    for _ in range(runs):
        line = subprocess.run([sys.executable, "-c", probe, pth], env=env, capture_output=True, text=True, check=True).stdout.split()
        imported = imported or line[0] == "1"
        ns.append(int(line[1]))
    installed, where = imported, pth

    # whole interpreter start, with and without the .pth being processed
    def start_ms(extra: list[str]) -> float:
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *extra, "-c", "pass"], env=env, check=True)
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    out["bootstrap"] = {
        "pth": where,
        "pth_line_us_median": round(statistics.median(ns) / 1e3, 2),
        "pth_line_us_max": round(max(ns) / 1e3, 2),
        "imported_spectrace_when_unset": installed,
        "interpreter_start_ms_median": round(start_ms([]), 2),
        "runs": runs,
    }


# ----------------------------------------------------------------------------- soak
def soak_section(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Run the soak in a fresh interpreter, so peak RSS is its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--soak-child", str(args.soak_calls)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"soak child failed: {proc.stderr[-2000:]}")
    out["soak"] = json.loads(proc.stdout.strip().splitlines()[-1])


def soak_child(calls: int) -> dict[str, Any]:
    """``calls`` calls of a tiny traced module (one call per step), default settings and
    record cap, JSONL on: RSS growth over the run and bytes per step of the file."""
    import gc

    import spectrace
    from spectrace.settings import DEFAULT_RECORD_CAP, Settings

    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    x = torch.randn(2, 8)
    settings = Settings()

    def rss_mb() -> float:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def peak_mb() -> float:  # VmHWM: reset at exec, unlike ru_maxrss (inherited from the parent)
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        with spectrace.trace(model, modules=["0"], settings=settings, directory=d) as t:
            for _ in range(200):
                model(x)
            t.recorder.flush()
            gc.collect()
            base_rss, base_peak = rss_mb(), peak_mb()
            t0 = time.perf_counter()
            samples = []
            for i in range(calls):
                model(x)
                if i % max(1, calls // 10) == 0:
                    samples.append(round(rss_mb() - base_rss, 1))
            elapsed = time.perf_counter() - t0
            kept = len(t.recorder.calls)
            end_rss = rss_mb()
        path = t.path
        size = os.path.getsize(path) if path else 0
        with open(path, "rb") as fh:
            lines = sum(1 for _ in fh)
        steps = t.recorder.counters.steps
        return {
            "module_calls": calls,
            "record_cap": DEFAULT_RECORD_CAP,
            "calls_kept_in_memory": kept,
            "baseline_rss_mb": round(base_rss, 1),
            "rss_growth_mb_end": round(end_rss - base_rss, 1),
            "peak_rss_growth_mb": round(peak_mb() - base_peak, 1),
            "rss_growth_every_tenth_mb": samples,
            "memory_per_kept_call_bytes": round((end_rss - base_rss) * 2**20 / max(1, kept)),
            "jsonl_bytes": size,
            "jsonl_lines": lines,
            "jsonl_bytes_per_step": round(size / max(1, steps), 1),
            "us_per_traced_call": round(elapsed / calls * 1e6, 1),
        }


# ---------------------------------------------------------------------------- output
def machine() -> dict[str, Any]:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["loadavg_at_start"] = os.getloadavg()
    except OSError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def eager_markdown(res: dict[str, Any], m: dict[str, Any]) -> list[str]:
    """The eager table of one run (the prefill step, or one decode shape)."""
    lines: list[str] = []
    mo = res["model"]
    lines += [
        f"- model: Llama target {mo['layers']} layers, hidden {mo['hidden']}, vocab {mo['vocab']}, {mo['dtype']}, "
        f"input {mo['batch']}x{mo['seq']}; EAGLE-3 draft {mo['draft']}; aux layers {mo['aux_layers']}; "
        f"{res.get('hooked_modules')} modules hooked",
        f"- engine: {res.get('engine')}",
        f"- {res['rounds']} rounds x {res['reps']} forwards per variant, interleaved (order rotates, then reverses: each variant in each position); torch threads {m['threads']}",
        "- ratio = median over rounds of (variant median / bare median of the same round); IQR over rounds; ratio of mins = fastest variant sample / fastest bare sample (robust to load from other processes)",
        "",
        "| variant | ms (median) | ratio vs bare | IQR | ratio of mins | samples |",
        "|---|---|---|---|---|---|",
    ]
    for k, v in res["eager"].items():
        lines.append(
            f"| {k} | {v['ms']} | {v['ratio']:.3f}x | [{v['ratio_q1']:.3f}, {v['ratio_q3']:.3f}] | {v['ratio_of_mins']:.3f}x | {v['samples']} |"
        )
    lines.append(f"\nhooks while off: {res.get('off_hooks')}; stats filled in the last traced step: {res.get('stats_filled')}")
    if "budget" in res:
        b = res["budget"]
        lines.append(
            f"stats_budget (SPECTRACE_BUDGET={b['fraction']}), at the end of each round: interval {b['interval']}, "
            f"cost of a traced step {b['cost_ms']} ms, step period {b['period_ms']} ms"
        )
    if "hook_time" in res:
        lines += [
            "",
            "Host time inside spectrace per step (accounting: the mean over consecutive steps, the median of three runs; ratio = 1 + that / bare median;"
            " `*_worker_thread` is CPU time on the record worker, off the host's thread):",
            "",
            "| mode | ms per step | ratio |",
            "|---|---|---|",
        ]
        for k, v in res["hook_time"].items():
            lines.append(f"| {k} | {v['ms_per_step']} | {v['x_of_bare_median']:.4f}x |")
    return lines


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# spectrace overhead ({res['device']})",
        "",
        f"- date: {m['date']}; command: `{res['command']}`",
        f"- machine: {m.get('gpu') or m['cpu']}, {m['cores']} cores, torch {m['torch']}, transformers {m.get('transformers')}, triton {m.get('triton')}, python {m['python']}",
    ]
    if "eager" in res:
        lines += eager_markdown(res, m)
    for key, sub in res.get("decode", {}).items():
        lines += ["", f"## Decode-like step, {key} (batch x tokens, no KV context)", ""]
        lines += eager_markdown(sub, m) if "eager" in sub else ["(not run)"]
    if "sync_check" in res:
        lines += ["", "## Host syncs in a traced forward (CUDA)", "", "```", json.dumps(res["sync_check"], indent=1), "```"]
    if "graph" in res:
        g = res["graph"]
        lines += [
            "",
            f"## CUDA graph replay, {g['layers']} layers hidden {g['hidden']} (fused kernel: {g['fused_kernel']})",
            "",
            "| batch | variant | replay ms | ratio to bare |",
            "|---|---|---|---|",
        ]
        for b in (1, 64):
            e = g.get(f"batch_{b}")
            if e:
                lines += [
                    f"| {b} | {k} | {e['replay_ms'][k]} | {e['ratio'][k]:.3f}x (IQR {e['ratio_iqr'][k][0]:.3f}-{e['ratio_iqr'][k][1]:.3f}) |"
                    for k in e["replay_ms"]
                ]
        for b in (1, 64):
            e = g.get(f"batch_{b}")
            if e:
                checks = {k: v for k, v in e.items() if k not in ("replay_ms", "ratio", "ratio_iqr", "pooled")}
                lines.append(f"\nbatch {b}: refresh and worst errors against float64: {json.dumps(checks)}")
                if "pooled" in e:
                    lines.append(f"\nbatch {b}, captures pooled: {json.dumps(e['pooled'])}")
    if "bootstrap" in res:
        lines += ["", "## .pth bootstrap, SPECTRACE unset", "", "```", json.dumps(res["bootstrap"], indent=1), "```"]
    if "soak" in res:
        s = dict(res["soak"])
        lines += ["", "## Memory soak", "", "```", json.dumps(s, indent=1), "```"]
    if res.get("errors"):
        lines += ["", "## Errors", "", *[f"- {e}" for e in res["errors"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny model, 2 rounds, small soak")
    p.add_argument("--size", choices=sorted(SIZES), help="override the model size")
    p.add_argument("--rounds", type=int)
    p.add_argument("--reps", type=int)
    p.add_argument("--graph-rounds", type=int, default=5)
    p.add_argument(
        "--graph-blocks",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[],
        help="graph section: also capture the statistics with these fewest blocks per program (e.g. 1,2), side by side",
    )
    p.add_argument(
        "--graph-captures",
        type=int,
        default=1,
        help="graph section: capture bare and the serving slots this many times each and compare the captures' medians (`pooled`)",
    )
    p.add_argument(
        "--graph-small",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[],
        help="graph section: also capture the serving slots with these largest tensors (elements) of the narrow launch (0: none)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=1,
        help="eager and decode sections: also trace every Nth step only (SPECTRACE_SAMPLE=N), each sample the mean of N steps",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="eager and decode sections: also trace with SPECTRACE_BUDGET=F (a share, 0.03 = 3 %%), steps traced one in N, N measured",
    )
    p.add_argument(
        "--variants",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=[],
        help="eager and decode sections: only these variants (bare always runs), e.g. off,stats,stats_budget,anchor_item_hooks",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default: 1 on cpu, unchanged on cuda)")
    p.add_argument("--variant-warmup", type=int, help="untimed forwards after each variant's set-up (default: 1 cuda, 0 cpu)")
    p.add_argument("--soak-calls", type=int)
    p.add_argument("--sections", default="eager,graph,bootstrap,soak", help="any of eager, decode, graph, bootstrap, soak")
    p.add_argument("--out", default=os.environ.get("OUT") or ".")
    p.add_argument("--soak-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.soak_child:
        print(json.dumps(soak_child(args.soak_child)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    args.rounds = args.rounds or (2 if args.quick else (12 if args.device == "cuda" else 15))
    args.reps = args.reps or (2 if args.quick else (8 if args.device == "cuda" else 1))
    if args.variant_warmup is None:
        args.variant_warmup = 1 if args.device == "cuda" else 0
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    args.soak_calls = args.soak_calls or (5_000 if args.quick else 1_000_000)
    sections = set(args.sections.split(","))
    res: dict[str, Any] = {
        "device": args.device,
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "errors": [],
    }
    for name, fn in (
        ("eager", eager_section),
        ("decode", decode_section),
        ("graph", graph_section),
        ("bootstrap", bootstrap_section),
        ("soak", soak_section),
    ):
        if name not in sections or (name == "graph" and args.device != "cuda"):
            continue
        t0 = time.perf_counter()
        try:
            fn(args, res)
        except Exception as exc:  # one broken section must not lose the others
            import traceback

            traceback.print_exc()
            res["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
        print(f"[{name}] {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        write_results(res, args.out, args.device)  # after each section: a run cut by a time limit keeps the ones done
    md = write_results(res, args.out, args.device)
    print(md)
    return 1 if res["errors"] else 0


def write_results(res: dict[str, Any], out: str, device: str) -> str:
    """``overhead-<device>.md`` and ``.json`` in ``out`` with the sections so far; the markdown."""
    os.makedirs(out, exist_ok=True)
    md = markdown(res)
    with open(os.path.join(out, f"overhead-{device}.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(out, f"overhead-{device}.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
    return md


if __name__ == "__main__":
    sys.exit(main())

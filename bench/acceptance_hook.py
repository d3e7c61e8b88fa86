"""Host time of the acceptance hook per verify step, by the accounting a server reports.

    python bench/acceptance_hook.py [--calls 20000] [--rounds 5] [--batch 32] [--engine TEXT] [--out FILE]

SGLang calls ``EAGLEWorkerV2.on_verify_complete_cpu(num_correct_drafts_per_req,
batch_size=...)`` once per verify step; spectrace's AFTER hook on it
(``acceptance.after_verify_complete_cpu``) runs inside ``patching.guarded``, the adapter
both patch routes use, which times the hook and adds the time to ``hook_seconds_by_feature``
(what a live server's "acceptance us per verify step" is). This calls that very adapter
with what SGLang passes: a fresh list of ``--batch`` ints in 0..3 per step and a worker
with ``speculative_num_steps=3``, into a real recorder writing JSONL in a temporary folder.

Per round: every call timed alone (median and mean; calls that built a batch of records
apart from the ones that only held their step), and the accounting's own figure over the
same calls, which is the mean: a batch built every ``ACCEPT_BATCH`` steps counts in it,
as on a server. Then the file is read back (every step once, in order). The split times
the pieces alone: the adapter, the hook when it only holds, the batch build per step,
and the building blocks of one record. ``--out`` appends the run to a JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pydantic

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spectrace.checks.calls import COLLAPSE_WINDOW, check_acceptance  # noqa: E402
from spectrace.integrations.sglang import acceptance, patching, state  # noqa: E402
from spectrace.integrations.sglang.points import POINTS  # noqa: E402
from spectrace.recorder import Recorder  # noqa: E402
from spectrace.records import Acceptance  # noqa: E402
from spectrace.settings import Settings  # noqa: E402

QUALNAME = "EAGLEWorkerV2.on_verify_complete_cpu"
K = 3  # --speculative-num-steps 3, as on the live servers
clock = time.perf_counter_ns


class EAGLEWorkerV2:
    """What the hook reads from ``self`` (set on the instance, as the tests do)."""

    def __init__(self) -> None:
        self.adaptive_controller = None
        self.speculative_num_steps = K


def payloads(batch: int, n: int = 256, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(0, K) for _ in range(batch)] for _ in range(n)]


def new_recorder(directory: str) -> Recorder:
    rec = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=directory)
    state.reset()
    state.use_recorder(rec)
    return rec


def median_us(values: list[int]) -> float:
    return round(statistics.median(values) / 1e3, 3)


def mean_us(values: list[int]) -> float:
    return round(sum(values) / len(values) / 1e3, 3)


def one_round(adapter: Callable[..., Any], args: argparse.Namespace, pay: list[list[int]]) -> dict[str, Any]:
    worker = EAGLEWorkerV2()
    with tempfile.TemporaryDirectory() as d:
        rec = new_recorder(d)
        n_pay = len(pay)
        for i in range(args.warmup):
            adapter(None, worker, list(pay[i % n_pay]), batch_size=args.batch)
        by_feature = rec.counters.hook_seconds_by_feature
        accounted_before = by_feature.get("acceptance", 0.0)
        holding: list[int] = []
        building: list[int] = []
        st = state.STATE
        for i in range(args.calls):
            correct = list(pay[(args.warmup + i) % n_pay])  # SGLang hands over a fresh list (.tolist()) each step
            built_before = st.accept_step
            t0 = clock()
            adapter(None, worker, correct, batch_size=args.batch)
            t1 = clock()
            (building if st.accept_step != built_before else holding).append(t1 - t0)
        accounted = by_feature.get("acceptance", 0.0) - accounted_before
        rec.close()
        total = args.warmup + args.calls
        with open(str(rec.path)) as fh:
            lines = [json.loads(x) for x in fh.read().splitlines()]
        kept = [x for x in lines if x["type"] == "acceptance"]
        in_order = [x["step"] for x in kept] == list(range(total)) and all(
            x["accept_lengths"] == [c + 1 for c in pay[i % n_pay]] for i, x in enumerate(kept)
        )
        findings = sorted(x["code"] for x in lines if x["type"] == "finding")
    every = holding + building
    return {
        "us_per_call_accounting": round(accounted / args.calls * 1e6, 3),
        "us_per_call_median": median_us(every),
        "us_per_call_mean": mean_us(every),
        "us_per_call_p99": round(sorted(every)[int(len(every) * 0.99)] / 1e3, 3),
        "holding_calls": {"n": len(holding), "median_us": median_us(holding) if holding else None},
        "building_calls": {"n": len(building), "median_us": median_us(building) if building else None},
        "acceptance_records": len(kept),
        "all_steps_once_in_order": in_order,
        "findings": findings,
    }


def timed(fn: Callable[[], Any], n: int) -> list[int]:
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def split(adapter: Callable[..., Any], args: argparse.Namespace, pay: list[list[int]]) -> dict[str, Any]:
    """The pieces alone (median us): what the adapter adds, the hook while it only holds,
    the batch build per step held, and the building blocks of one record."""
    worker = EAGLEWorkerV2()
    hook = next(p for p in POINTS if p.qualname == QUALNAME).resolve_hook()
    n = args.split_reps
    out: dict[str, Any] = {"timer_floor_us": median_us(timed(lambda: None, n))}
    batch_was = acceptance.ACCEPT_BATCH
    with tempfile.TemporaryDirectory() as d:
        rec = new_recorder(d)
        correct = list(pay[0])
        acceptance.ACCEPT_BATCH = 1 << 30  # nothing built: the per-step cost alone
        try:
            through = timed(lambda: adapter(None, worker, correct, batch_size=args.batch), n)
            direct = timed(lambda: hook(None, worker, correct, batch_size=args.batch), n)
        finally:
            acceptance.ACCEPT_BATCH = batch_was
        acceptance.drain()
        out["adapter_us"] = round(median_us(through) - median_us(direct), 3)
        out["hook_holding_us"] = median_us(direct)
        per_step = []
        for r in range(max(n // batch_was, 50)):
            for i in range(batch_was):
                state.STATE.accept_pending.append((list(pay[(r + i) % len(pay)]), K))
            t0 = clock()
            acceptance.drain()
            per_step.append((clock() - t0) // batch_was)
        out["batch_build_us_per_step"] = median_us(per_step)
        record = Acceptance.model_construct(
            step=0, accept_lengths=[c + 1 for c in correct], draft_tokens=K, accepted_per_position=[1, 1, 1]
        )
        window = [record] * COLLAPSE_WINDOW
        out["pieces_us"] = {
            "Recorder.emit": median_us(timed(lambda: rec.emit(record), n)),
            "model_dump_json (in emit)": median_us(timed(record.model_dump_json, n)),
            "Acceptance.model_construct": median_us(
                timed(
                    lambda: Acceptance.model_construct(
                        step=0, accept_lengths=[c + 1 for c in correct], draft_tokens=K, accepted_per_position=[1, 1, 1]
                    ),
                    n,
                )
            ),
            "list(map(int, counts))": median_us(timed(lambda: list(map(int, correct)), n)),
            "accepted_per_position by list.count": median_us(timed(lambda: [correct.count(i) for i in range(K + 1)], n)),
            "check_acceptance per step": round(median_us(timed(lambda: check_acceptance(window), n)) / COLLAPSE_WINDOW, 3),
        }
        rec.close()
    return out


def hardware() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            name = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per round")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="requests per verify step")
    parser.add_argument("--split-reps", type=int, default=5000)
    parser.add_argument("--engine", default="", help="what the measured code is (goes in the JSON)")
    parser.add_argument("--out", default="", help="a JSON file to append this run to")
    args = parser.parse_args()
    point = next(p for p in POINTS if p.qualname == QUALNAME and p.feature == "acceptance")
    adapter = patching.guarded(point)
    pay = payloads(args.batch)
    rounds = [one_round(adapter, args, pay) for _ in range(args.rounds)]
    result: dict[str, Any] = {
        "engine": args.engine,
        "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M"),
        "hardware": hardware(),
        "software": {"python": sys.version.split()[0], "pydantic": pydantic.VERSION},
        "command": f"python bench/acceptance_hook.py --calls {args.calls} --warmup {args.warmup} --rounds {args.rounds} --batch {args.batch}",
        "accept_batch": acceptance.ACCEPT_BATCH,
        "us_per_call_accounting": statistics.median(r["us_per_call_accounting"] for r in rounds),
        "us_per_call_median": statistics.median(r["us_per_call_median"] for r in rounds),
        "us_per_call_mean": statistics.median(r["us_per_call_mean"] for r in rounds),
        "rounds": rounds,
        "split": split(adapter, args, pay),
    }
    print(
        f"acceptance hook, batch {args.batch}, k={K}, {args.rounds} rounds x {args.calls} calls (median of rounds): "
        f"accounting {result['us_per_call_accounting']:.2f} us per call (the server's figure), "
        f"per call median {result['us_per_call_median']:.2f} us, mean {result['us_per_call_mean']:.2f} us"
    )
    last = rounds[-1]
    print(
        f"holding calls median {last['holding_calls']['median_us']} us, building calls median "
        f"{last['building_calls']['median_us']} us (1 in {acceptance.ACCEPT_BATCH}); every step on file once, in order: "
        f"{all(r['all_steps_once_in_order'] for r in rounds)}"
    )
    print(f"split (median us): {json.dumps(result['split'])}")
    if args.out:
        doc: dict[str, Any] = {}
        if os.path.exists(args.out):
            with open(args.out) as fh:
                doc = json.load(fh)
        doc.setdefault(
            "what", "host time of the SGLang acceptance hook (after on_verify_complete_cpu) per verify step, through patching.guarded"
        )
        doc.setdefault("date", datetime.date.today().isoformat())
        doc.setdefault("command", "python bench/acceptance_hook.py --engine TEXT --out FILE (each run names its own)")
        doc.setdefault(
            "payload", f"a fresh list of {args.batch} ints in 0..{K} per call (num_correct_drafts_per_req), batch_size={args.batch}, k={K}"
        )
        doc.setdefault("runs", []).append(result)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()

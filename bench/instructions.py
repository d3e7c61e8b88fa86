"""Instructions spectrace adds per hooked call, counted by valgrind (callgrind), not timed.

    python bench/instructions.py                     # this code: shapes only and statistics
    python bench/instructions.py --base 5fb112d      # and a git revision beside it
    python bench/instructions.py --base-dir DIR      # DIR holds spectrace_base/ (ab_versions --export)
    python bench/instructions.py --split             # and where this code's instructions go

On a shared machine wall-clock differences of 10 % drown in the noise; an instruction
count is nearly the same from run to run, whatever else the machine does (each measured
process gets one fixed ``PYTHONHASHSEED``; the record worker's waits still move it by a
few percent). Each version's
measurements run in one process under ``valgrind --tool=callgrind`` with counting off: it
builds the tiny Llama of ``bench/host_cost.py`` (8 layers, hidden 64, 16 tokens, 11
hooked modules), and for bare, shapes only and statistics in turn warms up and counts only
the timed forwards (switched on and off with ``callgrind_control``, each mode's count
dumped on its own).
The figure is (traced - bare) / (forwards x hooked modules): every instruction the
hooks, the class wrappers, the step wrapper, the read pass and the record build add.
``--split`` counts this code again with its later phases taken out, one process each, to
say where a hooked call's instructions go: ``floor`` (every class-wrapped module's call
handed straight to its forward, nothing kept or read: the class and step wrappers and the
step's end with nothing to do; the few modules on torch's own hooks, here the final norm
and ``lm_head``, still note their calls there), ``keep`` (the
hooks keeping each call), ``read`` (the pass that notes the kept calls: descriptions,
statistics) and ``build`` (the records' text). The phases are taken out by replacing
engine methods in the measured process only.
Instructions are not seconds: cache misses and the cost of cold code (a hook between the
model's kernels) are not in them, so pair this with ``bench/ab_versions.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "basic")


# --split: the phases a hooked call's instructions are split into, each counted as the
# difference between two processes (the one with the phase and the one without it)
PHASES = ("floor", "keep", "read", "build")


def _without(package: str, upto: str) -> None:
    """Take out the phases after ``upto`` ("floor", "keep" or "read") in this process."""
    engine = importlib.import_module(f"{package}.hooks.engine")
    for name in ("_build_step", "_read_kept", "_make_around"):
        if not callable(getattr(engine.Tracer, name, None)):
            # (a renamed method would otherwise be added beside it, and its phase counted as 0)
            raise RuntimeError(f"--split: Tracer.{name} is gone from {package}; update _without")
    engine.Tracer._build_step = lambda self, item, on_worker=True: None
    if upto in ("floor", "keep"):
        engine.Tracer._read_kept = lambda self, state, pending, first: None
    if upto == "floor":

        def _make_around(self: Any, *args: Any, **kwargs: Any) -> Any:
            def around(module: Any, original: Any, call_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> Any:
                return original(module, *call_args, **call_kwargs)

            return around

        engine.Tracer._make_around = _make_around


def child(modes: str, control: str, forwards: int, package: str) -> None:
    """The measured process: for each of ``modes`` (comma-separated) in turn, ready, wait for
    "go", run the forwards, done, wait for "stop" (the files numbered by the mode's place).
    A mode: "bare", a stats mode, or one stats mode and the phase to stop after ("off:read",
    alone in its process: the phase is taken out of the engine for good)."""
    import torch

    from spectrace.eagle3.target import tiny_llama

    spectrace = importlib.import_module(package)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_llama(num_layers=8, hidden_size=64, intermediate_size=128)
    ids = torch.randint(0, 128, (1, 16))

    def mark(name: str) -> None:
        Path(control, name).touch()

    def wait(name: str) -> None:
        while not Path(control, name).exists():
            time.sleep(0.05)

    for n, one in enumerate(modes.split(",")):
        mode, _, upto = one.partition(":")
        if upto:
            _without(package, upto)
        tracing = spectrace.trace(model, stats=mode) if mode != "bare" else contextlib.nullcontext()
        with torch.no_grad(), tracing as t:
            for _ in range(5):
                model(ids)
            if t is not None:
                t.tracer.finish_step()
            mark(f"ready{n}")
            wait(f"go{n}")
            for _ in range(forwards):
                model(ids)
            if t is not None:
                t.tracer.finish_step(wait=True)
            mark(f"done{n}")
            wait(f"stop{n}")
            Path(control, f"hooked{n}").write_text(str(len(t.hooked) if t is not None else 0))


def _count(modes: list[str], forwards: int, package: str, pythonpath: str) -> list[tuple[int, int]]:
    """(instructions counted, hooked modules) of each of ``modes``, one after another in one
    measured process (starting one under valgrind takes a minute: the interpreter, torch and
    transformers translated); each mode's count is dumped on its own."""
    with tempfile.TemporaryDirectory() as control:
        out = Path(control, "callgrind.out")
        # A fixed hash seed: string hashes decide dict probe sequences and collisions, and
        # with a random seed per process the same code counted 78 K and 89 K a call.
        env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONHASHSEED="0")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        cmd += [sys.executable, __file__, "--child", ",".join(modes), control, str(forwards), package]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def wait(name: str) -> None:
            while not Path(control, name).exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the measured process ended early: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
                time.sleep(0.1)

        def control_(*what: str) -> None:
            subprocess.run(["callgrind_control", *what, str(proc.pid)], check=True, capture_output=True)

        def counted(part: Path) -> int:
            # ("summary:" near the top holds what was counted before counting was on: 0)
            lines = part.read_text(errors="replace").splitlines()
            return max((int(line.split()[1]) for line in lines if line.startswith(("summary:", "totals:"))), default=0)

        results = []
        try:
            for n in range(len(modes)):
                wait(f"ready{n}")
                before = set(Path(control).glob("callgrind.out*"))
                control_("-i", "on")
                Path(control, f"go{n}").touch()
                wait(f"done{n}")
                control_("-i", "off")
                control_("-d")  # this mode's count, in a file of its own; the counters start again
                dumped = set(Path(control).glob("callgrind.out*")) - before
                results.append(sum(counted(part) for part in dumped))
                Path(control, f"stop{n}").touch()
                wait(f"hooked{n}")
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        return [(total, int(Path(control, f"hooked{n}").read_text())) for n, total in enumerate(results)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="a git revision to count beside this code")
    parser.add_argument("--base-dir", help="a folder holding spectrace_base/ (ab_versions.py --export)")
    parser.add_argument("--forwards", type=int, default=20)
    parser.add_argument("--split", action="store_true", help="also count this code with its later phases taken out")
    parser.add_argument("--json", help="write the figures to this file as JSON")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, control, forwards, package = args.child
        child(mode, control, int(forwards), package)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("bench/instructions.py: needs valgrind (callgrind and callgrind_control)")
    versions = {"working tree": ("spectrace", str(ROOT))}
    tmp = None
    if args.base or args.base_dir:
        base_dir = args.base_dir
        if base_dir is None:
            sys.path.insert(0, str(ROOT / "bench"))
            from ab_versions import export_base

            tmp = tempfile.mkdtemp()
            export_base(args.base, Path(tmp))
            base_dir = tmp
        versions = {f"base ({args.base or base_dir})": ("spectrace_base", f"{base_dir}{os.pathsep}{ROOT}"), **versions}
    try:
        # Two processes at a time (a count does not depend on what else runs).
        jobs = [("bare", "bare", "spectrace", str(ROOT))]
        jobs += [(label, mode, package, path) for label, (package, path) in versions.items() for mode in MODES]
        if args.split:
            jobs += [("split", f"{mode}:{upto}", "spectrace", str(ROOT)) for mode in MODES for upto in PHASES[:-1]]
        # One process per version (its modes one after another), and one per split phase (it
        # takes a phase out of the engine for good); two processes at a time.
        groups: dict[tuple[str, str, str], list[int]] = {}
        for k, (_label, mode, package, path) in enumerate(jobs):
            groups.setdefault((package, path, mode if ":" in mode else ""), []).append(k)
        counts: list[tuple[int, int]] = [(0, 0)] * len(jobs)

        def run_group(key: tuple[str, str, str]) -> None:
            members = groups[key]
            for k, found in zip(members, _count([jobs[k][1] for k in members], args.forwards, key[0], key[1])):
                counts[k] = found

        with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
            list(pool.map(run_group, groups))
        bare = counts[0][0]
        result: dict[str, Any] = {"forwards": args.forwards, "bare_instructions_per_forward": bare // args.forwards, "per_hooked_call": {}}
        for (label, mode, _package, _path), (total, hooked) in zip(jobs[1:], counts[1:]):
            per_call = (total - bare) / args.forwards / hooked
            result["per_hooked_call"].setdefault(label, {})[mode] = round(per_call)
            print(f"{label:28s} {mode:10s} {per_call:10.0f} instructions per hooked call ({hooked} hooked)")
        if args.split:
            cumulative = result["per_hooked_call"].pop("split")
            result["split"] = {}
            for mode in MODES:
                # counts with the phases up to each one: the last is the whole code's
                counts = [cumulative[f"{mode}:{phase}"] for phase in PHASES[:-1]] + [result["per_hooked_call"]["working tree"][mode]]
                result["split"][mode] = {phase: counts[n] - (counts[n - 1] if n else 0) for n, phase in enumerate(PHASES)}
                print(f"split {mode:6s} " + ", ".join(f"{phase} {v}" for phase, v in result["split"][mode].items()))
        if len(versions) == 2:
            (base_label, base), (_, tree) = result["per_hooked_call"].items()
            result["ratio_tree_to_base"] = {m: round(tree[m] / base[m], 3) for m in MODES}
            print("working tree / base: " + ", ".join(f"{m} {r:.3f}x" for m, r in result["ratio_tree_to_base"].items()))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Two versions of spectrace side by side in one process: host time per hooked call.

    python bench/ab_versions.py --base 282621d [--device cuda] [--rounds 10]
    python bench/ab_versions.py --base-dir DIR ...   # DIR holds spectrace_base/ (a machine without git)
    python bench/ab_versions.py --base 282621d --export DIR   # write DIR/spectrace_base/ and stop

The base revision's ``spectrace`` package is copied out of git as ``spectrace_base``
(its absolute imports renamed), so both import side by side. Each round traces the same
tiny Llama (8 layers, hidden 64, 16 tokens, 11 hooked modules) with each version in
shapes-only and statistics mode, in an order that alternates between rounds, and takes
the hooks' own accounting (every spectrace hook and the step end wrapped in a timer, as
``bench/host_cost.py`` does) and the wall time per forward, beside the bare forward's.
``--size llama8b --shape 4x512`` (or ``64x1``, ``1x1``) runs ``bench/overhead.py``'s
step instead: the Llama-8B-shaped target and its EAGLE-3-shaped draft, traced together. Machine drift hits both
versions alike, which sequential runs of ``host_cost.py`` on two checkouts cannot promise
on a shared host.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

from host_cost import accounted_per_step, per_step  # noqa: E402

from spectrace.eagle3.target import tiny_llama  # noqa: E402  (the working tree's: the model is not what is compared)

BASE = "spectrace_base"


def export_base(rev: str, dest: Path) -> Path:
    """``rev``'s spectrace package as ``dest/spectrace_base`` (absolute imports renamed)."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "spectrace"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    package = dest / BASE
    (dest / "spectrace").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfrom spectrace([. ])", rf"from {BASE}\1", text)
        text = re.sub(r"^(\s*)import spectrace$", rf"\1import {BASE} as spectrace", text, flags=re.M)
        path.write_text(text)
    return package


def accounted(pkg: Any, models: Any, step: Callable[[], Any], mode: str, iters: int, cuda: bool) -> tuple[float, float, float]:
    """(us of spectrace host time per hooked call, ms of wall time per step, ms of
    spectrace host time per step)."""
    roots = list(models.values()) if isinstance(models, dict) else [models]
    with pkg.trace(models, stats=mode) as t:
        wall = per_step(step, iters, cuda)
        per = accounted_per_step(t, roots, step, iters)
        return per / len(t.hooked) * 1e6, wall * 1e3, per * 1e3


def workload(size: str, shape: str | None, device: str) -> tuple[Any, Callable[[], Any], str]:
    """(what to trace, one step, a description)."""
    if size == "tiny":
        model = tiny_llama(num_layers=8, hidden_size=64, intermediate_size=128).to(device)
        ids = torch.randint(0, 128, (1, 16), device=device)
        return model, lambda: model(ids), "tiny Llama, 8 layers, hidden 64, 1x16 tokens"
    from overhead import build, make_step

    dims = tuple(int(v) for v in shape.split("x")) if shape else None
    target, draft, ids, aux, info = build(size, device, dims)  # type: ignore[arg-type]
    return {"target": target, "draft": draft}, make_step(target, draft, ids, aux), json.dumps(info)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", help="the git revision to compare the working tree with")
    where.add_argument("--base-dir", help="a folder holding spectrace_base/ (from --export)")
    parser.add_argument("--export", help="only write DIR/spectrace_base/ from --base, then stop")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument(
        "--size", default="tiny", choices=("tiny", "medium", "llama8b"), help="tiny: a tiny Llama; else bench/overhead.py's pair"
    )
    parser.add_argument("--shape", help="BATCHxTOKENS of the pair's input (default: the size's)")
    parser.add_argument("--json", help="write the figures to this file as JSON")
    args = parser.parse_args()
    if args.export:
        if not args.base:
            parser.error("--export needs --base")
        print(export_base(args.base, Path(args.export)))
        return
    base_dir = Path(args.base_dir) if args.base_dir else Path(tempfile.mkdtemp(prefix="spectrace-ab-"))
    if args.base:
        export_base(args.base, base_dir)
    sys.path.insert(0, str(base_dir))
    import spectrace

    versions = {"working tree": spectrace, f"base ({args.base or args.base_dir})": importlib.import_module(BASE)}
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    models, step, described = workload(args.size, args.shape, args.device)
    if cuda:
        for pkg in versions.values():
            importlib.import_module(pkg.__name__ + ".hooks.fused_stats").prepare("cuda")
    samples: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    with torch.no_grad():
        for rnd in range(args.rounds):
            bare = per_step(step, args.iters, cuda) * 1e3
            order = list(versions.items())
            for name, pkg in order if rnd % 2 else order[::-1]:
                for mode in ("off", "basic"):
                    per_call, wall, host = accounted(pkg, models, step, mode, args.iters, cuda)
                    samples.setdefault((name, mode), []).append((per_call, wall, host, wall / bare))
    result: dict[str, Any] = {
        "device": args.device,
        "workload": described,
        "rounds": args.rounds,
        "iters": args.iters,
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
    }

    def spread(values: list[float], digits: int) -> tuple[float, list[float]]:
        ordered = sorted(values)
        q = len(ordered) // 4
        return round(statistics.median(ordered), digits), [round(ordered[q], digits), round(ordered[-1 - q], digits)]

    for (name, mode), values in samples.items():
        per_call, iqr = spread([v[0] for v in values], 2)
        ratio, ratio_iqr = spread([v[3] for v in values], 4)
        entry = {
            "us_per_hooked_call_accounting_median": per_call,
            "iqr": iqr,
            "min": round(min(v[0] for v in values), 2),
            "host_ms_per_step_accounting_median": round(statistics.median(v[2] for v in values), 3),
            "wall_ms_per_forward_median": round(statistics.median(v[1] for v in values), 3),
            "wall_ratio_to_bare_median": ratio,
            "wall_ratio_iqr": ratio_iqr,
        }
        result[f"{name}, {'shapes only' if mode == 'off' else 'statistics'}"] = entry
        print(f"{name:24s} {mode:6s} accounting per call: median {per_call:7.2f} us (IQR {iqr[0]}-{iqr[1]}), "
              f"{entry['host_ms_per_step_accounting_median']} ms a step; wall per step {entry['wall_ms_per_forward_median']} ms, "
              f"{ratio}x of bare (IQR {ratio_iqr[0]}-{ratio_iqr[1]})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

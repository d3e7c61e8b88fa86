"""Two versions of spectrace side by side in one process: host time per hooked call.

    python bench/ab_versions.py --base 282621d [--device cuda] [--rounds 10]
    python bench/ab_versions.py --base-dir DIR ...   # DIR holds spectrace_base/ (a machine without git)
    python bench/ab_versions.py --base 282621d --export DIR   # write DIR/spectrace_base/ and stop

The base revision's ``spectrace`` package is copied out of git as ``spectrace_base``
(its absolute imports renamed), so both import side by side. Each round traces the same
tiny Llama (8 layers, hidden 64, 16 tokens, 11 hooked modules) with each version in
shapes-only and statistics mode, in an order that alternates between rounds, and takes
the hooks' own accounting (every spectrace hook and the step end wrapped in a timer, as
``bench/host_cost.py`` does) and the wall time per forward. Machine drift hits both
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
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))

from conftest import tiny_llama  # noqa: E402
from host_cost import _accounted, _per_forward  # noqa: E402

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


def accounted(pkg: Any, model: torch.nn.Module, ids: torch.Tensor, mode: str, iters: int) -> tuple[float, float]:
    """(us of spectrace host time per hooked call, ms of wall time per forward)."""
    with pkg.trace(model, stats=mode) as t:
        wall = _per_forward(model, ids, iters)
        hooked = len(t.hooked)
        return _accounted(t, model, ids, iters) / hooked * 1e6, wall * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", help="the git revision to compare the working tree with")
    where.add_argument("--base-dir", help="a folder holding spectrace_base/ (from --export)")
    parser.add_argument("--export", help="only write DIR/spectrace_base/ from --base, then stop")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
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
    model = tiny_llama(layers=8, hidden=64).to(args.device)
    ids = torch.randint(0, 128, (1, 16), device=args.device)
    if args.device == "cuda":
        for pkg in versions.values():
            importlib.import_module(pkg.__name__ + ".hooks.fused_stats").prepare("cuda")
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with torch.no_grad():
        for rnd in range(args.rounds):
            order = list(versions.items())
            for name, pkg in order if rnd % 2 else order[::-1]:
                for mode in ("off", "basic"):
                    samples.setdefault((name, mode), []).append(accounted(pkg, model, ids, mode, args.iters))
    result: dict[str, Any] = {
        "device": args.device,
        "rounds": args.rounds,
        "iters": args.iters,
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
    }
    for (name, mode), values in samples.items():
        per_call = sorted(v[0] for v in values)
        q = len(per_call) // 4
        entry = {
            "us_per_hooked_call_accounting_median": round(statistics.median(per_call), 2),
            "iqr": [round(per_call[q], 2), round(per_call[-1 - q], 2)],
            "min": round(per_call[0], 2),
            "wall_ms_per_forward_median": round(statistics.median(v[1] for v in values), 3),
        }
        result[f"{name}, {'shapes only' if mode == 'off' else 'statistics'}"] = entry
        print(f"{name:24s} {mode:6s} accounting per call: median {entry['us_per_hooked_call_accounting_median']:7.2f} us "
              f"(IQR {entry['iqr'][0]}-{entry['iqr'][1]}, min {entry['min']}); wall per forward {entry['wall_ms_per_forward_median']} ms")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

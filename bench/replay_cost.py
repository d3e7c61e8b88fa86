"""What ``SPECTRACE_REPLAY`` costs a draft forward, and what it keeps, side by side in one process.

    python bench/replay_cost.py [--device cpu|cuda] [--tokens 64] [--rows 8] [--repeats 7] [--json FILE]

The demo's trained EAGLE-3 draft (``spectrace.eagle3``) runs one prefill-like forward from
position 0 per step, in three modes interleaved per repeat so drift hits them alike:

- ``bare``: no replay hooks;
- ``keeping``: the hooks attached and every forward kept (the capture's list is emptied
  before each one): the cost of one of the few forwards a server keeps;
- ``after``: the hooks attached once the bound is reached (what every later forward of a
  server pays: one attribute test per hooked call).

Also: the bytes kept per forward and the time to write the file (off the forward: the
recorder's flush thread does it in a server). The capture keeps at most 4 forwards per
process, so a server's steady state is ``after``; an on/off comparison inside one live
server would measure that state only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import torch

from spectrace.eagle3.pair import load_draft
from spectrace.hooks.replay_capture import keep_replay

MODES = ("bare", "keeping", "after")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    draft = load_draft().to(device).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (a.tokens,), generator=g).to(device)
    fused = torch.randn(a.tokens, 192, generator=g).to(device)
    positions = torch.arange(a.tokens, device=device)
    capture: Any = None

    def step() -> None:
        with torch.no_grad():
            draft(ids, fused, positions)

    def timed(mode: str) -> float:
        nonlocal capture
        if capture is not None:
            capture.remove()
            capture = None
        if mode != "bare":
            capture = keep_replay(draft, rows=a.rows, max_forwards=1)
        for _ in range(3):
            _reset_if_keeping(capture, mode)
            step()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            _reset_if_keeping(capture, mode)
            step()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.iters

    samples: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(a.repeats):
        order = MODES if r % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            samples[mode].append(timed(mode))
    # What one kept forward holds, and writing it (as the recorder's flush thread does).
    capture = keep_replay(draft, rows=a.rows, max_forwards=4)
    for _ in range(4):
        step()
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        name = capture.write(folder, "trace-bench-1.jsonl")
        write_s = time.perf_counter() - t0
        file_bytes = _size(folder, name)
    medians = {m: statistics.median(samples[m]) for m in MODES}
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "tokens": a.tokens,
        "rows": a.rows,
        "repeats": a.repeats,
        "iters": a.iters,
        "median_ms_per_forward": {m: round(medians[m] * 1e3, 4) for m in MODES},
        "ratio_to_bare": {m: round(medians[m] / medians["bare"], 3) for m in MODES},
        "bytes_per_kept_forward": capture.kept[0]["bytes"] if capture.kept else 0,
        "file_bytes_4_forwards": file_bytes,
        "write_ms_4_forwards": round(write_s * 1e3, 2),
        "samples_ms": {m: [round(v * 1e3, 4) for v in samples[m]] for m in MODES},
    }
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


def _reset_if_keeping(capture: Any, mode: str) -> None:
    if mode == "keeping" and capture is not None:
        with capture._lock:
            capture.kept.clear()
            capture.bytes = 0
            capture._full = False


def _size(folder: str, name: str | None) -> int:
    import os

    return os.path.getsize(os.path.join(folder, name)) if name else 0


if __name__ == "__main__":
    main()

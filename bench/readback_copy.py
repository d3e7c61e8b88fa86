"""Host time of a step's read-back copy on CUDA: slot rows copied to pinned memory as a
strided piece of the step buffer, against the same rows gathered on the device first.

    python bench/readback_copy.py [--json FILE]

A decode step's statistics are a few leading rows of each slot of the ``(capacity, P, 5)``
float64 step buffer (:class:`spectrace.hooks.readback.SlotBuffer`), a strided piece of
it. Each way is timed on the host, with the device idle and with it still busy (the
usual case when a step ends): ``strided`` (``pinned.copy_(rows, non_blocking=True)``),
``contiguous`` (a contiguous device tensor of the same size, the floor), ``gathered``
(the rows copied into a contiguous device buffer, then that one to pinned memory: what
the read-back does) and ``event`` (the event recorded behind the copy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=40, help="tensors in the step (a decode step's hooked outputs)")
    parser.add_argument("--rows", type=int, default=4, help="leading rows of each slot that hold partials")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--json", help="write the figures to this file as JSON")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/readback_copy.py: needs a CUDA device")
    from spectrace.hooks.fused_stats import programs_for
    from spectrace.hooks.tensor_stats import ROW

    device = torch.device("cuda", torch.cuda.current_device())
    programs = programs_for(device)
    buffer = torch.zeros(64, programs, ROW, device=device, dtype=torch.float64)
    pinned = torch.empty(64 * 64 * ROW, dtype=torch.float64, pin_memory=True)
    used, rows = args.slots, args.rows
    strided = buffer[:used, :rows]
    host = pinned[: used * rows * ROW].view(used, rows, ROW)
    contiguous = torch.zeros(used, rows, ROW, device=device, dtype=torch.float64)
    gathered = torch.empty(used, rows, ROW, device=device, dtype=torch.float64)
    event = torch.cuda.Event(blocking=True)

    def gather() -> None:
        gathered.copy_(strided)
        host.copy_(gathered, non_blocking=True)

    ways = {
        "strided": lambda: host.copy_(strided, non_blocking=True),
        "contiguous": lambda: host.copy_(contiguous, non_blocking=True),
        "gathered": gather,
        "event": event.record,
    }
    result: dict[str, object] = {"slots": used, "rows": rows, "programs": programs, "repeats": args.repeats, "host_us_median": {}}
    for busy in (False, True):
        for name, way in ways.items():
            times = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                if busy:
                    torch.cuda._sleep(5_000_000)  # a few ms of device work still queued
                start = time.perf_counter()
                way()
                times.append((time.perf_counter() - start) * 1e6)
            torch.cuda.synchronize()
            key = f"{name}, device {'busy' if busy else 'idle'}"
            median = statistics.median(times[10:])  # (the first ones warm up)
            result["host_us_median"][key] = round(median, 1)  # type: ignore[index]
            print(f"{key:28s} host {median:7.1f} us (median), max {max(times[10:]):7.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

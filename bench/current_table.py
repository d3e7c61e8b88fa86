"""BENCHMARKS.md's table of current figures, from one measurement file.

    python bench/current_table.py bench/results/current-2026-12-03.json      # print the table
    python bench/current_table.py --build FILE --commit REV --prefill P --decode D \\
        --graph G --host-cuda H --host-cpu C                                  # assemble FILE
    python bench/current_table.py FILE --into BENCHMARKS.md                   # and put it there

One run of the benches at one commit gives every figure of the host-cost goals: the eager
prefill and decode-like steps (``bench/overhead.py --sections eager`` / ``decode``: each
variant's ratio to bare with its IQR, the off control, the anchors), the 32-layer graph
replay (``--sections graph --graph-captures 4``) and the host time per hooked call
(``bench/host_cost.py``, on the GPU machine's host and on the CPU machine). ``--build``
puts their JSON outputs in one file; the default prints the table that BENCHMARKS.md
shows, every figure beside its goal, its control and the anchors of the same run, so the
table cannot mix runs. ``tests/docs/test_docs.py`` checks that BENCHMARKS.md holds this table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

# (goal name, the most a figure may be): ratios to bare, microseconds per hooked call
GOALS = {
    "prefill_shapes": 1.005,
    "prefill_stats": 1.01,
    "decode_stats": 1.03,
    "graph": 1.02,
    "call_shapes_us": 8.0,
    "call_stats_us": 20.0,
}


def _ratio(entry: dict[str, Any]) -> str:
    return f"{entry['ratio']:.3f}x (IQR {entry['ratio_q1']:.3f}–{entry['ratio_q3']:.3f})"


def _met(value: float, goal: float) -> str:
    return "yes" if value <= goal else "**no**"


def _noise(control: dict[str, Any], goal: float) -> str:
    """Whether the off control's spread is wider than the goal's margin over 1.0x."""
    width = max(control["ratio_q3"] - 1.0, 1.0 - control["ratio_q1"])
    return f"; the control's spread ({width * 100:.1f} %) is wider than the goal's margin" if width > goal - 1.0 else ""


def _anchors(eager: dict[str, Any]) -> str:
    return (
        f"empty hooks {eager['anchor_empty_hooks']['ratio']:.3f}x, `.item()` hooks {eager['anchor_item_hooks']['ratio']:.3f}x, "
        f"profiler {eager['anchor_profiler_record_shapes']['ratio']:.2f}x"
    )


def _eager_rows(label: str, section: dict[str, Any], shapes_goal: float | None, stats_goal: float) -> list[list[str]]:
    eager, hooks = section["eager"], section["hook_time"]
    off = eager["off"]
    control = f"off {_ratio(off)}"
    rows = []
    for mode, goal in (("shapes", shapes_goal), ("stats", stats_goal)):
        figure = eager[mode]
        accounting = (
            f"{hooks[mode]['ms_per_step']:.2f} ms a step ({hooks[mode]['ms_per_step'] * 1e3 / section['hooked_modules']:.0f} us a call)"
        )
        rows.append(
            [
                f"{label}, {'shapes only' if mode == 'shapes' else 'statistics'}",
                _ratio(figure),
                f"<= {goal}x" if goal else "",
                (_met(figure["ratio"], goal) + _noise(off, goal)) if goal else "",
                control,
                _anchors(eager),
                accounting,
            ]
        )
    return rows


def _graph_rows(graph: dict[str, Any]) -> list[list[str]]:
    rows = []
    for batch in (1, 64):
        entry = graph[f"batch_{batch}"]
        pooled = entry["pooled"]
        bare = [v for k, v in pooled["each_capture_ratio"].items() if k in pooled["bare_captures"]]
        low, high = pooled["slots_ratio_iqr"]
        rows.append(
            [
                f"CUDA-graph replay, in-graph statistics, {graph['layers']} layers, batch {batch}",
                f"{pooled['slots_ratio']:.4f}x (IQR {low:.4f}–{high:.4f})",  # (the goal's line is 1.02x: a third digit hides it)
                f"<= {GOALS['graph']}x",
                _met(pooled["slots_ratio"], GOALS["graph"]),
                f"bare captured {len(bare)} times: {min(bare):.3f}x–{max(bare):.3f}x",
                f"torch fallback {entry['ratio']['stats_torch']:.3f}x, side branch {entry['ratio']['slots_branch']:.3f}x",
                "",
            ]
        )
    return rows


def _call_rows(label: str, host: dict[str, Any]) -> list[list[str]]:
    rows = []
    control = host.get("control_us_per_hooked_call")  # (a host_cost output from before it had one: None)
    for mode, goal in (("shapes only", GOALS["call_shapes_us"]), ("statistics", GOALS["call_stats_us"])):
        entry = host[mode]
        low, high = entry.get("us_per_hooked_call_accounting_iqr") or (None, None)
        spread = f" (IQR {low:.1f}–{high:.1f})" if low is not None else ""
        rows.append(
            [
                f"{label}, {mode}",
                f"{entry['us_per_hooked_call_accounting']:.1f} us a call by accounting{spread}",
                f"<= {goal:.0f} us",
                _met(entry["us_per_hooked_call_accounting"], goal),
                f"wall {entry['us_per_hooked_call']:.1f} us a call against bare again {control:.1f} us" if control is not None else "",
                "",
                f"{entry['us_per_hooked_call_accounting'] * host['hooked_modules']:.0f} us a step, {host['hooked_modules']} hooked calls",
            ]
        )
    return rows


HEADER = ["measure", "figure", "goal", "met", "control, same run", "anchors, same run", "spectrace's host time (accounting)"]


def table(data: dict[str, Any]) -> str:
    """The markdown table of one measurement file (see ``--build``)."""
    rows: list[list[str]] = []
    rows += _eager_rows("prefill 4x512", data["prefill"], GOALS["prefill_shapes"], GOALS["prefill_stats"])
    for shape, section in data["decode"]["decode"].items():
        rows += _eager_rows(f"decode-like {shape}", section, None, GOALS["decode_stats"])
    rows += _graph_rows(data["graph"]["graph"])
    rows += _call_rows("host time per hooked call, tiny Llama, the GPU machine's host", data["host_cuda"])
    rows += _call_rows("host time per hooked call, tiny Llama, the CPU machine", data["host_cpu"])
    lines = [
        f"Measured at {data['commit']} on {data['date']}: {data['machines']}. Data: `{data['file']}`.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", _syncs(data)]
    return "\n".join(lines) + "\n"


def _syncs(data: dict[str, Any]) -> str:
    """The host-sync check of each eager section (a traced forward run where a sync raises)."""
    checks = [("prefill 4x512", data["prefill"]["sync_check"])]
    checks += [(f"decode-like {shape}", section["sync_check"]) for shape, section in data["decode"]["decode"].items()]
    added = max(check["traced_syncs"] - check["bare_syncs"] for _label, check in checks)
    counts = ", ".join(f"{label} {check['traced_syncs']} traced / {check['bare_syncs']} bare" for label, check in checks)
    verdict = "none" if added <= 0 else f"**{added}**"
    return f"Host syncs spectrace adds to a traced forward, same run: {verdict} (syncs in one forward, {counts}; the model's own)."


USUAL_COMMANDS = {
    "prefill": "python bench/overhead.py --device cuda --sections eager",
    "decode": "python bench/overhead.py --device cuda --sections decode",
    "graph": "python bench/overhead.py --device cuda --sections graph --graph-captures 4",
    "host_cuda": "python bench/host_cost.py --device cuda --json FILE",
    "host_cpu": "python bench/host_cost.py --json FILE",
}
START = "<!-- current table: "
END = "<!-- end of current table -->"


def table_block(markdown: str) -> tuple[str, str]:
    """(the measurement file the markers name, the text between them) of a markdown page."""
    _head, found, rest = markdown.partition(START)
    name, _, rest = rest.partition(" -->\n")
    body, ended, _tail = rest.partition(END)
    if not found or not ended:
        raise ValueError("no current-table markers")
    return name, body


def put_table(markdown: str, text: str, name: str) -> str:
    """``markdown`` with ``text`` between its markers, which then name ``name``."""
    table_block(markdown)  # (raises where the page has no markers: never appended blindly)
    head, _found, rest = markdown.partition(START)
    _old, _ended, tail = rest.partition(END)
    return f"{head}{START}{name} -->\n{text}{END}{tail}"


def build(args: argparse.Namespace) -> dict[str, Any]:
    def load(path: str) -> dict[str, Any]:
        with open(path) as fh:
            loaded: dict[str, Any] = json.load(fh)
        return loaded

    prefill = load(args.prefill)
    machine = prefill["machine"]
    data: dict[str, Any] = {
        "what": "every figure of the host-cost goals from one run at one commit (BENCHMARKS.md's current table)",
        "commit": args.commit,
        "date": machine["date"][:10],
        "machines": f"one {machine.get('gpu')} with {machine['cores']} {machine['cpu']} cores (torch {machine['torch']}, "
        f"triton {machine.get('triton')}); the CPU machine: {args.cpu_machine}",
        "file": "bench/results/" + args.build.rsplit("/", 1)[-1],
        "prefill": prefill,
        "decode": load(args.decode),
        "graph": load(args.graph),
        "host_cuda": load(args.host_cuda),
        "host_cpu": load(args.host_cpu),
    }
    # Each bench's own command line (a bench output from before it wrote one: the usual one).
    # (where a bench wrote its output names a path of that machine: FILE / DIR here)
    data["commands"] = {
        part: re.sub(r"(--json) \S+", r"\1 FILE", re.sub(r"(--out) \S+", r"\1 DIR", data[part].get("command") or USUAL_COMMANDS[part]))
        for part in USUAL_COMMANDS
    }
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", help="a measurement file to print the table of")
    parser.add_argument("--build", metavar="FILE", help="write one measurement file from the benches' outputs")
    parser.add_argument("--commit")
    parser.add_argument("--prefill")
    parser.add_argument("--decode")
    parser.add_argument("--graph")
    parser.add_argument("--host-cuda")
    parser.add_argument("--host-cpu")
    parser.add_argument("--cpu-machine", default="AMD EPYC, 2 shared cores")
    parser.add_argument("--into", metavar="MARKDOWN", help="also put the table between the markers of this file (BENCHMARKS.md)")
    args = parser.parse_args(argv)
    if args.build:
        missing = [n for n in ("commit", "prefill", "decode", "graph", "host_cuda", "host_cpu") if not getattr(args, n)]
        if missing:
            parser.error("--build needs " + ", ".join("--" + n.replace("_", "-") for n in missing))
        data = build(args)
        with open(args.build, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
    elif args.file:
        with open(args.file) as fh:
            data = json.load(fh)
    else:
        parser.error("give a measurement file, or --build FILE")
    text = table(data)
    if args.into:
        path = args.build or args.file
        with open(args.into) as fh:
            markdown = fh.read()
        try:
            updated = put_table(markdown, text, "bench/results/" + path.rsplit("/", 1)[-1])
        except ValueError as exc:  # (before the page is opened for writing: it stays as it was)
            parser.error(f"{args.into}: {exc}")
        with open(args.into, "w") as fh:
            fh.write(updated)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers for ``run_live_all.sh``: the live SGLang proof on the GPU machine.

Standard library only: it runs on the GPU image's bare ``python3`` (spectrace is not
installed there, the repository is on ``PYTHONPATH``). One job per sub-command:

    $ python3 livekit.py boot WORK --repo REPO     # SPECTRACE=1 for every process, no pip install
    $ python3 livekit.py wait --port 30000 --pid 1234 --timeout 300
    $ python3 livekit.py probe --port 30000 --out probe.json
    $ python3 livekit.py bench-one --label on --port 30110 --out bench-overhead-on-1.json
    $ python3 livekit.py bench-merge --out bench.json bench-overhead-*.json
    $ python3 livekit.py scrape --port 30000 --out metrics.txt
    $ python3 livekit.py metrics-report WORK --out metrics-report.json
    $ python3 livekit.py summarize WORK OUT

The pure parts (log parsing, the dist-info text, the sitecustomize source, the bench
statistics, the markdown) are plain functions, tested on CPU by tests/live/test_live_scripts.py.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

# Variant name -> what it is; the order is the order of the report.
VARIANTS: dict[str, str] = {
    "healthy": "EAGLE3, SpecForge-format draft (`midlayer.*` keys, own lm_head, d2t)",
    "eagle": "same draft served with `--speculative-algorithm EAGLE` (no aux capture)",
    "nolmhead": "draft without `lm_head.weight` (config keeps `draft_vocab_size`)",
    "layers0": "draft with speculators-style `layers.0.*` decoder keys",
    # The trained pair (spectrace/eagle3/data; mode `trained`): a draft trained on boundaries
    # [0, 2, 4], SpecForge ids [-1, 1, 3]. SGLang 0.5.17's Llama cannot capture the embedding.
    "trained-embed": "trained pair as shipped: ids [-1, 1, 3], the embedding first",
    "trained": "trained pair, ids [0, 1, 3] (0.5.17 captures boundaries [1, 2, 4]: slot 0 one block late)",
    "trained-nolmhead": "as `trained`, draft without `lm_head.weight` (config keeps `draft_vocab_size`)",
    "trained-nod2t": "as `trained`, draft without `d2t`",
    # mode `realworld`: bugs seen in the field, on the trained pair (ids [0, 1, 3])
    "trained-sampled": "as `trained`, requests at temperature 1.0 (sampling)",
    "trained-d2tarange": "as `trained`, d2t = arange(draft_vocab): absolute ids where offsets belong (target id 2i)",
    "trained-headnull": 'as `trained`, config `"draft_vocab_size": null` (the checkpoint keeps its 64-row lm_head)',
    "trained-rope": "as `trained`, draft config rope_theta 500000 (trained at 10000)",
    # mode `tensors`: per-module records live (the trained pair, ids [0, 1, 3])
    "graph": "trained pair, CUDA graphs, every replay's in-graph statistics read back",
    "eager": "trained pair, --disable-cuda-graph (the same prompts: per-module statistics to compare)",
    "sampled": "trained pair, CUDA graphs, default read-back sampling (the cost windows ran here)",
    "big": "GPU-bound 3.4B random target (hidden 4096, 16 layers) with a random draft, default sampling",
    # mode `metrics`: --enable-metrics, the trained pair (ids [0, 1, 3]), CUDA graphs on
    "metrics": "trained pair, --enable-metrics, SPECTRACE_REPLAY=1: spectrace's series on SGLang's /metrics, the replay file",
    "norep": "trained pair, --enable-metrics, replay off (its twin for the replay's cost)",
    "rope-replay": "draft config rope_theta 500000 (trained at 10000), --enable-metrics, SPECTRACE_REPLAY=1",
    # mode `probe`: SPECTRACE_REPLAY=1 for spectrace probe. The first four serve the target with a
    # no-op block in front (boundary 1 is the embedding), ids [0, 2, 4]: the trained inputs exactly.
    "probe-healthy": "trained pair, padded target, ids [0, 2, 4] (boundaries [1, 3, 5] = the trained inputs)",
    "probe-rope": "as probe-healthy, draft config rope_theta 100 (trained at the target's 10000)",
    "probe-gptj": "as probe-healthy, draft config rope_is_neox_style false (trained with the neox rotary)",
    "probe-d2t": "as probe-healthy, d2t = arange(draft_vocab) (t2d keeps the trained map)",
    "probe-shift": "shipped target, ids [0, 2, 4] written as boundary k: 0.5.17 captures [1, 3, 5], trained on [0, 2, 4]",
}
# The overhead phase: one healthy server at a time, without / with SPECTRACE=1, ABBA order.
OVERHEAD_SERVERS = ("overhead-off-1", "overhead-on-1", "overhead-on-2", "overhead-off-2", "overhead-skip-1", "overhead-skip-2")

# ----------------------------------------------------------------------------- boot


def project_metadata(pyproject_text: str) -> tuple[str, str, dict[str, dict[str, str]]]:
    """(name, version, SGLang entry-point groups) of the project, read from pyproject.toml."""
    import tomllib

    data = tomllib.loads(pyproject_text)
    project = data["project"]
    groups: dict[str, dict[str, str]] = {}
    # Only SGLang's plugin group: a pytest11 entry point would load into any pytest run on this path.
    for group, entries in (project.get("entry-points") or {}).items():
        if group.startswith("sglang."):
            groups[group] = dict(entries)
    return project["name"], project["version"], groups


def dist_info_files(name: str, version: str, groups: dict[str, dict[str, str]]) -> dict[str, str]:
    """The files of a minimal ``NAME-VERSION.dist-info`` that importlib.metadata can read."""
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    lines: list[str] = []
    for group in sorted(groups):
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in sorted(groups[group].items())]
        lines.append("")
    return {"METADATA": metadata, "entry_points.txt": "\n".join(lines), "INSTALLER": "spectrace-live\n"}


def sitecustomize_source(site_dirs: Iterable[str]) -> str:
    """A sitecustomize that makes ``site_dirs`` real site dirs (their ``.pth`` files run).

    Folders on PYTHONPATH are only put on sys.path; ``site.addsitedir`` also runs their
    ``.pth`` files, which is how an installed spectrace starts with ``SPECTRACE=1``.
    Any other sitecustomize further down sys.path (the image's own) still runs after.
    """
    dirs = [os.path.abspath(d) for d in site_dirs]
    return f'''"""Written by scripts/live/livekit.py boot: the spectrace bootstrap without pip install."""
import importlib.machinery as _machinery
import importlib.util as _util
import os as _os
import site as _site
import sys as _sys

for _d in {dirs!r}:
    if _os.path.isdir(_d):
        _site.addsitedir(_d)

_here = _os.path.dirname(_os.path.abspath(__file__))
_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_spec = _machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and _os.path.abspath(_spec.origin) != _os.path.abspath(__file__):
    try:
        _mod = _util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
    except Exception as _exc:
        _sys.stderr.write(f"spectrace-live: the chained sitecustomize failed: {{_exc!r}}\\n")
'''


def make_boot(work: str, repo: str, extra_site_dirs: Iterable[str] = ()) -> dict[str, str]:
    """Write WORK/boot (bootstrap .pth + dist-info) and WORK/sc/sitecustomize.py.

    Returns the two folders; put ``sc`` (and the repository) on PYTHONPATH.
    """
    boot = os.path.join(work, "boot")
    sc = os.path.join(work, "sc")
    shutil.rmtree(boot, ignore_errors=True)
    os.makedirs(boot)
    os.makedirs(sc, exist_ok=True)
    shutil.copyfile(os.path.join(repo, "bootstrap", "spectrace-bootstrap.pth"), os.path.join(boot, "spectrace-bootstrap.pth"))
    with open(os.path.join(repo, "pyproject.toml"), encoding="utf-8") as fh:
        name, version, groups = project_metadata(fh.read())
    info = os.path.join(boot, f"{name}-{version}.dist-info")
    os.makedirs(info)
    for fname, text in dist_info_files(name, version, groups).items():
        with open(os.path.join(info, fname), "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(os.path.join(sc, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(sitecustomize_source([boot, *extra_site_dirs]))
    return {"boot": boot, "sc": sc}


# --------------------------------------------------------------------------- client

# The servers are local: never route them through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(port: int, body: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _healthy(port: int) -> bool:
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped by the shell) is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def wait_up(port: int, pid: int, timeout: float) -> int:
    """0 when /health answers 200, 1 if the server process died, 2 on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if _healthy(port):
            print(f"port {port}: up after {time.monotonic() - start:.0f}s", flush=True)
            return 0
        if not _alive(pid):
            print(f"port {port}: server died after {time.monotonic() - start:.0f}s", flush=True)
            return 1
        time.sleep(2)
    print(f"port {port}: no health after {timeout:.0f}s", flush=True)
    return 2


def prompts(n: int, length: int, offset: int = 0) -> list[list[int]]:
    """Deterministic prompts of token ids inside the tiny vocabulary (3..2047), no specials."""
    return [[3 + (offset + 37 * i + 11 * j) % 2000 for j in range(length)] for i in range(n)]


def load_prompts(path: str) -> tuple[list[list[int]], int | None]:
    """Prompts (token ids) from a JSON file: a list of lists, or {"prompts": [...], "max_new_tokens": n}."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if isinstance(data, dict):
        return [list(map(int, p)) for p in data["prompts"]], data.get("max_new_tokens")
    return [list(map(int, p)) for p in data], None


def probe(
    port: int,
    n_single: int = 4,
    batch: int = 8,
    max_new: int = 48,
    given: list[list[int]] | None = None,
    temperature: float = 0.0,
) -> dict[str, Any]:
    """Single requests, then one batch; the accept length SGLang reports for each.

    ``given``: prompts to use (the trained pair's own language) instead of synthetic ones.
    ``temperature``: 0 is greedy; above 0 the server samples (EAGLE's tree sampling)."""
    results: list[dict[str, Any]] = []
    errors: list[str] = []

    def take(out: Any, kind: str) -> None:
        for o in out if isinstance(out, list) else [out]:
            m = o.get("meta_info", {})
            results.append(
                {
                    "kind": kind,
                    "output_tokens": len(o.get("output_ids") or []),
                    "spec_accept_length": m.get("spec_accept_length"),
                    "spec_verify_ct": m.get("spec_verify_ct"),
                    "spec_accept_rate": m.get("spec_accept_rate"),
                }
            )

    singles = given[:n_single] if given else prompts(n_single, 30, offset=5)
    batched = [given[i % len(given)] for i in range(batch)] if given else prompts(batch, 30, offset=101)
    for i, ids in enumerate(singles):
        try:
            sp = {"max_new_tokens": max_new, "temperature": temperature}
            take(_post(port, {"input_ids": ids, "sampling_params": sp}, 120), "single")
        except Exception as exc:
            errors.append(f"single {i}: {type(exc).__name__}: {exc}")
    try:
        body = {"input_ids": batched, "sampling_params": {"max_new_tokens": max_new, "temperature": temperature, "ignore_eos": True}}
        take(_post(port, body, 180), "batch")
    except Exception as exc:
        errors.append(f"batch: {type(exc).__name__}: {exc}")
    return {
        "port": port,
        "temperature": temperature,
        "requests": results,
        "errors": errors,
        "mean_spec_accept_length": mean_accept(results),
    }


def mean_accept(results: list[dict[str, Any]]) -> float | None:
    """Verify-step-weighted mean of the per-request accept lengths (SGLang's own figure)."""
    num = den = 0.0
    for r in results:
        a, ct = r.get("spec_accept_length"), r.get("spec_verify_ct")
        if a is None:
            continue
        w = float(ct) if ct else 1.0
        num += float(a) * w
        den += w
    return round(num / den, 4) if den else None


def _timed_batch(port: int, batch: int, max_new: int, offset: int, given: list[list[int]] | None = None) -> dict[str, Any]:
    """One timed batch: synthetic prompts, or ``given`` ones (the model's own vocabulary) cycled."""
    ids = [given[(offset + i) % len(given)] for i in range(batch)] if given else prompts(batch, 32, offset=offset)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    out = _post(port, body, 300)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.get("output_ids") or []) for o in out)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall > 0 else 0.0}


def cpu_times() -> list[int] | None:
    """The machine's aggregate CPU jiffies from /proc/stat (user nice system idle iowait irq
    softirq steal); None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
        return [int(x) for x in fields[1:9]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of CPU time the hypervisor took (steal) between two readings: on a VM, a
    neighbour's load slows a host-bound server for stretches that no A/B design removes."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta)
    return round(delta[7] / total, 4) if total > 0 else None


def bench(ports: dict[str, int], rounds: int, batch: int, max_new: int, warmup: int = 1, max_s: float | None = None) -> dict[str, Any]:
    """Interleaved decode throughput: each round runs every server once, the order alternating.

    Stops early (after at least 3 rounds) once ``max_s`` seconds have passed.
    """
    labels = list(ports)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in labels}
    start = time.monotonic()
    for w in range(warmup):
        for k in labels:
            _timed_batch(ports[k], batch, max_new, offset=900 + w)
    done = 0
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for k in order:
            res = _timed_batch(ports[k], batch, max_new, offset=r)  # same prompts for both servers
            res["round"] = r
            runs[k].append(res)
        done += 1
        if max_s is not None and done >= 3 and time.monotonic() - start > max_s:
            break
    return {
        "batch": batch,
        "max_new_tokens": max_new,
        "rounds": done,
        "rounds_asked": rounds,
        "wall_s": round(time.monotonic() - start, 1),
        "runs": runs,
        **bench_stats(runs),
    }


def bench_merge(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pool sequential single-server benches (name -> ``bench`` result of one label).

    ``ratio_of_medians`` pools every round of each label (ABBA: a drift over the run
    weighs on both sides alike). ``pair_ratios`` compares each "on" server with the "off"
    server next to it in time; ``aa_off`` / ``aa_on`` compare the two servers of one
    label: the spread the harness has between identical servers.
    """
    by_label: dict[str, list[float]] = {}
    servers: dict[str, Any] = {}
    for name, res in results.items():
        label = next(iter(res["runs"]))
        rates = [r["tok_s"] for r in res["runs"][label]]
        by_label.setdefault(label, []).extend(rates)
        servers[name] = {
            "label": label,
            "rounds": len(rates),
            "median_tok_s": round(statistics.median(rates), 1) if rates else None,
            "tok_s": [round(x, 1) for x in rates],
            "cpu_steal_share": res.get("cpu_steal_share"),
        }
    out: dict[str, Any] = {
        "design": "one server at a time, order " + ", ".join(results),
        "servers": servers,
        "median_tok_s": {k: round(statistics.median(v), 1) for k, v in by_label.items() if v},
    }
    first = next(iter(results.values()), {})
    out["batch"], out["max_new_tokens"] = first.get("batch"), first.get("max_new_tokens")
    out["rounds"] = sum(v["rounds"] for v in servers.values())
    med = out["median_tok_s"]
    if med.get("off") and med.get("on"):
        out["ratio_of_medians"] = round(med["on"] / med["off"], 4)
    if med.get("off") and med.get("skip"):
        out["skip_over_off"] = round(med["skip"] / med["off"], 4)

    def ratio(a: str, b: str) -> float | None:
        x, y = servers.get(a, {}).get("median_tok_s"), servers.get(b, {}).get("median_tok_s")
        return round(x / y, 4) if x and y else None

    count = max((sum(1 for v in servers.values() if v["label"] == lab) for lab in ("on", "off")), default=0)
    out["pair_ratios"] = {f"on-{i}/off-{i}": ratio(f"overhead-on-{i}", f"overhead-off-{i}") for i in range(1, max(count, 2) + 1)}
    # Server by server: the spread between identical servers is the larger noise, so each
    # server weighs once (the mean of their medians), not by its number of rounds.
    per_server = {lab: [v["median_tok_s"] for v in servers.values() if v["label"] == lab and v["median_tok_s"]] for lab in ("on", "off")}
    if per_server["on"] and per_server["off"]:
        out["ratio_of_server_means"] = round(statistics.mean(per_server["on"]) / statistics.mean(per_server["off"]), 4)
    out["aa_off"] = ratio("overhead-off-2", "overhead-off-1")
    out["aa_on"] = ratio("overhead-on-2", "overhead-on-1")
    return out


def bench_stats(runs: dict[str, list[dict[str, Any]]], base: str = "off", other: str = "on") -> dict[str, Any]:
    """Median tokens/s per server and the on/off ratio (ratio of medians and median of per-round ratios)."""
    med = {k: statistics.median(r["tok_s"] for r in v) for k, v in runs.items() if v}
    out: dict[str, Any] = {"median_tok_s": {k: round(v, 1) for k, v in med.items()}}
    if base in med and other in med and med[base] > 0:
        out["ratio_of_medians"] = round(med[other] / med[base], 4)
        by_round = {r["round"]: r["tok_s"] for r in runs[base]}
        per_round = [r["tok_s"] / by_round[r["round"]] for r in runs[other] if by_round.get(r["round"])]
        if per_round:
            out["median_round_ratio"] = round(statistics.median(per_round), 4)
            out["round_ratios"] = [round(x, 4) for x in per_round]
    return out


# -------------------------------------------------------------------------- the logs

_ACCEPT = re.compile(r"accept len: ([0-9.]+)")
_GEN = re.compile(r"#running-req: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")
_BLOCK = re.compile(r"^==== spectrace: (ERROR|WARNING) (\S+)(?: at (\S+))? ====$")
_SPECTRACE_LINE = re.compile(r"^spectrace: .*$")
_GRAPH = re.compile(r"graph|replay", re.I)


def parse_server_log(text: str) -> dict[str, Any]:
    """What a server log says: SGLang's accept lengths, spectrace's printed findings and notes."""
    lines = text.splitlines()
    accepts = [float(m.group(1)) for m in (_ACCEPT.search(ln) for ln in lines) if m]
    # The scheduler's own decode rate per log interval, at the batch it ran: a second
    # throughput figure, free of the client's timing, whose stretches show slow phases.
    gen = [(int(m.group(1)), float(m.group(2))) for m in (_GEN.search(ln) for ln in lines) if m]
    full = max((n for n, _ in gen), default=0)
    at_full = [rate for n, rate in gen if n == full]
    blocks = [
        {"severity": m.group(1).lower(), "code": m.group(2), "where": m.group(3)} for m in (_BLOCK.match(ln.strip()) for ln in lines) if m
    ]
    spectrace_lines = [ln.strip() for ln in lines if _SPECTRACE_LINE.match(ln.strip())]
    notes = sorted(set(spectrace_lines))
    sglang_errors = [ln.strip() for ln in lines if re.search(r"\b(Traceback|ERROR|Error:|Exception)\b", ln) and "spectrace" not in ln]
    sglang_warnings = [ln.strip() for ln in lines if re.search(r"\bWARNING\b", ln) and "spectrace" not in ln]
    return {
        "accept_len_lines": accepts,
        "accept_len_last": accepts[-1] if accepts else None,
        "gen_throughput_at_full_batch": {
            "running_req": full,
            "intervals": len(at_full),
            "median": round(statistics.median(at_full), 1) if at_full else None,
            "share_below_80pct_of_p90": round(
                sum(r < 0.8 * sorted(at_full)[int(0.9 * (len(at_full) - 1))] for r in at_full) / len(at_full), 3
            )
            if at_full
            else None,
        },
        "findings_printed": blocks,
        "spectrace_lines": notes,
        "graph_lines": [ln for ln in notes if _GRAPH.search(ln)],
        "sglang_error_lines": sglang_errors[:20],
        "sglang_warning_count": len(sglang_warnings),
        "sglang_warning_lines": sglang_warnings[:10],
        "sglang_graph_lines": [
            ln.strip()[-160:]
            for ln in lines
            if re.search(r"Capture .*(cuda graph|CUDA graph).*(begin|end|failed)", ln) and "Capturing" not in ln
        ][:12],
        "plugin_lines": sorted({ln.strip() for ln in lines if "spectrace" in ln and "plugin" in ln.lower()})[:10],
    }


def view_facts(view: dict[str, Any]) -> dict[str, Any]:
    """The parts of ``spectrace view --json`` the report compares across variants."""
    header = view.get("header", {})
    acc = view.get("acceptance", {})
    findings = [
        {"code": f.get("code"), "severity": f.get("severity"), "count": f.get("count"), "message": (f.get("message") or "")[:300]}
        for f in view.get("findings", [])
    ]
    return {
        "processes": len(header.get("processes", [])),
        "files": [p.get("file") for p in header.get("processes", [])],
        "findings": findings,
        "error_codes": sorted({f["code"] for f in findings if f["severity"] == "error"}),
        "warning_codes": sorted({f["code"] for f in findings if f["severity"] == "warning"}),
        "acceptance_mean": acc.get("overall_mean"),
        "acceptance_steps": len(acc.get("steps") or []),
        "acceptance_requests": acc.get("requests"),
        "position_rate": acc.get("position_rate"),
        "coverage_gaps": header.get("coverage_gaps", []),
        "records_dropped": header.get("records_dropped", 0),
        "not_closed": header.get("not_closed", []),  # files without their closing record
    }


def trace_file_facts(path: str) -> dict[str, Any]:
    """One trace file: its process, how many records of each type, and whether it was closed.

    A file is closed when its last line is the ``stats`` record that the exit flush appends;
    a process killed before its exit flush leaves an unclosed file (or none at all).
    """
    types: dict[str, int] = {}
    header: dict[str, Any] = {}
    last = None
    bad = 0
    counters: dict[str, Any] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                bad += 1
                continue
            kind = str(rec.get("type"))
            types[kind] = types.get(kind, 0) + 1
            if kind == "header" and not header:
                header = rec
            if kind in ("counters", "stats"):
                counters = rec
            last = kind
    facts = {
        "calls": call_facts(path) if types.get("call") else {},
        "file": os.path.basename(path),
        "pid": header.get("pid"),
        "rank": header.get("rank"),
        "types": dict(sorted(types.items())),
        "closed": last in ("counters", "stats"),
        "bad_lines": bad,
    }
    steps = types.get("acceptance", 0)
    if counters.get("hook_calls"):
        # spectrace's own host time in the engine's hooks, per verify step (accounting).
        facts["hook_calls"] = counters["hook_calls"]
        by = counters.get("hook_seconds_by_feature") or {}
        serving = sum(v for k, v in by.items() if not k.endswith("@startup"))
        facts["hook_us_per_step"] = round(serving / steps * 1e6, 1) if steps else None
        facts["hook_s_at_capture"] = round(sum(v for k, v in by.items() if k.endswith("@startup")), 3)
        if steps:
            facts["hook_us_per_step_by_feature"] = {
                k: round(v / steps * 1e6, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if not k.endswith("@startup")
            }
            # Per call, and the part of it in calls over 100 us (a lost CPU or a GIL wait).
            calls_by = counters.get("hook_calls_by_feature") or {}
            slow_n = counters.get("hook_slow_calls_by_feature") or {}
            slow_s = counters.get("hook_slow_seconds_by_feature") or {}
            facts["hook_per_feature"] = {
                k: {
                    "calls_per_step": round(calls_by[k] / steps, 2),
                    "us_per_call": round(by.get(k, 0.0) / calls_by[k] * 1e6, 2),
                    "slow_calls": slow_n.get(k, 0),
                    "slow_us_per_step": round(slow_s.get(k, 0.0) / steps * 1e6, 1),
                }
                for k in sorted(calls_by)
                if calls_by[k] and not k.endswith("@startup")
            }
            facts["hook_us_per_step_without_slow_calls"] = round((serving - sum(slow_s.values())) / steps * 1e6, 1)
    return facts


def pyspy_digest(text: str, top: int = 12) -> dict[str, Any]:
    """py-spy's raw output (``--threads --format raw``: one line per stack, frames ';'-joined,
    then a sample count) as shares: samples per thread, and for each thread the share whose
    stack holds a spectrace frame, with the spectrace frames seen most."""
    threads: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        name = frames[0]
        row = threads.setdefault(name, {"samples": 0, "in_spectrace": 0, "frames": {}})
        n = int(count)
        row["samples"] += n
        ours = [f for f in frames[1:] if "spectrace" in f]
        if ours:
            row["in_spectrace"] += n
            row["frames"][ours[-1]] = row["frames"].get(ours[-1], 0) + n
    total = sum(r["samples"] for r in threads.values()) or 1
    return {
        name: {
            "share_of_samples": round(r["samples"] / total, 4),
            "samples": r["samples"],
            "in_spectrace": round(r["in_spectrace"] / r["samples"], 4) if r["samples"] else 0.0,
            "top_spectrace_frames": dict(sorted(r["frames"].items(), key=lambda kv: -kv[1])[:top]),
        }
        for name, r in sorted(threads.items(), key=lambda kv: -kv[1]["samples"])
    }


def call_facts(path: str) -> dict[str, Any]:
    """Per role and forward mode: call records, how many from graph replays, and how many
    distinct output means they carry (statistics that change from replay to replay)."""
    out: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if '"type":"call"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("graph_capture"):
                continue
            key = f"{rec.get('role')}|{rec.get('forward_mode')}"
            row = out.setdefault(key, {"records": 0, "graph_replay": 0, "means": set(), "shapes": set(), "tokens": set()})
            row["records"] += 1
            row["graph_replay"] += bool(rec.get("graph_replay"))
            for t in rec.get("outputs", []) + rec.get("inputs", []):
                if t.get("stats"):
                    row["means"].add(round(t["stats"].get("mean") or 0.0, 9))
                    row["shapes"].add(f"{t.get('arg')}:{t.get('shape')}")
            row["tokens"].add(rec.get("tokens"))
    return {
        k: {
            "records": v["records"],
            "graph_replay": v["graph_replay"],
            "distinct_means": len(v["means"]),
            "shapes": sorted(v["shapes"])[:6],
            "token_counts": sorted(x for x in v["tokens"] if x is not None)[:8],
        }
        for k, v in sorted(out.items())
    }


def stage_stats(path: str) -> dict[str, dict[str, float]]:
    """Per (role, tensor, forward mode): the numel-weighted mean and std over every record."""
    acc: dict[str, list[float]] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if '"type":"call"' not in line:
                continue
            rec = json.loads(line)
            if rec.get("graph_capture"):
                continue
            for t in rec.get("inputs", []) + rec.get("outputs", []):
                st = t.get("stats") or {}
                n, mean, std = st.get("numel") or 0, st.get("mean"), st.get("std")
                if not n or mean is None or std is None:
                    continue
                key = f"{rec.get('role')}|{t.get('arg')}|{rec.get('forward_mode')}"
                a = acc.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                a[0] += n
                a[1] += n * mean
                a[2] += n * (std * std + mean * mean)
                a[3] = max(a[3], st.get("absmax") or 0.0)
    out = {}
    for key, (n, s1, s2, absmax) in acc.items():
        mean = s1 / n
        out[key] = {"numel": n, "mean": mean, "std": max(s2 / n - mean * mean, 0.0) ** 0.5, "absmax": absmax}
    return out


def compare_stats(a_dir: str, b_dir: str) -> dict[str, Any]:
    """The same prompts through two servers (CUDA graphs on / off): per-stage statistics side by side."""

    def merged(directory: str) -> dict[str, dict[str, float]]:
        found: dict[str, dict[str, float]] = {}
        for f in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if f.endswith(".jsonl"):
                found.update(stage_stats(os.path.join(directory, f)))
        return found

    a, b = merged(a_dir), merged(b_dir)
    rows = {}
    for key in sorted(set(a) & set(b)):
        sa, sb = a[key], b[key]
        rel_std = abs(sa["std"] - sb["std"]) / max(abs(sb["std"]), 1e-12)
        rows[key] = {
            "graph": sa,
            "eager": sb,
            "rel_std_diff": round(rel_std, 5),
            "mean_diff_in_std": round(abs(sa["mean"] - sb["mean"]) / max(sb["std"], 1e-12), 5),
        }
    return {"stages": rows, "only_graph": sorted(set(a) - set(b)), "only_eager": sorted(set(b) - set(a))}


_DECODE_LINE = re.compile(r"#running-req: (\d+),.*?accept len: ([0-9.]+),.*gen throughput \(token/s\): ([0-9.]+)")


def _decode_samples(text: str) -> list[tuple[int, float, float]]:
    """(running requests, accept length, tokens/s) of each decode log line SGLang printed."""
    out = []
    for m in (_DECODE_LINE.search(ln) for ln in text.splitlines()):
        if m:
            out.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _ci95(logs: list[float]) -> tuple[float, float, float]:
    """Mean of log-ratios and its 95 % interval (t, two-sided), as ratios."""
    n = len(logs)
    mean = statistics.fmean(logs)
    if n < 2:
        return math.exp(mean), float("nan"), float("nan")
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 2.0 if n > 30 else 2.1)
    half = t * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def quad_ratios(per_window: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """On/off per on-off-off-on quad of windows, with a 95 % interval, and the A/A ratios
    (the two on windows of a quad, the two off windows): what the design can resolve."""
    on_off, aa_on, aa_off = [], [], []
    for q in range(len(per_window) // 4):
        a, b, c, d = (per_window[4 * q + i][key] for i in range(4))
        if all(x == x and x > 0 for x in (a, b, c, d)):
            on_off.append(math.log((a + d) / (b + c)))
            aa_on.append(math.log(a / d))
            aa_off.append(math.log(b / c))
    if not on_off:
        return {"quads": 0}
    r, lo, hi = _ci95(on_off)
    return {
        "quads": len(on_off),
        "on_over_off": round(r, 4),
        "ci95": [round(lo, 4), round(hi, 4)],
        "per_quad": [round(math.exp(x), 4) for x in on_off],
        "aa_on_per_quad": [round(math.exp(x), 4) for x in aa_on],
        "aa_off_per_quad": [round(math.exp(x), 4) for x in aa_off],
        "aa_spread_median_abs": round(math.exp(_median([abs(x) for x in aa_on + aa_off])) - 1, 4),
    }


def steady_bench(
    port: int,
    control: str,
    log_path: str,
    clients: int,
    max_new: int,
    windows: int,
    window_s: float,
    settle_s: float = 1.0,
    warmup_s: float = 8.0,
    given: list[list[int]] | None = None,
    pattern: tuple[str, ...] = ("on", "off", "off", "on"),
    off_word: str = "off",
) -> dict[str, Any]:
    """Decode cost inside ONE server under a steady load, spectrace's per-step work switched
    on and off at run time (SPECTRACE_CONTROL) in windows on off off on ...

    ``clients`` threads keep ``clients`` requests running at all times, so the batch holds
    steady. The measure is SGLang's own decode log line (``--decode-log-interval``): its
    tokens/s over the last few steps, and the step rate tokens/s / (running x accept length),
    which sets aside how many requests ran and how many tokens each step accepted. The lines
    of the first ``settle_s`` after a switch are left out. Per quad (on off off on) the ratio
    on/off cancels a linear drift; the A/A ratios (on/on, off/off inside a quad) show what
    the design resolves. ``off_word`` is what an "off" window writes to the control file:
    ``off`` pauses the per-step work, ``metrics-off`` only the Prometheus sink."""
    stop = threading.Event()
    errors: list[str] = []

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            ids = given[(i + n * clients) % len(given)] if given else prompts(1, 32, offset=i * 131 + n)[0]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
            try:
                _post(port, body, 300)
            except Exception as exc:  # a failed request is said, the load goes on
                if len(errors) < 5:
                    errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)
            n += 1

    def setstate(word: str) -> None:
        with open(control, "w", encoding="ascii") as fh:
            fh.write((off_word if word == "off" else word) + "\n")

    log = open(log_path, encoding="utf-8", errors="replace")
    log.seek(0, os.SEEK_END)
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    setstate("on")
    for t in threads:
        t.start()
    time.sleep(warmup_s)
    log.read()
    per_window: list[dict[str, Any]] = []
    for w in range(windows):
        label = pattern[w % len(pattern)]
        setstate(label)
        time.sleep(settle_s)  # the server looks at the file every 0.25 s; then a full log interval
        log.read()
        time.sleep(window_s)
        samples = _decode_samples(log.read())
        full = max((r for r, _, _ in samples), default=0)
        # Lines at the steady batch only: a line during a request's prefill or finish ran fewer.
        steady = [(r, a, tps) for r, a, tps in samples if r >= max(1, int(0.9 * full))]
        per_window.append(
            {
                "state": label,
                "lines": len(steady),
                "running": full,
                "tok_s": _median([tps for _, _, tps in steady]),
                "steps_s": _median([tps / (r * a) for r, a, tps in steady if r and a]),
                "accept": _median([a for _, a, _ in steady]),
            }
        )
    setstate("on")
    stop.set()
    log.close()

    return {
        "design": "steady load of `clients` requests, windows on off off on ..., SGLang's decode log lines",
        "off_word": off_word,
        "clients": clients,
        "max_new_tokens": max_new,
        "window_s": window_s,
        "settle_s": settle_s,
        "windows": per_window,
        "tokens_per_s": quad_ratios(per_window, "tok_s"),
        "steps_per_s": quad_ratios(per_window, "steps_s"),
        "client_errors": errors,
    }


def trace_dir_facts(directory: str) -> list[dict[str, Any]]:
    if not os.path.isdir(directory):
        return []
    return [trace_file_facts(os.path.join(directory, f)) for f in sorted(os.listdir(directory)) if f.endswith(".jsonl")]


# ------------------------------------------------------------------- metrics, replay

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port: int, timeout: float = 10.0) -> str:
    """The text of the server's own /metrics (SGLang serves it with --enable-metrics)."""
    with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        return str(resp.read().decode("utf-8", errors="replace"))


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus' text format, sample by sample: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(3) or "")), value))
    return out


def metrics_facts(text: str) -> dict[str, Any]:
    """What a /metrics page says about spectrace and about SGLang's speculative decoding:
    spectrace's series, its accept length (histogram sum / count), SGLang's own gauge
    (the last decode-log interval) and its request counters (generated tokens per verify
    call, the first token of each request included)."""
    samples = parse_metrics(text)

    def total(name: str, **want: str) -> float | None:
        got = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in want.items())]
        return sum(got) if got else None

    names = sorted({n for n, _, _ in samples if n.startswith("spectrace_")})
    families = sorted({re.sub(r"_(total|sum|count|bucket|created)$", "", n) for n in names})
    acc_sum, acc_n = total("spectrace_accept_length_sum"), total("spectrace_accept_length_count")
    gauges = [v for n, _, v in samples if n == "sglang:spec_accept_length"]
    gen, verify = total("sglang:generation_tokens_total"), total("sglang:spec_verify_calls_total")
    findings: dict[str, float] = {}
    for n, lab, v in samples:
        if n == "spectrace_findings_total" and v:
            key = f"{lab.get('code')}/{lab.get('severity')}"
            findings[key] = findings.get(key, 0.0) + v
    roots = sorted({lab.get("code", "") for n, lab, v in samples if n == "spectrace_root_cause" and v == 1})
    return {
        "samples": len(samples),
        "spectrace_series": names,
        "spectrace_families": families,
        "spectrace_info": total("spectrace_info"),
        "spectrace_accept_length": round(acc_sum / acc_n, 4) if acc_sum is not None and acc_n else None,
        "spectrace_accept_observations": acc_n,
        "spectrace_verify_steps": total("spectrace_verify_steps_total"),
        "spectrace_findings": findings,
        "spectrace_root_causes": roots,
        "spectrace_records_dropped": total("spectrace_records_dropped_total"),
        "spectrace_internal_errors": total("spectrace_internal_errors_total"),
        "sglang_spec_accept_length_gauge": gauges[-1] if gauges else None,
        "sglang_generation_tokens": gen,
        "sglang_spec_verify_calls": verify,
        "sglang_generated_per_verify": round(gen / verify, 4) if gen is not None and verify else None,
    }


def replay_file_facts(path: str) -> dict[str, Any]:
    """A replay file's size and the metadata spectrace wrote into its safetensors header
    (read with the standard library: 8 bytes of header length, then the JSON header)."""
    facts: dict[str, Any] = {"file": os.path.basename(path), "bytes": os.path.getsize(path)}
    try:
        mode = os.stat(path).st_mode & 0o777
        facts["mode"] = oct(mode)
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(min(n, 1 << 20)))
        meta = json.loads((header.get("__metadata__") or {}).get("spectrace") or "{}")
        facts["tensors"] = len([k for k in header if k != "__metadata__"])
        facts["meta"] = meta
        facts["forward_modes"] = [f.get("forward_mode") for f in meta.get("forwards", [])]
        facts["bytes_per_forward"] = meta.get("bytes_per_forward")
    except (OSError, ValueError) as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


def _on_windows(bench_res: dict[str, Any], key: str) -> list[float]:
    return [w[key] for w in bench_res.get("windows", []) if w.get("state") == "on" and w.get(key) == w.get(key) and w.get(key)]


def server_abba(benches: list[tuple[str, dict[str, Any]]], key: str, a: str, b: str) -> dict[str, Any]:
    """Between two servers benched in turn A B B A: the ratio b/a of the medians of their
    "on" windows, per pair of turns (A1 B1, A2 B2), and pooled; the two turns of one server
    (A1/A2, B1/B2) are the A/A spread a server-to-server figure must beat."""
    med = {name: _median(_on_windows(res, key)) for name, res in benches}
    turns_a = [n for n, _ in benches if n.startswith(a)]
    turns_b = [n for n, _ in benches if n.startswith(b)]
    pairs = [round(med[y] / med[x], 4) for x, y in zip(turns_a, turns_b) if med[x] and med[y]]
    pooled_a = _median([v for n, res in benches if n.startswith(a) for v in _on_windows(res, key)])
    pooled_b = _median([v for n, res in benches if n.startswith(b) for v in _on_windows(res, key)])
    aa = [round(med[t[0]] / med[t[-1]], 4) for t in (turns_a, turns_b) if len(t) >= 2 and med[t[-1]]]
    return {
        "median_on_windows": {n: round(v, 2) for n, v in med.items()},
        f"{b}_over_{a}_per_pair": pairs,
        f"{b}_over_{a}_pooled": round(pooled_b / pooled_a, 4) if pooled_a and pooled_b else None,
        "aa_same_server_turns": aa,
    }


def metrics_report(work: str) -> dict[str, Any]:
    """Mode ``metrics``: the /metrics scrapes against SGLang's own accept length, the metrics'
    cost on/off inside each server, the replay files and the replay's cost between servers."""
    logs = os.path.join(work, "logs")
    report: dict[str, Any] = {"servers": {}, "cost": {}}
    for name in ("metrics", "norep", "rope-replay"):
        if not os.path.exists(os.path.join(logs, f"server-{name}.log")):
            continue
        entry: dict[str, Any] = {"what": VARIANTS.get(name, ""), "server": _read(os.path.join(logs, f"status-{name}.txt")).strip()}
        for when in ("before", "after", "end"):
            text = _read(os.path.join(logs, f"metrics-{name}-{when}.txt"))
            if text:
                entry[f"metrics_{when}"] = metrics_facts(text)
        probe_res = _load_json(os.path.join(logs, f"probe-{name}.json"))
        if isinstance(probe_res, dict):
            entry["sglang_accept_length_requests"] = probe_res.get("mean_spec_accept_length")
            entry["probe_errors"] = probe_res.get("errors")
        view = _load_json(os.path.join(work, "views", f"{name}.json"))
        if isinstance(view, dict):
            facts = view_facts(view)
            entry["trace_accept_length"] = facts["acceptance_mean"]
            entry["trace_error_codes"] = facts["error_codes"]
            entry["trace_warning_codes"] = facts["warning_codes"]
        folder = os.path.join(work, "traces", name)
        if os.path.isdir(folder):
            entry["replay_files"] = [
                replay_file_facts(os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f.endswith(".replay.safetensors")
            ]
        entry["log"] = {
            k: v
            for k, v in parse_server_log(_read(os.path.join(logs, f"server-{name}.log"))).items()
            if k in ("accept_len_last", "findings_printed", "sglang_error_lines")
        }
        report["servers"][name] = entry
    benches = []
    for f in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if f.startswith("steady-") and f.endswith(".json") and f[len("steady-") :].split("-")[0] in ("metrics", "norep"):
            res = _load_json(os.path.join(logs, f))
            if isinstance(res, dict):
                benches.append((f[len("steady-") : -len(".json")], res))
    # the turns in the order they ran (metrics-1, norep-1, norep-2, metrics-2)
    benches.sort(key=lambda nr: int(nr[0].rsplit("-", 1)[-1]) * 10 + (0 if nr[0].startswith("metrics") else 1))
    for name, res in benches:
        report["cost"][f"metrics_on_off_{name}"] = {key: res.get(key) for key in ("steps_per_s", "tokens_per_s", "client_errors")}
    if benches:
        report["cost"]["replay_between_servers"] = {key: server_abba(benches, key, "metrics", "norep") for key in ("steps_s", "tok_s")}
    return report


# ----------------------------------------------------------------------- the summary


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _load_json(path: str) -> Any:
    text = _read(path)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def collect(work: str) -> dict[str, Any]:
    """Everything the run left in WORK, as one JSON-able dict."""
    summary: dict[str, Any] = {"variants": {}, "overhead": None, "phases": _load_json(os.path.join(work, "phases.json"))}
    for name, what in VARIANTS.items():
        log = os.path.join(work, "logs", f"server-{name}.log")
        if not os.path.exists(log):
            continue
        status = _read(os.path.join(work, "logs", f"status-{name}.txt")).strip().splitlines()
        entry: dict[str, Any] = {"what": what, "server": status[0] if status else "", "server_notes": status[1:]}
        entry["log"] = parse_server_log(_read(log))
        entry["client"] = _load_json(os.path.join(work, "logs", f"probe-{name}.json"))
        view = _load_json(os.path.join(work, "views", f"{name}.json"))
        entry["trace"] = view_facts(view) if isinstance(view, dict) else None
        entry["trace_files"] = trace_dir_facts(os.path.join(work, "traces", name))
        summary["variants"][name] = entry
    for extra in ("steady-tiny", "steady-big", "compare-graph-eager"):
        found = _load_json(os.path.join(work, "logs", f"{extra}.json"))
        if found is not None:
            summary[extra] = found
    for label in ("tiny", "big"):
        raw = _read(os.path.join(work, "logs", f"pyspy-{label}.txt"))
        if raw:
            summary[f"pyspy-{label}"] = pyspy_digest(raw)
    host = _read(os.path.join(work, "logs", "host.txt"))
    if host:
        summary["host"] = host.strip().splitlines()[:40]
    bench_res = _load_json(os.path.join(work, "logs", "bench.json"))
    if bench_res is not None:
        ov: dict[str, Any] = dict(bench_res)
        ov["logs"] = {
            name: parse_server_log(_read(os.path.join(work, "logs", f"server-{name}.log")))
            for name in OVERHEAD_SERVERS
            if os.path.exists(os.path.join(work, "logs", f"server-{name}.log"))
        }
        views = [_load_json(os.path.join(work, "views", f"{name}.json")) for name in ("overhead-on-1", "overhead-on-2")]
        ov["trace_on"] = [view_facts(v) for v in views if isinstance(v, dict)]
        ov["trace_files_on"] = [
            f for name in ("overhead-on-1", "overhead-on-2") for f in trace_dir_facts(os.path.join(work, "traces", name))
        ]
        summary["overhead"] = ov
    elif os.path.exists(os.path.join(work, "logs", "status-overhead.txt")):
        summary["overhead"] = {"status": _read(os.path.join(work, "logs", "status-overhead.txt")).strip()}
    return summary


def probe_report(work: str, names: list[str]) -> dict[str, Any]:
    """Mode ``probe``: per server, SGLang's accept length, spectrace probe's verdict and variants,
    and the view's findings; then each fix's estimate against the healthy server's measurement."""
    servers: dict[str, Any] = {}
    for name in names:
        folder = os.path.join(work, "traces", name)
        results = sorted(glob.glob(os.path.join(folder, "*.probe.json")))
        result = _load_json(results[-1]) if results else None
        text = _read(os.path.join(work, "views", f"spectrace-probe-{name}.txt"))
        view = _load_json(os.path.join(work, "views", f"{name}.json"))
        client = _load_json(os.path.join(work, "logs", f"probe-{name}.json")) or {}
        status = _read(os.path.join(work, "logs", f"status-{name}.txt")).strip().splitlines()
        entry: dict[str, Any] = {
            "what": VARIANTS.get(name, ""),
            "server": status[0] if status else "",
            "sglang_accept_length_requests": client.get("mean_spec_accept_length"),
            "sglang_accept_length_log": parse_server_log(_read(os.path.join(work, "logs", f"server-{name}.log"))).get("accept_len_last"),
            "client_errors": client.get("errors"),
            "probe_exit": text.strip().splitlines()[-1] if text.strip() else None,
            "probe_verdict": next((ln for ln in text.splitlines() if ln.startswith("verdict")), None),
            "probe_fix": next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("fix:")), None),
            "probe_error": next((ln for ln in text.splitlines() if "error:" in ln), None),
            "replay_files": [os.path.basename(f) for f in sorted(glob.glob(os.path.join(folder, "*.replay.safetensors")))],
        }
        if isinstance(result, dict):
            keep = ("rows_used", "rows", "paired_rows", "written_rows", "steps", "steps_from", "live_accept_length", "served_wins")
            entry.update({k: result.get(k) for k in keep})
            entry["winner"] = result.get("winner")
            entry["variants"] = result.get("variants")
            entry["notes"] = result.get("notes")
        if isinstance(view, dict):
            facts = view_facts(view)
            entry["view_errors"] = facts["error_codes"]
            entry["view_warnings"] = facts["warning_codes"]
            entry["view_findings"] = facts["findings"]
        servers[name] = entry
    healthy = servers.get("probe-healthy", {}).get("sglang_accept_length_requests")
    against: dict[str, Any] = {}
    for name, entry in servers.items():
        win = next((v for v in entry.get("variants") or [] if v.get("name") == entry.get("winner")), None)
        if win is None or not healthy:
            continue
        against[name] = {
            "winner": win["name"],
            "estimate": win["chain"],
            "healthy_measured": healthy,
            "ratio": round(win["chain"] / healthy, 3),
            "within_25pct": abs(win["chain"] / healthy - 1) <= 0.25,
        }
    return {"servers": servers, "estimate_vs_healthy": against}


def _fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.2f}"
    if isinstance(x, (list, tuple)):
        return ", ".join(_fmt(i) for i in x) or "—"
    return str(x)


def render_markdown(summary: dict[str, Any]) -> str:
    out = ["# spectrace live run (SGLang 0.5.17, H200)", ""]
    if summary.get("phases"):
        out += ["Phases (s since start): " + ", ".join(f"{k} {v}" for k, v in summary["phases"].items()), ""]
    if summary["variants"]:
        out += [
            "| variant | server | errors printed in log | errors in trace | warnings in trace "
            "| SGLang accept len (requests / log) | spectrace accept len (steps) | trace files closed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, v in summary["variants"].items():
            log, tr, cl = v["log"], v.get("trace") or {}, v.get("client") or {}
            files = v.get("trace_files") or []
            printed = sorted({b["code"] for b in log["findings_printed"]})
            out.append(
                f"| {name} | {v['server'] or '?'} | {_fmt(printed)} | {_fmt(tr.get('error_codes'))} "
                f"| {_fmt(tr.get('warning_codes'))} | {_fmt(cl.get('mean_spec_accept_length'))} / "
                f"{_fmt(log['accept_len_last'])} | {_fmt(tr.get('acceptance_mean'))} ({_fmt(tr.get('acceptance_steps'))}) "
                f"| {sum(f['closed'] for f in files)}/{len(files)} |"
            )
        out.append("")
        for name, v in summary["variants"].items():
            tr = v.get("trace") or {}
            out += [f"## {name}: {v['what']}", ""]
            out += [f"- server: {v['server'] or '?'}"] + [f"- server: {n}" for n in v.get("server_notes", [])]
            for tf in v.get("trace_files", []):
                out.append(
                    f"- trace file {tf['file']} (rank {tf['rank']}): "
                    f"{'closed' if tf['closed'] else 'NOT closed (no exit flush)'}; {tf['types']}"
                )
            if tr.get("not_closed"):  # drop counts reach the file in its closing record
                out.append(f"- records dropped: unknown ({len(tr['not_closed'])} file(s) not closed)")
            else:
                out.append(f"- records dropped: {tr.get('records_dropped', 0)}")
            for f in tr.get("findings", []):
                out.append(f"- {f['severity']} `{f['code']}` ×{f['count']}: {f['message']}")
            for g in tr.get("coverage_gaps", []):
                out.append(f"- coverage: {g}")
            for ln in v["log"]["spectrace_lines"][:12]:
                out.append(f"- log: `{ln}`")
            if v["log"]["sglang_error_lines"]:
                out.append(
                    f"- SGLang error lines: {len(v['log']['sglang_error_lines'])} (first: `{v['log']['sglang_error_lines'][0][:200]}`)"
                )
            if (v.get("client") or {}).get("errors"):
                out.append(f"- client errors: {v['client']['errors']}")
            out.append("")
    ov = summary.get("overhead")
    if ov:
        out += ["## Overhead: healthy server, SPECTRACE off vs on (one server at a time, ABBA)", ""]
        if "median_tok_s" in ov:
            out += [
                f"- {ov.get('design')}; batch {ov.get('batch')} × {ov.get('max_new_tokens')} new tokens",
                "| server | rounds | median tokens/s | CPU steal | per round |",
                "|---|---|---|---|---|",
            ]
            for name, sv in (ov.get("servers") or {}).items():
                out.append(
                    f"| {name} | {sv['rounds']} | {_fmt(sv['median_tok_s'])} | {_fmt(sv.get('cpu_steal_share'))} | {_fmt(sv['tok_s'])} |"
                )
            gens = {name: log.get("gen_throughput_at_full_batch") for name, log in (ov.get("logs") or {}).items()}
            if any(g and g.get("median") for g in gens.values()):
                out += [
                    "",
                    "Scheduler's own decode rate at full batch (log intervals): median tokens/s, share of intervals below 80 % of its p90:",
                ]
                out += [
                    f"- {name}: {_fmt(g.get('median'))} over {g.get('intervals')} intervals, slow share {_fmt(g.get('share_below_80pct_of_p90'))}"
                    for name, g in gens.items()
                    if g and g.get("median")
                ]
            out += [
                "",
                f"- pooled median tokens/s: {ov['median_tok_s']}; on/off: **{_fmt(ov.get('ratio_of_medians'))}**",
                f"- neighbouring pairs: {ov.get('pair_ratios')}; mean of server medians, on/off: {_fmt(ov.get('ratio_of_server_means'))}",
                f"- A/A (same label, two servers): off {_fmt(ov.get('aa_off'))}, on {_fmt(ov.get('aa_on'))}",
            ]
            for tr in ov.get("trace_on") or []:
                out.append(
                    f"- SPECTRACE=1 server's trace: errors {_fmt(tr.get('error_codes'))}, "
                    f"acceptance mean {_fmt(tr.get('acceptance_mean'))} over {_fmt(tr.get('acceptance_steps'))} steps"
                )
            on_rate = (ov.get("median_tok_s") or {}).get("on")
            for tf in ov.get("trace_files_on") or []:
                if tf.get("hook_us_per_step") is not None and on_rate and ov.get("batch"):
                    accept = next((t.get("acceptance_mean") for t in ov.get("trace_on") or [] if t.get("acceptance_mean")), 1.0)
                    step_us = ov["batch"] * accept / on_rate * 1e6  # each verify step yields `accept` tokens per request
                    out.append(
                        f"- {tf['file']}: {tf['hook_us_per_step']} us of spectrace hooks per verify step "
                        f"({tf['hook_calls']} hook calls) = {tf['hook_us_per_step'] / step_us:.2%} of a {step_us:.0f} us step"
                    )
                    if tf.get("hook_us_per_step_by_feature"):
                        out.append(f"  - by hook (us per verify step): {tf['hook_us_per_step_by_feature']}")
        else:
            out.append(f"- {ov.get('status')}")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------- the CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="livekit.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("boot")
    b.add_argument("work")
    b.add_argument("--repo", required=True)
    b.add_argument("--site-dir", action="append", default=[])
    w = sub.add_parser("wait")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--pid", type=int, required=True)
    w.add_argument("--timeout", type=float, default=300)
    pr = sub.add_parser("probe")
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--prompts", default=None, help="a JSON file of prompts (and max_new_tokens) to send")
    pr.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request (0: greedy)")
    bo = sub.add_parser("bench-one")
    bo.add_argument("--label", required=True, choices=("off", "on", "skip"))
    bo.add_argument("--port", type=int, required=True)
    bo.add_argument("--rounds", type=int, default=6)
    bo.add_argument("--batch", type=int, default=32)
    bo.add_argument("--max-new", type=int, default=256)
    bo.add_argument("--max-s", type=float, default=None)
    # One warm-up batch left a fresh server 20-40 % slow for two more rounds (first-use
    # kernels, allocator growth): three keep that out of the figure.
    bo.add_argument("--warmup", type=int, default=3)
    bo.add_argument("--out", required=True)
    bm = sub.add_parser("bench-merge")
    bm.add_argument("--out", required=True)
    bm.add_argument("files", nargs="+")
    sb = sub.add_parser("steady-bench")
    sb.add_argument("--port", type=int, required=True)
    sb.add_argument("--control", required=True)
    sb.add_argument("--log", required=True, help="the server's log file (its decode lines are the measure)")
    sb.add_argument("--clients", type=int, default=32)
    sb.add_argument("--max-new", type=int, default=256)
    sb.add_argument("--windows", type=int, default=24)
    sb.add_argument("--window-s", type=float, default=3.0)
    sb.add_argument("--settle-s", type=float, default=1.0)
    sb.add_argument("--prompts", default=None)
    sb.add_argument("--pattern", default="on,off,off,on", help="the states of the windows, repeated (on alone: a load for a profile)")
    sb.add_argument("--off-word", default="off", help="what an off window writes (metrics-off: the Prometheus sink only)")
    sb.add_argument("--out", required=True)
    sc = sub.add_parser("scrape")
    sc.add_argument("--port", type=int, required=True)
    sc.add_argument("--out", required=True)
    mr = sub.add_parser("metrics-report")
    mr.add_argument("work")
    mr.add_argument("--out", required=True)
    cs = sub.add_parser("compare-stats")
    cs.add_argument("graph_dir")
    cs.add_argument("eager_dir")
    cs.add_argument("--out", required=True)
    prr = sub.add_parser("probe-report")
    prr.add_argument("work")
    prr.add_argument("names", nargs="+")
    prr.add_argument("--out", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("work")
    s.add_argument("out")
    a = p.parse_args(argv)

    if a.cmd == "boot":
        print(json.dumps(make_boot(a.work, a.repo, a.site_dir)))
        return 0
    if a.cmd == "wait":
        return wait_up(a.port, a.pid, a.timeout)
    if a.cmd == "probe":
        if a.prompts:
            given, max_new = load_prompts(a.prompts)
            res = probe(a.port, n_single=len(given), batch=8, max_new=max_new or 40, given=given, temperature=a.temperature)
        else:
            res = probe(a.port, temperature=a.temperature)
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        print(
            f"port {a.port}: {len(res['requests'])} answers, SGLang accept length "
            f"{res['mean_spec_accept_length']}, errors {len(res['errors'])}",
            flush=True,
        )
        return 0 if res["requests"] else 1
    if a.cmd == "bench-one":
        before = cpu_times()
        res = bench({a.label: a.port}, a.rounds, a.batch, a.max_new, warmup=a.warmup, max_s=a.max_s)
        res["cpu_steal_share"] = steal_share(before, cpu_times())
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        print(f"bench {a.label} port {a.port}: median tok/s {res['median_tok_s']} over {res['rounds']} rounds", flush=True)
        return 0
    if a.cmd == "bench-merge":
        results = {os.path.basename(f)[len("bench-") : -len(".json")]: _load_json(f) for f in a.files}
        merged = bench_merge({k: v for k, v in results.items() if isinstance(v, dict)})
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(merged, fh, indent=1)
        print(
            f"overhead: pooled median tok/s {merged['median_tok_s']}, on/off {merged.get('ratio_of_medians')}, "
            f"pairs {merged['pair_ratios']}, A/A off {merged['aa_off']} on {merged['aa_on']}",
            flush=True,
        )
        return 0
    if a.cmd == "steady-bench":
        steady_given = load_prompts(a.prompts)[0] if a.prompts else None
        res = steady_bench(
            a.port,
            a.control,
            a.log,
            a.clients,
            a.max_new,
            a.windows,
            a.window_s,
            a.settle_s,
            given=steady_given,
            pattern=tuple(a.pattern.split(",")),
            off_word=a.off_word,
        )
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        for key in ("steps_per_s", "tokens_per_s"):
            r = res[key]
            print(
                f"steady port {a.port} {key}: on/off {r.get('on_over_off')} ci95 {r.get('ci95')} over {r.get('quads')} quads, "
                f"A/A median |spread| {r.get('aa_spread_median_abs')}",
                flush=True,
            )
        return 0
    if a.cmd == "scrape":
        try:
            text = scrape(a.port)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            print(f"port {a.port}: /metrics: {type(exc).__name__}: {exc}", flush=True)
            return 1
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        facts = metrics_facts(text)
        print(
            f"port {a.port} /metrics: {facts['samples']} samples, spectrace families {len(facts['spectrace_families'])}, "
            f"spectrace accept length {facts['spectrace_accept_length']}, sglang gauge {facts['sglang_spec_accept_length_gauge']}",
            flush=True,
        )
        return 0
    if a.cmd == "probe-report":
        res = probe_report(a.work, a.names)
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        for name, e in res["servers"].items():
            print(
                f"{name}: SGLang accept {e.get('sglang_accept_length_requests')}; probe {e.get('probe_exit')}, winner {e.get('winner')}; errors {e.get('view_errors')}"
            )
        for name, e in res["estimate_vs_healthy"].items():
            print(f"{name}: {e['winner']} estimates {e['estimate']} against the healthy server's {e['healthy_measured']} ({e['ratio']})")
        return 0
    if a.cmd == "metrics-report":
        res = metrics_report(a.work)
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        for name, e in res["servers"].items():
            m = e.get("metrics_after") or {}
            print(
                f"{name}: spectrace accept {m.get('spectrace_accept_length')} vs sglang gauge {m.get('sglang_spec_accept_length_gauge')}, "
                f"requests {e.get('sglang_accept_length_requests')}; replay files {[(r['bytes'], r.get('forward_modes')) for r in e.get('replay_files', [])]}",
                flush=True,
            )
        for name, c in res["cost"].items():
            print(f"{name}: {json.dumps(c)[:400]}", flush=True)
        return 0
    if a.cmd == "compare-stats":
        res = compare_stats(a.graph_dir, a.eager_dir)
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        worst = max((r["rel_std_diff"] for r in res["stages"].values()), default=None)
        print(f"graph vs eager: {len(res['stages'])} stages compared, worst relative std difference {worst}", flush=True)
        return 0
    if a.cmd == "summarize":
        summary = collect(a.work)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
        with open(os.path.join(a.out, "summary.md"), "w", encoding="utf-8") as fh:
            fh.write(render_markdown(summary) + "\n")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""The header of the view: the processes, the steps and time traced, what was dropped,
what the hooks cost the host, and the blind spots (coverage) of a run's trace files."""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from .accumulate import FileState
from .drops import merge_reasons
from .limits import time_ok
from .parts import HeaderSummary, ProcessInfo, ViewFilter
from .traceset import TraceFile, TraceSet, shown_path


def header_summary(ts: TraceSet, files: list[TraceFile], states: list[FileState], flt: ViewFilter) -> HeaderSummary:
    call_steps: set[int] = states[0].steps if len(states) == 1 else set().union(*(s.steps for s in states))
    acc_steps = {s for f in files for s in f.acceptance.steps() if flt.step_ok(s)}
    extra = acc_steps - call_steps
    firsts = [min(call_steps)] if call_steps else []
    lasts = [max(call_steps)] if call_steps else []
    if extra:
        firsts.append(min(extra))
        lasts.append(max(extra))
    procs = [
        ProcessInfo(
            file=f.name,
            host=f.header.host if f.header else None,
            pid=f.header.pid if f.header else None,
            process_id=f.header.process_id if f.header else "",
            rank=f.rank,
            schema_version=f.header.schema_version if f.header else None,
            spectrace_version=f.header.spectrace_version if f.header else None,
            records=f.record_count,
            state=closure_state(f),
            last_record=_iso(last_record_unix(f)),
        )
        for f in files
    ]
    starts = [f.header.started_unix for f in files if f.header and time_ok(f.header.started_unix)]
    stamped = [s.stamp for s in states if s.stamp is not None]
    started = span = None
    if starts:
        started = datetime.fromtimestamp(min(starts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        # Only call records carry a time: a serving trace under CUDA graphs (acceptance
        # records only) has no span to state, and "0.0 s" would read as a measurement.
        span = round(max(starts + stamped) - min(starts), 3) if stamped else None
    dropped, gaps = _coverage(files)
    return HeaderSummary(
        source=shown_path(ts.source),
        processes=procs,
        ranks=sorted({f.rank for f in files if f.rank is not None}),
        step_first=min(firsts) if firsts else None,
        step_last=max(lasts) if lasts else None,
        steps_traced=len(call_steps) + len(extra),
        started=started,
        span_s=span,
        records_dropped=dropped,
        dropped_by_reason=merge_reasons([_last_counters(f).dropped_by_reason for f in files if f.counters]),
        not_closed=[not_closed_line(f) for f in files if closure_state(f) != "closed"],
        **_hook_cost(files),
        coverage_gaps=[g for g in gaps if not g.startswith(GRAPH_TRACED)],
        graph_traced=next((g[len(GRAPH_TRACED) :] for g in gaps if g.startswith(GRAPH_TRACED)), None),
        load_problems=[p.message for p in ts.problems],
        values=[f"{v.file} ({v.tokens} tokens x {len(v.steps)} steps)" for f in files for v in f.values],
    )


def _hook_cost(files: list[TraceFile]) -> dict[str, Any]:
    """What spectrace's own serving hooks cost the host, steady state and start-up apart.

    Start-up (graph capture, each hook's first calls: imports, kernel compiles) is paid
    once, so it is neither in the per-call nor in the per-step figures: it is said apart,
    as the time it took and its calls. The per-step figure is split by patch-point feature
    (largest first), with the part of it spent in calls over 100 us.

    Counters are cumulative, so per file the last (largest) counters record counts; a verify
    step is one acceptance record.
    """
    calls = startup_calls = steps = 0
    seconds = slow = 0.0
    by_feature: dict[str, float] = {}
    for f in files:
        last = max(f.counters, key=lambda s: s.hook_calls, default=None)
        if last is None or not last.hook_calls:
            continue
        calls += last.hook_calls
        seconds += last.hook_seconds
        startup_calls += sum(n for k, n in last.hook_calls_by_feature.items() if k.endswith(STARTUP_SUFFIX))
        slow += sum(v for k, v in last.hook_slow_seconds_by_feature.items() if not k.endswith(STARTUP_SUFFIX))
        steps += len(f.acceptance)
        for feature, spent in last.hook_seconds_by_feature.items():
            by_feature[feature] = by_feature.get(feature, 0.0) + spent
    if not calls:
        return {}
    startup = sum(v for k, v in by_feature.items() if k.endswith(STARTUP_SUFFIX))
    serving, serving_calls = max(0.0, seconds - startup), max(0, calls - startup_calls)
    per_step = {
        k: round(v / steps * 1e6, 1)
        for k, v in sorted(by_feature.items(), key=lambda kv: -kv[1])
        if steps and not k.endswith(STARTUP_SUFFIX)
    }
    return {
        "hook_calls": calls,
        "hook_us_per_call": round(serving / serving_calls * 1e6, 2) if serving_calls else None,
        "hook_steady_calls": serving_calls,
        "hook_startup_calls": startup_calls,
        "hook_startup_ms": round(startup * 1e3, 1) if startup_calls or startup else None,
        "hook_us_per_verify_step": round(serving / steps * 1e6, 1) if steps else None,
        "hook_us_per_verify_step_by_feature": per_step,
        "hook_us_per_verify_step_in_slow_calls": round(slow / steps * 1e6, 1) if steps else None,
    }


STARTUP_SUFFIX = "@startup"
GRAPH_TRACED = "\0traced:"  # marks the in-graph tracing line among _coverage's lines


def _iso(unix: float | None) -> str | None:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if time_ok(unix) else None


def last_record_unix(f: TraceFile) -> float | None:
    """The newest time stamp in a file: its last call, finding, capture, ... or its header."""
    stamps = [f.header.started_unix] if f.header else []
    for kind in (f.calls[-1:], f.findings, f.coverage, f.weights, f.captures):
        stamps += [r.t_unix for r in kind if getattr(r, "t_unix", None)]
    stamps = [t for t in stamps if time_ok(t)]
    return max(stamps) if stamps else None


def _alive_here(f: TraceFile) -> bool:
    if f.header is None or f.header.host != socket.gethostname():
        return False
    try:
        os.kill(f.header.pid, 0)
    except PermissionError:
        return True  # alive, another user's
    except (OSError, OverflowError):
        return False
    return True


def closure_state(f: TraceFile) -> str:
    """Whether a file got its closing record (written at exit, on SIGTERM and at the end of
    ``trace()``): a file without one was cut by a crash or a SIGKILL, or is still written."""
    if f.counters:
        return "closed"
    return "running" if _alive_here(f) else "not closed"


def not_closed_line(f: TraceFile) -> str:
    last = _iso(last_record_unix(f)) or "unknown"
    if closure_state(f) == "running":
        return f"{f.name}: open, its process is still running (last record {last})"
    return (
        f"{f.name}: not closed: the process crashed or was killed (no closing record; last record {last}); "
        "records after that and its drop counts are not in the file"
    )


def _coverage(files: list[TraceFile]) -> tuple[int, list[str]]:
    """Records dropped and one line per kind of blind spot.

    Counters are cumulative per flush, so per file the largest one counts; coverage records
    are events, so they add up. Per file the larger of the two wins to avoid double counting.
    """
    dropped = replay = 0
    other: dict[str, list[Any]] = defaultdict(lambda: [0, ""])
    for f in files:
        stats_dropped = max((s.records_dropped for s in f.counters), default=0)
        stats_replay = max((s.graph_replay_steps for s in f.counters), default=0)
        repeats = once_counts(f)

        def count(c: Any, repeats: dict[str, int] = repeats) -> int:
            return repeats.get(c.once_key, c.count) if c.once_key else c.count

        cov_dropped = sum(count(c) for c in f.coverage if c.kind == "dropped")
        cov_replay = sum(count(c) for c in f.coverage if c.kind == "graph_replay")
        dropped += max(stats_dropped, cov_dropped)
        replay += max(stats_replay, cov_replay)
        internal = max((s.internal_errors for s in f.counters), default=0)
        for c in f.coverage:
            if c.kind in ("dropped", "graph_replay"):
                continue
            entry = other[c.kind]
            entry[0] += count(c)
            entry[1] = entry[1] or c.detail
        if internal and "internal_error" not in other:
            other["internal_error"] = [internal, "see the process log"]
    gaps: list[str] = []
    if replay:
        gaps.append(f"{replay} steps ran under CUDA-graph replay and were not traced per module")
    traced = sum(max((s.graph_replays_traced for s in f.counters), default=0) for f in files)
    readbacks = sum(max((s.graph_readbacks for s in f.counters), default=0) for f in files)
    lost = sum(max((s.graph_readbacks_dropped for s in f.counters), default=0) for f in files)
    if traced:
        # Not a blind spot, but what the per-module figures of replayed steps rest on.
        gaps.append(
            GRAPH_TRACED
            + f"{traced} CUDA-graph replays carried statistics kernels; {readbacks} read back"
            + (f", {lost} read-backs lost (pinned ring full)" if lost else "")
        )
    words = {
        "not_covered": "not covered",
        "unhooked": "modules not hooked",
        "internal_error": "internal errors in spectrace",
        "sink_error": "sink errors (records not written)",
    }
    for kind in sorted(other):
        count, detail = other[kind]
        gaps.append(f"{count} {words.get(kind, kind)}: {detail}" if detail else f"{count} {words.get(kind, kind)}")
    return dropped, gaps


def _last_counters(f: TraceFile) -> Any:
    """The counters record that counts: they are cumulative, so the one with the most drops."""
    return max(f.counters, key=lambda s: s.records_dropped)


def once_counts(f: TraceFile) -> dict[str, int]:
    """How often each record said once really happened (the closing counters record says)."""
    return f.counters[-1].once_counts if f.counters else {}

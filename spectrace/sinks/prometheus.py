"""Prometheus metrics from the records: findings, acceptance, a few data-path gauges, health.

A *line* sink (``needs_objects = False``): the recorder hands it the JSON lines it writes
to the trace file, in batches on its flush thread. A serving engine's hot path is left as
it is (an object sink would make it build a :class:`~spectrace.records.Call` per call),
and the metrics are exactly what the trace says: no second detection path.

The metrics live in ``prometheus_client``'s default registry, created once per process:

- ``spectrace_findings_total{code,severity,rank}`` counts finding records;
  ``spectrace_root_cause{code,severity,rank}`` is 1 while that code is a root cause of this
  process's findings (:func:`~spectrace.checks.root_causes.root_causes`), 0 once another
  finding explains it;
- ``spectrace_accept_length`` (histogram, one observation per request and verify step),
  ``spectrace_verify_steps_total``, and by draft position
  ``spectrace_draft_position_accepted_total`` / ``spectrace_draft_position_proposed_total``;
  ``sampling`` is ``greedy`` or ``sampled`` per request where the acceptance record says
  (its ``greedy`` list), else ``unknown``;
- ``spectrace_stage_input_width{stage}`` and ``spectrace_stage_output_std{stage}`` for a few
  roles of the EAGLE-3 data path, ``spectrace_fused_chunk_std{chunk}`` from fingerprints;
- spectrace's own health: ``spectrace_records_dropped_total``, ``spectrace_internal_errors_total``,
  ``spectrace_sink_errors_total``, ``spectrace_hook_seconds_total``, ``spectrace_steps_total``;
  ``spectrace_info{version,rank}`` is 1 in every traced process (``spectrace fleet`` tells a
  traced instance from one that is not by it).

Where they are served: with ``PROMETHEUS_MULTIPROC_DIR`` set (SGLang with
``--enable-metrics`` and vLLM with several API servers set it for their children) the values
go to that folder and the engine's own ``/metrics`` collects them; ``SPECTRACE_METRICS_PORT``
also serves them from this process (:func:`serve`), with a fixed pool of threads and socket
timeouts (:mod:`.metrics_server`): idle or slow clients cannot add threads to the server.

A benchmark's switch: while the ``SPECTRACE_CONTROL`` file holds the word ``metrics-off``
the sink leaves the batches it is handed uncounted (the trace file still has every record),
but for the findings, which it holds and counts once the word is gone; so the metrics' cost is measured on and off inside one server (scripts/live, mode
``metrics``). The file is looked at no more than every quarter second, on the flush thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..safe_files import read_regular
from ..settings import Settings, warn
from ..version import __version__

# Roles whose calls give a data-path gauge: where a wiring bug changes a width or a scale.
STAGES = ("target.aux_concat", "draft.fc", "draft.hidden_norm", "draft.layer", "draft.lm_head", "target.lm_head")
# Accept length counts the bonus token: 1 (nothing accepted) to k + 1.
ACCEPT_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
HEALTH = {
    "records_dropped": "spectrace_records_dropped",
    "internal_errors": "spectrace_internal_errors",
    "sink_errors": "spectrace_sink_errors",
    "hook_seconds": "spectrace_hook_seconds",
    "steps": "spectrace_steps",
}

# The control file's word that pauses the sink (the first word, "off"/"on", is control.py's).
PAUSE_WORD = "metrics-off"
CONTROL_EVERY_S = 0.25
CONTROL_MAX_BYTES = 4096
MAX_HELD = 10_000  # finding lines kept while paused, counted once the sink is on again

_lock = threading.Lock()
_metrics: dict[str, Any] = {}
_served: dict[str, Any] = {}


def available() -> bool:
    """Whether ``prometheus_client`` can be imported (the sink needs it; nothing else does)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def wanted(settings: Settings) -> bool:
    """Metrics are made when a port is asked for, or when an engine collects them across
    its processes (``PROMETHEUS_MULTIPROC_DIR`` in a traced process)."""
    return bool(settings.metrics_port) or (settings.enabled and bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")))


def metrics() -> dict[str, Any]:
    """The process's metric objects, created on first use (the registry refuses a name twice)."""
    with _lock:
        if _metrics:
            return _metrics
        from prometheus_client import Counter, Gauge, Histogram

        rank = ["rank"]
        m = _metrics
        m["info"] = Gauge("spectrace_info", "1 in every process spectrace traces", ["version", *rank], multiprocess_mode="max")
        m["findings"] = Counter("spectrace_findings", "Finding records, by code and severity", ["code", "severity", *rank])
        m["root"] = Gauge(
            "spectrace_root_cause",
            "1 while the code is a root cause of this process's findings (0: explained by another)",
            ["code", "severity", *rank],
            multiprocess_mode="max",
        )
        m["accept"] = Histogram(
            "spectrace_accept_length",
            "Accepted tokens per request and verify step, the bonus token included",
            ["sampling", *rank],
            buckets=ACCEPT_BUCKETS,
        )
        m["verify"] = Counter("spectrace_verify_steps", "Verify steps with an acceptance record", rank)
        m["accepted"] = Counter(
            "spectrace_draft_position_accepted", "Requests that accepted the draft token at a position", ["position", "sampling", *rank]
        )
        m["proposed"] = Counter(
            "spectrace_draft_position_proposed", "Requests offered a draft token at a position", ["position", "sampling", *rank]
        )
        m["width"] = Gauge(
            "spectrace_stage_input_width",
            "Last dimension of a data-path stage's first input",
            ["stage", *rank],
            multiprocess_mode="mostrecent",
        )
        m["std"] = Gauge(
            "spectrace_stage_output_std",
            "Standard deviation of a data-path stage's output",
            ["stage", *rank],
            multiprocess_mode="mostrecent",
        )
        m["chunk"] = Gauge(
            "spectrace_fused_chunk_std",
            "Standard deviation of each chunk of the fused draft input",
            ["chunk", *rank],
            multiprocess_mode="mostrecent",
        )
        for field, name in HEALTH.items():
            what = "Host seconds inside spectrace's engine hooks" if field == "hook_seconds" else f"spectrace's {field.replace('_', ' ')}"
            m[field] = Counter(name, what, rank)
        return m


def serve(port: int, address: str = "127.0.0.1") -> bool:
    """Serve ``/metrics`` on ``address:port`` from this process, once; False (one warning) when
    the port is taken, e.g. by another rank of the same server: its values still reach the
    engine's endpoint where one collects them."""
    with _lock:
        key = f"{address}:{port}"
        if key in _served:
            return _served[key] is not None
        try:
            from prometheus_client import REGISTRY, CollectorRegistry

            from .metrics_server import MetricsServer

            registry = REGISTRY
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                from prometheus_client import multiprocess

                # Every process's values, as the engine's endpoint would show them.
                registry = CollectorRegistry()
                multiprocess.MultiProcessCollector(registry)
            _served[key] = MetricsServer(port, address, registry)
        except Exception as exc:
            _served[key] = None
            warn(f"SPECTRACE_METRICS_PORT: cannot serve metrics on {key} ({type(exc).__name__}: {exc}); they stay in the process")
            return False
        return True


class MetricsSink:
    """Turns the records a recorder writes into Prometheus metrics (see the module)."""

    needs_objects = False
    name = "prometheus"

    def __init__(self, counters: Callable[[], Any] | None = None, control: str = "") -> None:
        # ``counters``: the recorder's live counters (health is read from them at each batch).
        # ``control``: the SPECTRACE_CONTROL file, whose word ``metrics-off`` pauses the sink.
        self._counters = counters
        self._control = control
        self._control_next = 0.0
        self._paused = False
        self._m = metrics()
        self._rank = ""
        self._info_set = False  # spectrace_info was set under self._rank
        self._synced: dict[str, float] = {}
        self._findings: list[Any] = []
        self._roots: set[tuple[str, str]] = set()
        self._held: list[str] = []  # finding lines written while paused
        self._held_said = False

    def paused(self) -> bool:
        """Whether the control file holds :data:`PAUSE_WORD` (read at most every quarter second;
        a file that cannot be read is "not paused", never an error)."""
        if not self._control:
            return False
        now = time.monotonic()
        if now >= self._control_next:
            self._control_next = now + CONTROL_EVERY_S
            try:
                words = read_regular(self._control, CONTROL_MAX_BYTES).decode("utf-8", errors="replace").lower().split()
            except Exception:  # missing, a link, a FIFO, too large: control.py says why, once
                words = []
            self._paused = PAUSE_WORD in words
        return self._paused

    def write(self, records: Sequence[Any]) -> None:
        if self.paused():  # the header still sets the rank and spectrace_info: a fleet sees the process
            self._hold([r for r in records if isinstance(r, str) and r.startswith('{"type":"finding"')])
            records = [r for r in records if isinstance(r, str) and r.startswith('{"type":"header"')]
            if not records:
                return
        elif self._held:  # the findings made while paused count once the sink is on again
            records, self._held = [*self._held, *records], []
        last_call: dict[str, str] = {}
        tally = _Tally()
        for line in records:
            text = line if isinstance(line, str) else line.model_dump_json()
            if text.startswith('{"type":"'):
                kind = text[9:24]  # the recorder's compact lines: every record's first field is its type
            else:  # a line written otherwise: its type read the slow way (never a call on the hot path)
                text = json.dumps(json.loads(text), separators=(",", ":"))
                kind = text[9:24] if text.startswith('{"type":"') else ""
            if kind.startswith('call"'):
                at = text.find('"role":"')
                if at >= 0:
                    role = text[at + 8 : text.find('"', at + 8)]
                    if role in STAGES:
                        last_call[role] = text  # a gauge wants the latest value only
            elif kind.startswith('acceptance"'):
                self._acceptance(json.loads(text), tally)
            elif kind.startswith('finding"'):
                self._finding(json.loads(text))
            elif kind.startswith('fingerprint"'):
                self._fingerprint(json.loads(text))
            elif kind.startswith('header"'):
                self._count(tally)  # what came before the header keeps the rank it was counted under
                tally = _Tally()
                rank = json.loads(text).get("rank")
                rank = "" if rank is None else str(rank)
                if rank != self._rank and self._info_set:
                    # The process learned its rank after a first header: it is still one
                    # process (a removed series would stay in a multiprocess folder, so 0).
                    self._m["info"].labels(__version__, self._rank).set(0)
                self._rank = rank
                self._m["info"].labels(__version__, self._rank).set(1)
                self._info_set = True
        self._count(tally)
        for role, text in last_call.items():
            self._stage(role, json.loads(text))
        self._health()

    def _hold(self, findings: list[str]) -> None:
        """Findings made while paused, kept for when the sink is on again (a pause measures
        the metrics' cost; a root cause must still reach the fleet). At most :data:`MAX_HELD`;
        past it the loss is said once."""
        room = MAX_HELD - len(self._held)
        self._held += findings[: max(0, room)]
        if len(findings) > room and not self._held_said:
            self._held_said = True
            warn(f"{PAUSE_WORD}: more than {MAX_HELD} findings while the metrics are paused; later ones reach the trace only")

    def _acceptance(self, record: dict[str, Any], tally: _Tally) -> None:
        lengths = record.get("accept_lengths") or []
        kinds = _sampling(record, len(lengths))
        tally.lengths.update(zip(kinds, lengths))
        k = int(record.get("draft_tokens") or 0)
        tally.verify += 1
        distinct = set(kinds)
        for kind in sorted(distinct):
            if len(distinct) == 1:  # one kind in the step: the engine's own per-position counts
                per_position = list(record.get("accepted_per_position") or [])
                offered = len(lengths)
            else:  # a chain's accept length n accepted positions 0 .. n - 2 (the bonus token is not drafted)
                mine = [n for n, other in zip(lengths, kinds) if other == kind]
                per_position = [sum(1 for n in mine if n - 1 > pos) for pos in range(k)]
                offered = len(mine)
            for pos, accepted in enumerate(per_position):
                tally.accepted[(pos, kind)] += accepted
            for pos in range(k):
                tally.proposed[(pos, kind)] += offered

    def _count(self, tally: _Tally) -> None:
        """A batch's acceptance into the metrics, one update per label set and value."""
        if not tally.verify:
            return
        for (kind, n), count in tally.lengths.items():
            _observe_many(self._m["accept"].labels(kind, self._rank), n, count)
        self._m["verify"].labels(self._rank).inc(tally.verify)
        for (pos, kind), accepted in tally.accepted.items():
            self._m["accepted"].labels(str(pos), kind, self._rank).inc(accepted)
        for (pos, kind), proposed in tally.proposed.items():
            self._m["proposed"].labels(str(pos), kind, self._rank).inc(proposed)

    def _finding(self, record: dict[str, Any]) -> None:
        from ..checks.root_causes import root_causes
        from ..records import Finding

        found = Finding.model_validate(record)
        self._m["findings"].labels(found.code, found.severity, self._rank).inc()
        self._findings.append(found)
        # A later finding may explain an earlier root (the capture behind a bypassed fc).
        roots = {
            (f.code, f.severity) for f, j in zip(self._findings, root_causes(self._findings)) if f.severity == "error" and j.root is None
        }
        for code, severity in self._roots | roots:
            self._m["root"].labels(code, severity, self._rank).set(1 if (code, severity) in roots else 0)
        self._roots = roots

    def _stage(self, role: str, call: dict[str, Any]) -> None:
        inputs, outputs = call.get("inputs") or [], call.get("outputs") or []
        if inputs and inputs[0].get("shape"):
            self._m["width"].labels(role, self._rank).set(inputs[0]["shape"][-1])
        std = ((outputs[0].get("stats") or {}).get("std")) if outputs else None
        if isinstance(std, (int, float)):
            self._m["std"].labels(role, self._rank).set(std)

    def _fingerprint(self, record: dict[str, Any]) -> None:
        for i, chunk in enumerate(record.get("chunks") or []):
            std = (chunk or {}).get("std")
            if isinstance(std, (int, float)):
                self._m["chunk"].labels(str(i), self._rank).set(std)

    def _health(self) -> None:
        counters = self._counters() if self._counters is not None else None
        if counters is None:
            return
        for field in HEALTH:
            value = float(getattr(counters, field, 0) or 0)
            delta = value - self._synced.get(field, 0.0)
            if delta > 0:  # counters only grow; a fork's fresh counters start again from 0
                self._m[field].labels(self._rank).inc(delta)
            self._synced[field] = value

    def after_fork(self) -> None:
        self._synced = {}
        self._findings = []
        self._roots = set()
        self._held = []

    def flush(self, timeout_s: float = 1.0) -> bool:
        self._health()
        return True

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        self._health()
        return True


def make_metrics_sink(settings: Settings, counters: Callable[[], Any]) -> MetricsSink | None:
    """The metrics sink when metrics are wanted (:func:`wanted`) and ``prometheus_client`` is
    installed (one warning when it is not); serves ``SPECTRACE_METRICS_PORT`` once per process."""
    if not wanted(settings):
        return None
    if not available():
        warn("metrics asked for, but prometheus_client is not installed: pip install 'spectrace[metrics]'")
        return None
    sink = MetricsSink(counters, control=settings.control)
    if settings.metrics_port:
        serve(settings.metrics_port, settings.metrics_address)
    return sink


class _Tally:
    """One batch's acceptance, summed before it reaches the metrics. Each update of a
    multiprocess metric (an engine's ``PROMETHEUS_MULTIPROC_DIR``) is a locked write to a
    memory-mapped file, and the flush thread that makes it holds the GIL the engine's
    scheduler needs: one update per request and step cost a host-bound server about 9 %
    on the H200 (bench/results/live-metrics-2026-12-04.json); per batch it is a few."""

    __slots__ = ("lengths", "verify", "accepted", "proposed")

    def __init__(self) -> None:
        self.lengths: Counter[tuple[str, int]] = Counter()  # (sampling, accept length) -> requests
        self.verify = 0
        self.accepted: Counter[tuple[int, str]] = Counter()  # (position, sampling) -> requests
        self.proposed: Counter[tuple[int, str]] = Counter()


def _observe_many(child: Any, value: float, count: int) -> None:
    """``count`` observations of ``value``: one update of the histogram's sum and one of its
    bucket, as ``Histogram.observe`` makes them (its ``_sum``, ``_upper_bounds`` and
    ``_buckets``); ``observe`` ``count`` times where a release keeps them otherwise."""
    total, bounds, buckets = (getattr(child, name, None) for name in ("_sum", "_upper_bounds", "_buckets"))
    if total is None or bounds is None or buckets is None or len(bounds) != len(buckets):
        for _ in range(count):
            child.observe(value)
        return
    total.inc(value * count)
    for bound, bucket in zip(bounds, buckets):
        if value <= bound:
            bucket.inc(count)
            break


def _sampling(record: dict[str, Any], n: int) -> list[str]:
    """Each request's sampling as the engine said it (``greedy``: one bool per request):
    ``greedy`` or ``sampled``, else ``unknown``."""
    greedy = record.get("greedy")
    if isinstance(greedy, list) and len(greedy) == n:
        if False not in greedy:  # the common case (every request greedy), without a word per request
            return ["greedy"] * n
        return ["greedy" if g else "sampled" for g in greedy]
    return [str(record.get("sampling") or "unknown")] * n

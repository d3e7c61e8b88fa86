"""The public entry point: ``spectrace.trace(model)``.

    >>> with spectrace.trace(model, modules=["model.layers.*", "lm_head"]) as t:
    ...     model(ids)
    >>> t.calls("lm_head")[0].outputs[0].shape
    [1, 8, 128]

Records are always kept in memory for the returned :class:`Trace`; they are also
written to ``SPECTRACE_DIR`` when it is set (or ``directory=`` is given), and sent to
an OTLP collector when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import torch.nn as nn

from .checks.from_records import FC_NOT_TRACED, findings_from_model_facts, findings_from_records
from .hooks import model_facts
from .hooks.engine import Tracer
from .hooks.selection import ModuleFilter, glob_match
from .recorder import Recorder
from .records import Call, Capture, Coverage, Finding, Weights
from .settings import Settings

# Said once when a traced draft's weights were never loaded while tracing: the checks of a
# load (dropped, missing, uninitialised tensors) need to see it.
LOAD_NOT_SEEN = (
    "no weight load of the draft was seen while tracing (loaded before the trace began?): load checks "
    "not run; `spectrace audit DRAFT_DIR` checks the checkpoint, or load it inside the trace"
)

Models = Union[nn.Module, Sequence[nn.Module], Mapping[str, nn.Module]]


def make_otel_sink(settings: Settings, recorder_error: Any, rank: int | None = None) -> Any | None:
    """An OpenTelemetry sink when an OTLP endpoint is configured, else None."""
    if not settings.otlp_endpoint:
        return None  # the OpenTelemetry SDK is not even imported
    try:
        from .sinks.otel import sink_from_env  # the exporter reads the OTEL_* environment itself

        return sink_from_env(settings, recorder_error, rank)
    except Exception as exc:
        recorder_error(f"cannot start the OTLP exporter: {type(exc).__name__}: {exc}")
    return None


def build_recorder(settings: Settings, directory: str | None, rank: int | None = None) -> Recorder:
    """The recorder of a trace or a process: the trace file under ``directory`` (if any),
    plus the OpenTelemetry sink when an OTLP endpoint is configured and the Prometheus
    metrics sink when metrics are asked for (``SPECTRACE_METRICS_PORT``, or an engine's
    ``PROMETHEUS_MULTIPROC_DIR`` under ``SPECTRACE=1``)."""
    recorder = Recorder(settings, directory=directory, rank=rank)
    # Built after the recorder: the sink reports its failures as the recorder's sink errors.
    otel = make_otel_sink(settings, recorder.sink_error, rank)
    if otel is not None:
        recorder.add_sink(otel)
    from .sinks.prometheus import make_metrics_sink  # prometheus_client loads only when metrics are asked for

    metrics = make_metrics_sink(settings, lambda: recorder.counters)
    if metrics is not None:
        recorder.add_sink(metrics)
    return recorder


class Trace:
    """What one ``trace()`` context saw: calls, findings and every other record."""

    def __init__(self, recorder: Recorder, tracer: Tracer) -> None:
        self.recorder = recorder
        self.tracer = tracer
        self.hooked: list[str] = []
        # The models handed to trace(), held weakly (a trace never keeps a model alive):
        # what they hold (a capture list, a draft config) is checked once, at the first check.
        self._roots: list[tuple[str, weakref.ref[nn.Module]]] = []
        self._facts_checked = False

    # Context protocol -------------------------------------------------------
    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Run the checks (:meth:`check`), remove the hooks and flush the sinks; safe to call twice.

        Never raises on spectrace's own failures (a trace file that cannot be written, a
        name that is not UTF-8): they are counted and said once, and the ``with`` block's
        own exception, if any, is the one that propagates."""
        _open.discard(self)
        try:
            try:
                if not self.recorder._closed:
                    self.check()
                self.tracer.detach()
            finally:
                self.recorder.close()
        except Exception as exc:
            try:
                self.recorder.internal_error(f"closing the trace: {type(exc).__name__}: {exc}")
            except Exception:
                pass

    # Writing -----------------------------------------------------------------
    def emit(self, record: Any) -> None:
        """Add a record of any type (finding, acceptance, capture, ...) to this trace."""
        self.tracer.finish_step()
        self.recorder.emit(record)

    def set_step(self, step: int) -> None:
        """Number steps yourself (e.g. one speculative step = draft + verify)."""
        self.tracer.set_step(step)

    # Reading -----------------------------------------------------------------
    @property
    def records(self) -> list[Any]:
        self.tracer.finish_step()
        return self.recorder.records()

    @property
    def path(self) -> str | None:
        """The JSONL file, once anything was written."""
        return self.recorder.path

    @property
    def findings(self) -> list[Finding]:
        """Every finding of this trace: those recorded while tracing and those its records
        imply (:meth:`check` runs first), as ``spectrace view`` shows them for its file."""
        self.check()
        return self.recorder.findings()

    def check(self) -> list[Finding]:
        """Run spectrace's checks over what this trace holds; record and return the new findings.

        The same checks as ``spectrace view`` runs on a trace file
        (:func:`spectrace.checks.from_records.findings_from_records`: NaN/Inf in a traced
        tensor, a bypassed fc), plus, once, what the traced models themselves say (the
        target's capture list against the draft's config, as a server's start-up is
        checked). Runs by itself when :attr:`findings` is read and when the trace closes.
        Never raises: a failure is counted as an internal error.
        """
        if self.recorder._closed:
            return []
        new: list[Finding] = []
        try:
            self.tracer.finish_step()
            records = self.recorder.records()
            if not self._facts_checked:
                self._facts_checked = True
                new += self._check_models(records)
                if new:
                    records = self.recorder.records()
            findings = [r for r in records if isinstance(r, Finding)]
            calls = [r for r in records if isinstance(r, Call)]
            coverage = [r for r in records if isinstance(r, Coverage)]
            derived = findings_from_records(calls, findings, coverage)
            for found in derived:
                self.recorder.emit(found)
            new += derived
        except Exception as exc:  # a check never breaks the caller's code
            self.recorder.internal_error(f"checks failed: {type(exc).__name__}: {exc}")
        return new

    def _check_models(self, records: list[Any]) -> list[Finding]:
        """What the traced models hold, checked once; records already there are not repeated."""
        roots = [(name, model) for name, ref in self._roots if (model := ref()) is not None]
        return check_models(self.recorder, roots, records, self.tracer.roles.values())

    def calls(self, module: str | None = None) -> list[Call]:
        """Calls in order; ``module`` is an exact name or a glob (``**.fc``)."""
        self.tracer.finish_step()
        found = self.recorder.call_records()
        if module is None:
            return sorted(found, key=lambda c: c.seq)
        return sorted((c for c in found if c.module == module or glob_match(c.module, module)), key=lambda c: c.seq)

    def modules(self) -> list[str]:
        """Names of the modules that were called, in first-call order."""
        seen: dict[str, None] = {}
        for call in self.calls():
            seen.setdefault(call.module, None)
        return list(seen)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.records)

    # Assertions (spectrace.assertions) ---------------------------------------
    # A failed one raises an AssertionError whose message lists what really ran.
    def assert_called(self, module: str, times: int | None = None) -> list[Call]:
        __tracebackhide__ = True
        return _assertions().assert_called(self, module, times)

    def assert_not_called(self, module: str) -> None:
        __tracebackhide__ = True
        _assertions().assert_not_called(self, module)

    def assert_shape(self, module: str, input: Any = None, output: Any = None, **kw: Any) -> list[Call]:
        """``input``/``output``: ints, ``None`` (one dim, any size) and one ``...`` (any dims)."""
        __tracebackhide__ = True
        return _assertions().assert_shape(self, module, input, output, **kw)

    def assert_dtype(self, module: str, input: Any = None, output: Any = None, **kw: Any) -> list[Call]:
        __tracebackhide__ = True
        return _assertions().assert_dtype(self, module, input, output, **kw)

    def assert_stats(self, module: str, **kw: Any) -> list[Call]:
        __tracebackhide__ = True
        return _assertions().assert_stats(self, module, **kw)

    def assert_no_findings(self, severity: str = "error") -> None:
        __tracebackhide__ = True
        _assertions().assert_no_findings(self, severity)

    def assert_finding(self, code: str, *, module: str | None = None) -> Finding:
        __tracebackhide__ = True
        return _assertions().assert_finding(self, code, module=module)

    def detect(self, checks: Sequence[str] | None = None) -> list[Finding]:
        """The new findings of :meth:`check` (kept for older code: ``check`` runs by itself
        when :attr:`findings` is read); ``checks`` keeps those codes only."""
        new = self.check()
        return new if checks is None else [f for f in new if f.code in set(checks)]

    def data_path(self, focus: Sequence[str] = (), limit: int | None = None) -> str:
        helpers = _assertions()
        return helpers.data_path(self, focus, helpers.DEFAULT_PATH_LINES if limit is None else limit)


# Traces never closed by their code are closed at exit: otherwise their files would lack
# the closing record and read as cut by a crash. Held strongly: an unclosed trace's hooks
# still run into its recorder whether or not the caller kept the Trace.
_open: set[Trace] = set()


@atexit.register
def _close_open_traces() -> None:
    for open_trace in list(_open):
        try:
            open_trace.close()
        except Exception:
            pass


def _assertions() -> Any:
    from . import assertions  # it imports this module: bound on first use

    return assertions


def _named_roots(models: Models) -> list[tuple[str, nn.Module]]:
    if isinstance(models, nn.Module):
        return [("", models)]
    if isinstance(models, Mapping):
        return [(str(k), m) for k, m in models.items()]
    return [(f"model{i}" if len(models) > 1 else "", m) for i, m in enumerate(models)]


def check_models(recorder: Recorder, roots: Sequence[tuple[str, Any]], records: list[Any], roles: Iterator[str] | Any) -> list[Finding]:
    """What the models ``roots`` hold (``(name, model)``), checked as a server's start-up is:
    each target's capture against the draft's config, the flags the engine ignores, a
    reduced vocabulary without its map. Records already in ``records`` are not repeated.
    ``trace()`` runs it at its first check, ``SPECTRACE=1`` when a pair first speculates."""
    captured = {r.module for r in records if isinstance(r, Capture)}
    captures: list[Capture] = []
    for name, model in roots:
        capture = model_facts.capture_of(model, name or "model")
        if capture is not None and capture.module not in captured:
            captures.append(capture)
            recorder.emit(capture)
    drafts = [(name, model, cfg) for name, model in roots if (cfg := model_facts.draft_config(model)) is not None]
    name, draft, config = drafts[0] if drafts else ("draft", None, None)
    made = findings_from_model_facts(
        captures,
        config,
        engine=model_facts.engine_of(draft) if draft is not None else "sglang",
        hot_map_loaded=model_facts.hot_map_loaded(draft) if draft is not None else None,
        draft_name=name or "draft",
    )
    have = {(r.code, r.module) for r in records if isinstance(r, Finding)}
    new = [f for f in made if (f.code, f.module) not in have]
    for found in new:
        recorder.emit(found)
    traced_draft = draft is not None or any(role.startswith("draft.") for role in roles)
    if traced_draft and not any(isinstance(r, Weights) for r in records):
        recorder.coverage("not_covered", LOAD_NOT_SEEN)
    return new


def trace(
    models: Models,
    modules: ModuleFilter = None,
    *,
    types: Sequence[Any] = (),
    profile: str | None = None,
    stats: str | None = None,
    directory: str | None = None,
    settings: Settings | None = None,
) -> Trace:
    """Trace ``models`` until the returned context exits.

    ``models`` is a module, a list, or a ``{"target": ..., "draft": ...}`` mapping whose
    keys prefix the module names. ``modules`` is a glob, a list of globs or a callable
    ``(name, module) -> bool``; by default embeddings, decoder layers, the final norm
    and ``lm_head`` are traced, and a draft's ``fc`` and ``midlayer`` (the ``eagle3``
    profile, as under ``SPECTRACE=1`` and in the pytest fixture).
    """
    settings = settings or Settings.from_env()
    directory = directory or settings.dir_from_env()
    # The rank the environment names (SPECTRACE_RANK, else RANK), as the process recorder takes it:
    # two traces of one process never disagree on it.
    recorder = build_recorder(settings, directory, rank=settings.rank)
    tracer = Tracer(recorder, stats=stats or settings.stats, sample=settings.sample, budget=settings.budget)
    result = Trace(recorder, tracer)
    _open.add(result)
    modules = modules if modules is not None else (list(settings.modules) or None)
    # SPECTRACE=1's runtime, when the bootstrap loaded it (looked up, not imported: the core
    # never imports what wires the integrations in).
    runtime = sys.modules.get("spectrace.runtime")
    try:
        for prefix, root in _named_roots(models):
            if runtime is not None and runtime.is_active():
                runtime.release(root)  # SPECTRACE=1 adopted it too: this trace holds it now
            result._roots.append((prefix, weakref.ref(root)))
            result.hooked += tracer.attach(root, modules, types=tuple(types), profile=profile or settings.profile or None, prefix=prefix)
    except Exception:
        result.close()
        raise
    if not result.hooked:
        recorder.coverage("unhooked", f"no module matched {modules or profile or 'the default profile'}")
    roles = set(tracer.roles.values())
    if "draft.layer" in roles and "draft.fc" not in roles:
        # No fc calls would then read as a bypass: say why the fc check stays silent.
        recorder.coverage("unhooked", f"{FC_NOT_TRACED}: whether it was bypassed cannot be told (trace the draft's fc too)")
    return result

"""pytest plugin: assert shapes and data-path contracts of traced models in tests.

The ``spectrace`` fixture hands each test a session; ``spectrace.trace(models, **kw)``
is :func:`spectrace.trace` (the same default selection: the EAGLE-3 modules and the
layers), and the :class:`~spectrace.api.Trace` it returns has the ``assert_*`` methods. Every trace the session made is closed at
teardown, hooks removed, even when the test failed::

    def test_fc_gets_fused_states(spectrace, target, draft, ids):
        with spectrace.trace({"target": target, "draft": draft}) as t:
            draft(ids[1:], target(ids).hidden_states[:-1])
        t.assert_shape("draft.model.fc", input=(..., 3 * 64), output=(..., 64))

What ``--spectrace`` (or ``@pytest.mark.spectrace`` on one test) covers, exactly:

- every :class:`spectrace.api.Trace` created while the test runs (through the fixture,
  ``spectrace.trace(...)``, or library code such as ``spectrace.eagle3`` that builds one)
  is adopted by the test's session: closed at teardown, and its *error* findings fail the
  test at the end of its call phase, with the observed data path in the message;
  findings claimed with ``assert_finding(code)`` do not count;
- the findings are those of ``Trace.findings``: what was recorded while tracing plus what
  the trace's records imply, made by the same checks ``spectrace view`` runs on a trace
  file (:mod:`spectrace.checks.from_records`: NaN or Inf in a traced tensor, a bypassed
  fc) and, once, what the traced models hold (the target's capture list against the
  draft's config). So a test fails exactly when ``spectrace view`` of its trace shows an
  error; the message names each root cause, its module and its fix, in a few lines. A
  test that expects a finding claims it (``t.assert_finding("nonfinite")``);
- it does **not** hook models the test never traces: nothing patches
  ``torch.nn.Module.__call__``. A test that runs a model without any trace is invisible.

``@pytest.mark.no_spectrace`` turns that off for one test (the fixture still works).
``--spectrace-dir DIR`` writes every trace of a test to
``DIR/<sanitized node id>/trace-<xdist worker or "main">-<n>.jsonl``; a re-run replaces
this worker's files for that test. With ``--spectrace``, traces made without
``directory=`` are written there too. A trace that should have been written and was not,
or lost records on the way (a folder that cannot be written, a disk full, a file deleted
while the test ran), is listed in the terminal summary, passing tests included (under
xdist too: the note travels with the test's report).

Importing this module imports pytest only: torch and spectrace.api load when a test
first uses the fixture or opts in.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # heavy: imported lazily at first use
    from .api import Trace

SESSION_KEY = pytest.StashKey["SpectraceSession"]()
DIR_KEY = pytest.StashKey["str | None"]()
WORKER_KEY = pytest.StashKey[str]()
MAX_DIR_NAME = 120
LOST_KEY = "spectrace_trace_lost"  # a user property of the test's teardown report: one lost trace
ENTRY_POINT_NAME = "spectrace"  # the pytest11 entry point: ``-p no:spectrace`` disables the plugin


# ----------------------------------------------------------------------------- configuration


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    _block_other_name(pluginmanager)
    group = parser.getgroup("spectrace", "spectrace data-path tracing")
    group.addoption(
        "--spectrace",
        action="store_true",
        default=False,
        help="fail a test when a spectrace trace made during it holds an error finding or a NaN/Inf; close every such trace at teardown",
    )
    group.addoption(
        "--spectrace-dir",
        default=None,
        metavar="DIR",
        help="write each test's spectrace traces as JSONL under DIR/<test node id>/",
    )


def _block_other_name(pluginmanager: pytest.PytestPluginManager) -> None:
    """Loaded under one name, make pytest skip the other: pluggy raises on a second registration.

    ``-p spectrace.pytest_plugin`` is processed before the ``spectrace`` entry point is
    loaded, and a ``pytest_plugins = ["spectrace.pytest_plugin"]`` after it; both would
    register this same module again.
    """
    name = pluginmanager.get_name(sys.modules[__name__])
    for other in (ENTRY_POINT_NAME, __name__):
        if other != name and pluginmanager.get_plugin(other) is None and not pluginmanager.is_blocked(other):
            pluginmanager.set_blocked(other)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spectrace: trace this test as if --spectrace were given")
    config.addinivalue_line("markers", "no_spectrace: exclude this test from --spectrace (the fixture still works)")
    directory = config.getoption("spectrace_dir", None)
    if directory:
        # Relative to where pytest was started, also in xdist workers.
        directory = os.path.join(str(config.invocation_params.dir), directory)
    config.stash[DIR_KEY] = directory
    # xdist's documented worker handle (not the env var, which nested in-process runs inherit).
    workerinput = getattr(config, "workerinput", None)
    config.stash[WORKER_KEY] = str(workerinput["workerid"]) if workerinput else "main"


def opted_in(item: pytest.Item) -> bool:
    """Whether ``--spectrace`` semantics apply to this test."""
    if item.get_closest_marker("no_spectrace") is not None:
        return False
    return bool(item.config.getoption("spectrace", False)) or item.get_closest_marker("spectrace") is not None


def node_dirname(nodeid: str) -> str:
    """A file-system-safe folder name for a test id; lossy names get a short hash.

    >>> node_dirname("tests/test_a.py::test_b")
    'tests_test_a.py__test_b'
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", nodeid.replace("::", "__").replace("/", "_")).strip("._") or "test"
    lossy = re.search(r"[^A-Za-z0-9._/:-]", nodeid) is not None
    if lossy or len(name) > MAX_DIR_NAME:
        # Parameter ids and long names can collide once sanitized: keep them apart.
        name = name[:MAX_DIR_NAME].rstrip("._") + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return name


# ----------------------------------------------------------------------------- session


class SpectraceSession:
    """One test's traces: made through :meth:`trace` or adopted while the test opted in."""

    def __init__(self, nodeid: str, directory: str | None = None, implicit: bool = False, worker: str = "main") -> None:
        self.nodeid = nodeid
        self.worker = worker
        self.directory = directory
        self.implicit = implicit
        self.traces: list[Trace] = []
        self._undo: list[Callable[[], None]] = []
        self._cleared = False

    def trace(self, models: Any, modules: Any = None, **kwargs: Any) -> Trace:
        """:func:`spectrace.trace`, kept by this session (closed at teardown).

        >>> with spectrace.trace(draft, modules=["model.fc", "model.layers.*"]) as t:
        ...     draft(ids, hidden)
        """
        from .api import trace

        if self.directory is not None and kwargs.get("directory") is None:
            kwargs["directory"] = self._test_dir()
        result = trace(models, modules, **kwargs)
        self.keep(result)
        return result

    def keep(self, trace: Trace) -> None:
        """Own ``trace``: close it at teardown, and check its findings if the test opted in."""
        if any(t is trace for t in self.traces):
            return
        self.traces.append(trace)
        recorder = trace.recorder
        if recorder.sink is not None:
            return  # already writing somewhere: leave it
        if self.directory is not None and recorder.directory is None and self.implicit:
            recorder.directory = self._test_dir()
        if self.directory is not None and recorder.directory == self._test_dir() and recorder.file_name is None:
            recorder.file_name = f"trace-{self.worker}-{len(self.traces)}.jsonl"

    def _test_dir(self) -> str:
        assert self.directory is not None
        path = os.path.join(self.directory, node_dirname(self.nodeid))
        if not self._cleared:
            # A re-run must not append to the last run's files; only this worker's are ours.
            self._cleared = True
            for old in glob.glob(os.path.join(glob.escape(path), f"trace-{self.worker}-*.jsonl")):
                try:
                    os.remove(old)
                except OSError:
                    pass
        return path

    @property
    def findings(self) -> list[Any]:
        return [f for t in self.traces for f in t.findings]

    def adopt_new_traces(self) -> None:
        """Adopt every Trace constructed from now on (until :meth:`close`)."""
        from .api import Trace

        original = Trace.__init__
        session = self

        def __init__(trace_self: Any, *args: Any, **kwargs: Any) -> None:
            original(trace_self, *args, **kwargs)
            try:
                session.keep(trace_self)
            except Exception:  # bookkeeping must never break the code under test
                pass

        Trace.__init__ = __init__  # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(Trace, "__init__", original))

    def check(self) -> None:
        """Raise if any kept trace holds an unclaimed error finding (the ``--spectrace`` rule)."""
        __tracebackhide__ = True
        from .assertions import FindingError, unexpected_findings
        from .present.findings import plural, root_cause_lines

        for index, trace in enumerate(self.traces):
            # Trace.findings runs the checks `spectrace view` runs on a trace file: the same verdict.
            found = unexpected_findings(trace, "error")
            if found:
                codes = ", ".join(sorted({f.code for f in found}))
                which = f"trace {index + 1} of {len(self.traces)}" if len(self.traces) > 1 else "the trace"
                head = f"spectrace: {which} made during this test holds {plural(len(found), 'error finding')} ({codes})"
                lines = [head, *root_cause_lines(found)]
                if trace.path:
                    lines.append(f"The trace: spectrace view {_shown(trace.path)}")
                lines.append("Claim expected ones with t.assert_finding(code), or mark the test @pytest.mark.no_spectrace.")
                raise FindingError("\n".join(lines))

    def close(self) -> None:
        """Close every kept trace (hooks removed) and undo the adoption patch; never raises."""
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:
                pass
        # Newest first, like nested ``with`` blocks: two traces of one model each wrapped
        # its forward, and only LIFO order restores the original.
        for trace in reversed(self.traces):
            try:
                trace.close()
            except Exception:
                pass


def _shown(path: str) -> str:
    """``path`` relative to the working folder when it lies below it (shorter to read)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def session_for(item: pytest.Item, create: bool = True) -> SpectraceSession | None:
    session = item.stash.get(SESSION_KEY, None)
    if session is None and create:
        config = item.config
        session = SpectraceSession(
            item.nodeid, config.stash.get(DIR_KEY, None), implicit=opted_in(item), worker=config.stash.get(WORKER_KEY, "main")
        )
        item.stash[SESSION_KEY] = session
        if session.implicit:
            session.adopt_new_traces()
    return session


# ----------------------------------------------------------------------------- hooks and fixture


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Opted-in tests adopt traces from the very start, fixtures included.
    if opted_in(item):
        session_for(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    __tracebackhide__ = True  # the message is the report; plugin frames add nothing
    result = yield  # a failing test body propagates from here unchanged
    session = session_for(item, create=False)
    if session is not None and session.implicit:
        session.check()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        return (yield)  # fixtures first: theirs may still use a trace
    finally:
        session = session_for(item, create=False)
        if session is not None:
            del item.stash[SESSION_KEY]
            session.close()
            try:
                # On the report (not in this process's memory): xdist hands it to the controller.
                item.user_properties.extend((LOST_KEY, text) for text in lost_traces(session))
            except Exception:  # bookkeeping must never break the run
                pass


# ----------------------------------------------------------------------------- lost traces


def lost_traces(session: SpectraceSession) -> list[str]:
    """One line per trace of ``session`` meant for a file that the file does not fully hold."""
    from .sinks.base import safe_text

    out: list[str] = []
    for trace in session.traces:
        recorder = trace.recorder
        if recorder.directory is None:
            continue  # kept in memory only, as asked
        counters = recorder.counters
        where = _shown(recorder.sink.path if recorder.sink is not None else recorder.directory)
        reason = f" ({recorder.last_sink_error})" if recorder.last_sink_error else ""
        if recorder.sink is None or not recorder.sink.created:
            out.append(f"no trace file written: {where}{reason}")
            continue
        if not os.path.exists(recorder.sink.path):
            out.append(f"{where} was written and no longer exists")
            continue
        lost = {why: n for why, n in counters.dropped_by_reason.items() if why in ("sink error", "file deleted")}
        if lost:
            split = ", ".join(f"{n} {why}" for why, n in sorted(lost.items()))
            out.append(f"{where} misses {sum(lost.values())} records ({split}){reason}")
        elif counters.sink_errors:
            out.append(f"{where}: {counters.sink_errors} sink errors{reason}")
    return [safe_text(text) for text in out]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """List every lost or unwritable trace, even when every test passed."""
    seen: list[str] = []
    for reports in list(terminalreporter.stats.values()):
        for report in reports:
            if getattr(report, "when", None) != "teardown":
                continue
            for key, text in getattr(report, "user_properties", ()):
                if key == LOST_KEY:
                    seen.append(f"{report.nodeid}: {text}")
    if not seen:
        return
    terminalreporter.section("spectrace: traces lost or not written", sep="=", yellow=True, bold=True)
    for line in seen:
        terminalreporter.line(line)


@pytest.fixture
def spectrace(request: pytest.FixtureRequest) -> SpectraceSession:
    """This test's :class:`SpectraceSession`; ``spectrace.trace(models, **kw)`` traces with assertions."""
    session = session_for(request.node)
    assert session is not None
    return session

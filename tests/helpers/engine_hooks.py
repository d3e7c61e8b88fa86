"""An engine integration's hooks, installed on the real classes for a test module.

The set-up every engine test file shares, written once: the harnesses wrap it with their
engine's ``install`` and ``reset`` (``vllm_harness.installed``, ``sglang_harness.installed``),
and each engine folder's ``conftest.py`` gives a test a fresh recorder (``rec``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator

from spectrace.recorder import Recorder
from spectrace.settings import Settings


def quiet_recorder() -> Recorder:
    """An in-memory recorder that prints nothing."""
    return Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None)


def installed(install: Callable[[Recorder], object], reset: Callable[[Recorder], object], modules: Iterable[str]) -> Iterator[None]:
    """A module fixture's body: import ``modules``, install, and at the end reset."""
    # Import the real modules first so install() patches them now (not only on import).
    for name in modules:
        importlib.import_module(name)
    install(quiet_recorder())
    yield
    # The patches stay on the real classes for the rest of the session: keep their
    # records in a quiet in-memory recorder, away from the process recorder.
    reset(quiet_recorder())


def fresh(reset: Callable[[Recorder], object]) -> Iterator[Recorder]:
    """A test fixture's body: a recorder of its own for one test, a quiet one after it."""
    recorder = quiet_recorder()
    reset(recorder)
    yield recorder
    reset(quiet_recorder())

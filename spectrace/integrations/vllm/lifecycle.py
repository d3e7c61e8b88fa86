"""BEFORE ``EngineCore.shutdown`` and ``WorkerProc.shutdown``: write what is held, and close
the trace of a process that vLLM is about to end.

vLLM's EngineCore and worker processes handle SIGTERM themselves and may be ended before
interpreter exit, so spectrace's own exit flush does not always run there: the last verify
step's acceptance record (held until the next step), the recorder's buffer and the file's
closing record would be lost, and the trace would read as a crash. Before, not after: the
shutdown itself tears down workers and may be cut short (seen on a CPU server). A process of its own
(``EngineCoreProc``, ``WorkerProc``) ends right after its shutdown: its process trace is
closed. An in-process EngineCore (vLLM's ``LLM`` without multiprocessing) only flushes, as
the user's program goes on.
"""

from __future__ import annotations

from typing import Any

from . import acceptance, state


def _finish(close: bool) -> None:
    acceptance.drain()
    if close and state.STATE.recorder is None:  # the process recorder: not a test's own
        from ... import runtime

        runtime.shutdown()
    else:
        state.recorder().flush()


def before_engine_shutdown(*args: Any, **kwargs: Any) -> None:
    engine = args[0] if args else None
    own_process = any(cls.__name__ == "EngineCoreProc" for cls in type(engine).__mro__)
    _finish(close=own_process)
    return None


def before_worker_shutdown(*args: Any, **kwargs: Any) -> None:
    _finish(close=True)
    return None

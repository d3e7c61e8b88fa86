"""CUDA graphs: what spectrace can and cannot see, and the one check that works on replay.

Python hooks inside the model run when a graph is captured, never when it replays, so
each runner's first replay records (once, then counts: ``Recorder.coverage``) that
replayed steps are not traced per module. ``execute`` itself is Python and runs on every
replay: the draft-extend runner copies the incoming hidden states into its static buffer
only when the widths match, otherwise the graph replays on stale data (0.5.17 and
0.5.23). The width test is host metadata (shapes), no device sync.
"""

from __future__ import annotations

from typing import Any

from ...checks.widths import check_graph_buffer_width
from . import state


def capturing() -> bool:
    """True while a CUDA stream is capturing: no .item()/.cpu() may run then."""
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


_details: dict[str, str] = {}  # runner -> its coverage detail (this runs on every replay)


def _replayed(runner: str, times: int = 1) -> None:
    rec = state.recorder()
    rec.count("graph_replay_steps", times)
    detail = _details.get(runner)
    if detail is None:
        detail = _details[runner] = (
            f"{runner} replays a captured CUDA graph: replayed steps are not traced per module "
            "(load- and capture-time checks ran; acceptance is still recorded)"
        )
    # Said once per runner, then counted (the count reaches the file's counters record).
    rec.coverage("graph_replay", detail, times=times)


def after_execute(result: Any, *args: Any, **kwargs: Any) -> None:
    """HookRegistry AFTER on a graph runner's ``execute``: an SGLang whose runners do not
    replay through ``runner_backend`` (where they do, ``graph_stats.ReplayGate`` counts)."""
    try:
        _replayed(type(args[0]).__name__)
    except Exception as exc:
        state.internal_error("graph execute", exc)
    return None


STALE_CHECK_FIRST = 32  # draft-extend calls checked one by one, then one in STALE_CHECK_EVERY
STALE_CHECK_EVERY = 64


def before_draft_extend_execute(*args: Any, **kwargs: Any) -> None:
    """HookRegistry BEFORE on ``EAGLEDraftExtendCudaGraphRunner.execute(self, forward_batch, ...)``.

    The widths come from the configs and do not change within a run, so after the first
    calls a sample suffices (this runs on every verify step of a server)."""
    try:
        st = state.STATE
        st.stale_checks += 1
        if st.stale_checks > STALE_CHECK_FIRST and st.stale_checks % STALE_CHECK_EVERY:
            return None
        runner = args[0]
        batch = args[1] if len(args) > 1 else kwargs.get("forward_batch")
        incoming = getattr(getattr(batch, "spec_info", None), "hidden_states", None)
        buffer = getattr(getattr(runner, "buffers", None), "hidden_states", None)
        if incoming is None or buffer is None or incoming.dim() < 2 or buffer.dim() < 2:
            return None
        seen, expected = int(incoming.shape[-1]), int(buffer.shape[-1])
        if seen != expected:
            name = type(runner).__name__
            state.emit_once("graph_stale_hidden", lambda: check_graph_buffer_width(seen, expected, name, source="sglang.graphs")[0])
    except Exception as exc:
        state.internal_error("draft-extend execute", exc)
    return None

"""Name the trace file after the rank as early as the process knows it.

0.5.23 publishes the placement with ``runtime_context.publish(server_args, role=...,
ranks=SpawnRanks(world_rank=...))`` right after the scheduler starts; 0.5.17's
``Scheduler.__init__`` takes ``tp_rank``. As a last resort the first hook that fires
asks ``torch.distributed`` (a host-side query).
"""

from __future__ import annotations

import inspect
from typing import Any

from . import state


def set_rank(rank: int | None) -> None:
    if rank is None:
        return
    try:
        state.recorder().set_rank(int(rank))
        state.STATE.rank_set = True
    except Exception as exc:
        state.internal_error("set_rank", exc)


def ensure_rank() -> None:
    if state.STATE.rank_set:
        return
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            set_rank(dist.get_rank())
    except Exception:
        pass


def after_publish(result: Any, *args: Any, **kwargs: Any) -> None:
    ranks = kwargs.get("ranks")
    world_rank = getattr(ranks, "world_rank", None)
    if isinstance(world_rank, int) and kwargs.get("role", "") != "test":
        set_rank(world_rank)
    return None


def before_scheduler_init(*args: Any, **kwargs: Any) -> None:
    try:
        cls = type(args[0])
        params = list(inspect.signature(cls.__init__).parameters)
        if "tp_rank" in kwargs:
            set_rank(kwargs["tp_rank"])
        elif "tp_rank" in params and params.index("tp_rank") < len(args):
            set_rank(args[params.index("tp_rank")])
    except Exception as exc:
        state.internal_error("scheduler rank", exc)
    return None

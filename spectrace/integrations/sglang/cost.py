"""The host time of the serving hooks, summed where it is spent and handed over in batches.

Every hook on a serving engine's hot path (a graph replay, a verify step) times itself.
Taking the recorder's lock on every call was a third of a replay hook's cost, so each
feature sums its calls here and hands the sums to the recorder every ``FLUSH_EVERY``
calls, and at every read and at close (a recorder drain).

Calls over ``SLOW_S`` are summed apart as well: a hook that does a few microseconds of
Python only takes that long when its thread lost the CPU or waited for the GIL (another
thread's turn lasts up to the 5 ms switch interval). Those calls make most of a live
server's hook time; the split tells the two apart in the trace.
"""

from __future__ import annotations

from ...hooks.identity import ByIdentity
from . import state

FLUSH_EVERY = 256
SLOW_S = 100e-6


class FeatureCost:
    """The sums of one feature since the last flush (no lock: one hot thread adds)."""

    __slots__ = ("feature", "seconds", "calls", "slow_calls", "slow_seconds")

    def __init__(self, feature: str) -> None:
        self.feature = feature
        self.seconds = 0.0
        self.calls = 0
        self.slow_calls = 0
        self.slow_seconds = 0.0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1
        if self.calls == 1:  # the first call since a flush: make sure a drain will hand it over
            try:
                _drain_on(state.recorder())
            except Exception as exc:  # a hook's accounting never raises into the engine
                state.internal_error("hook cost", exc)
        if seconds > SLOW_S:
            self.slow_calls += 1
            self.slow_seconds += seconds
        if self.calls >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        calls = self.calls
        if not calls:
            return
        seconds, slow_calls, slow_seconds = self.seconds, self.slow_calls, self.slow_seconds
        self.seconds, self.calls, self.slow_calls, self.slow_seconds = 0.0, 0, 0, 0.0
        try:
            rec = state.recorder()
            rec.account_hook(seconds, self.feature, calls=calls, slow_calls=slow_calls, slow_seconds=slow_seconds)
        except Exception as exc:
            state.internal_error("hook cost", exc)


_features: dict[str, FeatureCost] = {}
_drained: ByIdentity[bool] = ByIdentity()  # the recorders drained (not by id: a new one may reuse it)


def of(feature: str) -> FeatureCost:
    """The running sums of ``feature`` (one object per feature, for the process)."""
    found = _features.get(feature)
    if found is None:
        found = _features[feature] = FeatureCost(feature)
    return found


def flush_all() -> None:
    for cost in list(_features.values()):
        cost.flush()


def _drain_on(rec: object) -> None:
    # The sums reach the file at close and before anything reads the counters.
    if rec not in _drained:
        _drained[rec] = True
        rec.add_drain(flush_all)  # type: ignore[attr-defined]

"""Checks that run while a server serves: fed one call record at a time.

:class:`LiveChecks` keeps, per target step, the residual-stream statistics of each
boundary and the statistics of each chunk of the fused draft input, and every ``every``
complete steps (and at :meth:`LiveChecks.finish`) says

- ``chunk_unmatched`` / ``chunk_provenance``: which boundary each chunk really is
  (:mod:`.provenance`), against the ``capture`` record's boundaries;
- ``feature_skew`` (or ``shape_mismatch``): the chunks' statistics over the recent steps
  against a training fingerprint, when one was given (``SPECTRACE_FINGERPRINT=fp.json``).

Findings go through ``emit(key, make)``, the recorder's say-once API
(:meth:`spectrace.recorder.Recorder.once`): each is said once and its repeats counted.
It never raises (it runs on a server's worker thread) and costs O(chunks) per call.

    >>> live = LiveChecks(recorder.once, fingerprint, expected_boundaries=[2, 16, 29])
    >>> live.observe(call_dict)     # every call record of the step, dict or Call
    >>> live.finish()
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..records import Finding, Fingerprint, TensorStats
from ..safe_files import FileMissing, NotRegularFile, SafeFileError, read_regular, shown
from ..settings import fingerprint_path
from .calls import check_feature_skew
from .provenance import TOLERANCE, Key, ProvenanceTally, describe_provenance, read_call, stats_key

ENV_FINGERPRINT = "SPECTRACE_FINGERPRINT"
EVERY = 16  # complete target steps between two checks
WINDOW = 64  # target steps whose chunk statistics are compared with the fingerprint
_MAX_PENDING = 8  # steps kept open for late records
SETTLE = 64  # complete steps that all vote on the chunks' boundaries
SAMPLE = 8  # after those, one step in SAMPLE votes

Emit = Callable[[str, Callable[[], Finding]], Any]


class _Step:
    __slots__ = ("boundaries", "chunks", "module", "width")

    def __init__(self) -> None:
        self.boundaries: dict[int, Key | None] = {}
        self.chunks: list[Key | None] | None = None
        self.module = ""
        self.width: int | None = None


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if type(obj) is dict or isinstance(obj, Mapping) else getattr(obj, name, default)


class LiveChecks:
    """Provenance and fingerprint checks over a live trace, one call record at a time."""

    def __init__(
        self,
        emit: Emit,
        fingerprint: Fingerprint | None = None,
        expected_boundaries: Sequence[int] | None = None,
        *,
        every: int = EVERY,
        window: int = WINDOW,
        tolerance: float = TOLERANCE,
        on_error: Callable[[str], Any] | None = None,
    ) -> None:
        self.emit = emit
        self.fingerprint = fingerprint
        self.expected: list[int] | None = list(expected_boundaries) if expected_boundaries is not None else None
        self.every = max(1, int(every))
        self.on_error = on_error
        self.errors = 0
        self.last_error: str | None = None
        self.tally = ProvenanceTally(tolerance)
        self.complete = 0  # target steps with both boundaries and chunks
        self.module: str | None = None
        self.chunk_width: int | None = None
        self._pending: dict[int, _Step] = {}
        self._newest = -1
        # Per recent step and chunk: count, sum, sum of squares, absmax (-1: none).
        self._window: deque[list[tuple[float, float, float, float]]] = deque(maxlen=max(1, int(window)))
        # Re-entrant: a sink fed from emit() may hand a record straight back to observe().
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ inputs
    def set_expected_boundaries(self, boundaries: Sequence[int] | None) -> None:
        """The boundaries the target captures (the ``capture`` record's ``boundaries``)."""
        try:
            self.expected = [int(b) for b in boundaries] if boundaries is not None else None
        except Exception as exc:
            self._error("set_expected_boundaries", exc)

    def observe(self, call: Any) -> None:
        """Take one record (a :class:`~spectrace.records.Call`, a ``capture`` record, or their dicts)."""
        try:
            with self._lock:
                self._observe(call)
        except Exception as exc:
            self._error("observe", exc)

    def _observe(self, call: Any) -> None:
        step = _get(call, "step")
        if step is None:
            if _get(call, "type") == "capture":
                self.set_expected_boundaries(_get(call, "boundaries"))
            return
        step = int(step)
        if step > self._newest:
            self._advance(step)
        read = read_call(call)
        if read is None:
            return
        entry = self._pending.get(step)
        if entry is None:
            if step < self._newest and len(self._pending) >= _MAX_PENDING:
                return  # a straggler of a step already checked
            entry = self._pending[step] = _Step()
        kind, index, payload = read
        if kind == "boundary":
            if index is not None:
                entry.boundaries[index] = stats_key(payload)
        else:
            row: list[Key | None] = [None] * (max(payload) + 1)
            for i, raw in payload.items():
                row[i] = stats_key(raw)
            entry.chunks = row
            entry.module = str(_get(call, "module") or "")
            entry.width = index

    def finish(self) -> None:
        """Close the open steps and run the checks once more."""
        try:
            with self._lock:
                for step in sorted(self._pending):
                    self._close(self._pending.pop(step))
                self.check()
        except Exception as exc:
            self._error("finish", exc)

    # ------------------------------------------------------------------ outputs
    def provenance(self) -> list[int | None]:
        """The boundary each chunk came from so far (majority over the steps; None where unknown)."""
        try:
            seen = self.tally.provenance()
            width = len(self._window[-1]) if self._window else 0
            return seen + [None] * (width - len(seen))
        except Exception as exc:
            self._error("provenance", exc)
            return []

    def describe(self) -> list[str]:
        """``chunk 1 = boundary 3 (layer 2 output)``, one line per chunk."""
        return describe_provenance(self.provenance())

    def seen_fingerprint(self) -> Fingerprint | None:
        """The fused input's per-chunk statistics over the recent steps, as a fingerprint."""
        if not self._window:
            return None
        chunks = []
        # Summed afresh from the window (every `every` steps): no drift from subtracting.
        for i in range(len(self._window[-1])):
            count = total = sumsq = 0.0
            absmax = -1.0
            for row in self._window:
                n, s, q, a = row[i]
                count += n
                total += s
                sumsq += q
                absmax = max(absmax, a)
            if count <= 0:
                chunks.append(TensorStats())
                continue
            mean = total / count
            std = math.sqrt(max(sumsq / count - mean * mean, 0.0))
            chunks.append(TensorStats(mean=mean, std=std, absmax=absmax if absmax >= 0 else None, numel=int(count)))
        seen = self.tally.provenance()
        boundaries = seen if seen and all(b is not None for b in seen) else self.expected
        return Fingerprint(module=self.module or "", chunk_width=int(self.chunk_width or 0), chunks=chunks, boundaries=boundaries)

    def check(self) -> None:
        """Run the checks on what was seen so far (done every ``every`` complete steps)."""
        try:
            with self._lock:
                self._check()
        except Exception as exc:
            self._error("check", exc)

    def _check(self) -> None:
        module = self.module or ""
        for key, make in self.tally.problems(self.expected, module):
            self._say(key, make)
        if self.fingerprint is not None:
            seen = self.seen_fingerprint()
            if seen is not None:
                for found in check_feature_skew(seen, self.fingerprint):
                    self._say(f"{found.code}:{module}", _const(found))

    # ------------------------------------------------------------------ internals
    def _advance(self, step: int) -> None:
        self._newest = step
        older = [s for s in self._pending if s < step]
        if len(self._pending) - len(older) >= _MAX_PENDING:
            older = sorted(self._pending)[: len(self._pending) - _MAX_PENDING + 1]
        for s in sorted(older):
            self._close(self._pending.pop(s))

    def _close(self, entry: _Step) -> None:
        if entry.chunks is None:
            return
        self.module = entry.module or self.module
        if entry.width:
            self.chunk_width = entry.width
        if entry.boundaries and (self.complete < SETTLE or self.complete % SAMPLE == 0):
            # The capture does not change while serving: once every chunk has many votes,
            # one step in SAMPLE still votes (a change is still seen, later).
            self.tally.add(entry.boundaries, entry.chunks, self.expected)
        self._add_window(entry.chunks)
        self.complete += 1
        if self.complete % self.every == 0:
            self._check()

    def _add_window(self, chunks: list[Key | None]) -> None:
        if self._window and len(self._window[-1]) != len(chunks):
            self._window.clear()  # another chunk count: a new fused input
        row = []
        for key in chunks:
            if key is None:
                row.append((0.0, 0.0, 0.0, -1.0))
                continue
            mean, std, absmax, n = key
            row.append((float(n), mean * n, (std * std + mean * mean) * n, -1.0 if absmax is None else abs(absmax)))
        self._window.append(row)

    def _say(self, key: str, make: Callable[[], Finding]) -> None:
        try:
            self.emit(key, make)
        except Exception as exc:
            self._error(f"emit {key}", exc)

    def _error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"LiveChecks.{where}: {type(exc).__name__}: {exc}"
        if self.on_error is not None:
            try:
                self.on_error(self.last_error)
            except Exception:
                pass


def _const(record: Finding) -> Callable[[], Finding]:
    return lambda: record


# A fingerprint is a few chunks' statistics (a few KB): past 1 MiB a file is something else,
# and never read whole (``/dev/zero`` is refused before a byte is read, as any device is).
MAX_FINGERPRINT_BYTES = 1 << 20


def read_fingerprint(path: str) -> Fingerprint:
    """A fingerprint file, or ValueError with a one-line reason.

    The same messages as :func:`spectrace.eagle3.fingerprint.load_fingerprint`, without
    its torch import (checks stay torch-free). Only a regular file of at most
    :data:`MAX_FINGERPRINT_BYTES`, never through a symlink: a FIFO named here would block
    a server's start-up, a device would be read until memory runs out.
    """
    try:
        blob = read_regular(path, MAX_FINGERPRINT_BYTES)
    except FileMissing:
        raise ValueError(f"no fingerprint at {shown(path)}") from None
    except NotRegularFile as exc:
        if exc.kind == "a folder":
            raise ValueError(f"{shown(path)} is a folder, not a fingerprint file") from None
        raise ValueError(str(exc)) from None
    except OSError as exc:  # SafeFileError included: its text is the one-line reason
        raise ValueError(str(exc) if isinstance(exc, SafeFileError) else f"cannot read {shown(path)}: {exc.strerror or exc}") from None
    try:
        data: Any = json.loads(blob.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{shown(path)} is not a JSON fingerprint") from None
    except (ValueError, RecursionError):  # an integer of more than 4,300 digits, nesting past the stack
        raise ValueError(f"{shown(path)} is not a usable JSON fingerprint") from None
    try:
        return Fingerprint.model_validate(data)
    except Exception as exc:  # pydantic validation
        raise ValueError(f"{shown(path)} is not a valid fingerprint: {str(exc).splitlines()[0]}") from None


def fingerprint_from_env(environ: Mapping[str, str]) -> tuple[Fingerprint | None, str | None]:
    """``SPECTRACE_FINGERPRINT=PATH``: ``(fingerprint, None)``, ``(None, None)`` when unset, and
    ``(None, one-line warning)`` for a path that cannot be used. Never raises, never blocks."""
    path = fingerprint_path(environ)
    if not path:
        return None, None
    try:
        return read_fingerprint(path), None
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"{ENV_FINGERPRINT}: {text}; the feature_skew check is off"

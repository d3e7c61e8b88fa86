"""The record worker: finished steps become records on a background thread.

A hook only notes what it saw (names, shapes, a statistics slot). Turning that into
pydantic records, waiting for the statistics copy, serialising JSON and exporting spans
is the expensive part, and the host program pays for every microsecond of it that runs
on its own thread after its last GPU sync. The worker does it instead, mostly while
the host thread waits on the GPU (torch releases the GIL there).

    >>> worker = RecordWorker(build=handle_step, on_drop=count_lost)
    >>> worker.submit(finished_step, busy=event_not_done)   # never raises
    >>> worker.build_landed_here(landed)  # the host builds the landed steps itself
    >>> worker.flush()                    # before anything reads the trace
    >>> worker.close()

When: a step is built once a *later* step has been submitted, and only while the
device is still busy with the work queued before that later submit (``busy``), or after
``lag_seconds``, or on :meth:`flush`. A step is submitted when the host has just
finished enqueueing a forward and is about to wait on the GPU; that wait is when
building costs the host nothing. Once that device work is done the host is awake
again, so the build pauses between records (:meth:`pause_point`) until the host
submits again. Building step N as soon as its own statistics landed would instead
collide with the host waking up from that very GPU work.

A host that runs ahead of its device (a host-bound decode loop) has waits too short to
build in: the thread would build while the host runs, and each would wait for the other at
the GIL. So at each step's end the host builds the queued steps whose statistics have
already landed itself (:meth:`build_landed_here`, never a wait on the device), and the
thread keeps what is left: steps still on the device, a lag, a flush.

Bounded: at most ``max_items`` steps wait. Past that the host thread waits for room
(the cost it would have paid building the records itself, so never worse than doing
the work inline), and only if the worker is stuck for ``stall_seconds`` is a step
dropped and counted (``on_drop``). Fork-safe: a child process starts empty (the steps
queued before the fork are the parent's) and starts its own thread on first use.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any


class RecordWorker:
    """One daemon thread that runs ``build(item)`` for each submitted item, in order."""

    def __init__(
        self,
        build: Callable[[Any], None],
        on_drop: Callable[[Any], None],
        *,
        max_items: int = 256,
        stall_seconds: float = 5.0,
        lag_seconds: float = 0.2,
        backlog: int = 8,
        name: str = "spectrace-records",
    ) -> None:
        self._build = build
        self._on_drop = on_drop
        self._max = max(1, max_items)
        self._stall = stall_seconds
        self._lag = lag_seconds
        # This many waiting: build whatever the device does. Each waiting step holds its
        # statistics buffer (about 2.7 MB of device memory on an H200), so keep it small.
        self._backlog = max(2, backlog)
        self._flushing = 0
        self._name = name
        self._queue: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stopping = False
        self._building = False  # the thread is building an item
        self._here = False  # a host thread is building items it took (build_landed_here)
        _live.add(self)

    # ------------------------------------------------------------------ intake
    def submit(self, item: Any, busy: Callable[[], bool] | None = None, wake: bool = True) -> None:
        """Queue one finished step; when the queue is full, wait for room (bounded).

        ``busy()`` says whether the device work the host queued before this submit is
        still running (never blocks); None means unknown, taken as busy. ``wake=False``:
        the caller builds it itself once it has landed (:meth:`build_landed_here`), so the
        thread is not woken for it (each wake is a turn at the GIL taken from the host); it
        still builds it once the lag has passed, or for a backlog or a flush.
        """
        with self._cond:
            self._ensure_thread()
            dropped = not self._cond.wait_for(lambda: len(self._queue) < self._max, timeout=self._stall)
            if not dropped:
                self._queue.append((time.monotonic(), item, busy))
                self._submitted += 1
                # (a thread idle on an empty queue waits without a timeout: it must hear of the first)
                if wake or len(self._queue) == 1 or self._urgent():
                    self._cond.notify_all()
        if dropped:
            self._on_drop(item)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every step submitted so far is built; False on timeout."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                # No thread (never started, or a forked child): build here, in order.
                self._run_inline()
                return True
            target = self._submitted
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._done >= target, timeout=timeout)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = 30.0) -> None:
        """Build what is queued, then stop the thread (a later submit starts a new one)."""
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            self._thread = None
            self._stopping = False

    def build_landed_here(self, landed: Callable[[Any], bool]) -> int:
        """Build on the calling thread, in order, the queued items at the head of the queue
        that need no wait (``landed(item)``: their statistics are on the host); returns how
        many. Nothing while the thread is building one (the order holds) or a flush runs.

        For a host that runs ahead of its device (a host-bound decode loop): its waits on
        the device are too short to build in, so the thread would build while the host runs
        and both would take turns at the GIL, each turn a wait for the other. The host
        building its own landed steps pays only the build.
        """
        with self._cond:
            if self._building or self._here or self._flushing or os.getpid() != self._pid:
                return 0
            taken = []
            while self._queue:
                try:
                    ready = landed(self._queue[0][1])
                except Exception:  # a probe that fails: leave the item to the thread
                    ready = False
                if not ready:
                    break
                taken.append(self._queue.popleft()[1])
            if not taken:
                return 0
            self._here = True
        try:
            for item in taken:
                self._safe_build(item)
        finally:
            with self._cond:
                self._here = False
                self._done += len(taken)
                self._cond.notify_all()
        return len(taken)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued and nothing being built: a step built elsewhere now stays in order."""
        with self._cond:
            return self._done >= self._submitted

    # ------------------------------------------------------------------ thread
    def _after_fork_in_child(self) -> None:
        """In a forked child: the steps queued before the fork are the parent's (it builds
        them into its own trace); the child starts empty, with a fresh condition (a thread
        that held the old one does not exist here) and, on first use, its own thread."""
        self._cond = threading.Condition()
        self._queue = collections.deque()
        self._submitted = self._done = self._flushing = 0
        self._stopping = self._building = self._here = False
        self._pid, self._thread = os.getpid(), None

    def _ensure_thread(self) -> None:
        # Called with the condition held.
        if os.getpid() != self._pid:
            # A forked child inherits no thread (and its queue was emptied at the fork).
            self._pid, self._thread = os.getpid(), None
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _urgent(self) -> bool:
        # Called with the condition held: build now, whatever the host is doing.
        return bool(self._flushing or self._stopping or len(self._queue) >= self._backlog)

    def _host_waiting(self) -> bool:
        # Called with the condition held: the newest submitted step's device work is still
        # running, so the host is (about to be) waiting on it. With nothing newer waiting
        # the build is due to the lag or a flush: go straight through.
        busy = self._queue[-1][2] if self._queue else None
        if busy is None:
            return True
        try:
            return bool(busy())
        except Exception:  # a probe that fails says nothing: do not hold work back on it
            return True

    def _due(self) -> bool:
        # Called with the condition held. Never while a host thread builds what it took
        # (build_landed_here): the next item must wait for those before it.
        if not self._queue or self._here:
            return False
        if self._urgent() or time.monotonic() - self._queue[0][0] >= self._lag:
            return True
        return len(self._queue) >= 2 and self._host_waiting()

    def pause_point(self) -> None:
        """Called by ``build`` between records: on the worker thread, when the host is
        awake again (the newest step's device work finished), wait until it submits the
        next step (or ``lag_seconds``, a flush, a backlog); otherwise just let a host
        thread that wants the GIL have it."""
        if threading.current_thread() is not self._thread:
            return
        with self._cond:
            if not (self._urgent() or self._host_waiting()):
                seen = self._submitted
                self._cond.wait_for(lambda: self._submitted != seen or self._urgent(), timeout=self._lag)
                return
        # Without this a host thread that wants the GIL waits for the switch interval
        # (5 ms) each time it gets here.
        time.sleep(0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    if self._stopping and not self._queue:
                        return
                    waited = time.monotonic() - self._queue[0][0] if self._queue else 0.0
                    self._cond.wait(timeout=max(0.001, self._lag - waited) if self._queue else None)
                _, item, _ = self._queue.popleft()
                self._building = True
            try:
                self._safe_build(item)
            finally:
                with self._cond:
                    self._building = False
                    self._done += 1
                    self._cond.notify_all()

    def _run_inline(self) -> None:
        # Called with the condition held; the work itself must not need it.
        while self._queue:
            _, item, _ = self._queue.popleft()
            self._safe_build(item)
            self._done += 1

    def _safe_build(self, item: Any) -> None:
        try:
            self._build(item)
        except Exception:  # build reports its own failures; the thread must survive anything
            pass


_live: weakref.WeakSet[RecordWorker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for worker in list(_live):
        try:
            worker._after_fork_in_child()
        except Exception:  # never into the child
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

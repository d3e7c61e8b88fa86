"""The record worker: steps built in order, off the caller's thread, bounded, never lost silently."""

from __future__ import annotations

import threading
import time

from spectrace.hooks.worker import RecordWorker


def test_steps_are_built_in_order_on_the_worker_thread_and_flush_waits_for_all():
    built: list[tuple[int, str]] = []
    worker = RecordWorker(lambda item: built.append((item, threading.current_thread().name)), lambda item: None)
    for i in range(50):
        worker.submit(i)
    assert worker.flush(timeout=10)
    assert [i for i, _ in built] == list(range(50))
    assert {name for _, name in built} == {"spectrace-records"}
    worker.close()


def test_a_step_waits_for_the_next_one_or_for_the_lag():
    built: list[int] = []
    worker = RecordWorker(built.append, lambda item: None, lag_seconds=0.3)
    worker.submit(1)
    time.sleep(0.05)
    assert built == []  # the host may still be busy: step 1 waits for step 2 (or the lag)
    worker.submit(2)
    deadline = time.monotonic() + 5
    while not built and time.monotonic() < deadline:
        time.sleep(0.005)
    assert built == [1]
    deadline = time.monotonic() + 5
    while len(built) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert built == [1, 2]  # the last step goes once the lag has passed, without a flush
    worker.close()


def test_a_build_that_raises_does_not_stop_the_worker():
    built: list[int] = []

    def build(item: int) -> None:
        if item == 3:
            raise RuntimeError("broken record")
        built.append(item)

    worker = RecordWorker(build, lambda item: None)
    for i in range(6):
        worker.submit(i)
    assert worker.flush(timeout=10)
    assert built == [0, 1, 2, 4, 5]
    worker.close()


def test_a_stuck_worker_makes_submit_drop_and_count_after_the_stall_limit():
    release = threading.Event()
    dropped: list[int] = []
    worker = RecordWorker(lambda item: release.wait(10), dropped.append, max_items=2, stall_seconds=0.2, lag_seconds=0.0)
    t0 = time.monotonic()
    for i in range(6):
        worker.submit(i)
    assert dropped and time.monotonic() - t0 < 5  # the host waited a bounded time, then counted the loss
    release.set()
    assert worker.flush(timeout=10)
    worker.close()


def test_close_builds_what_is_queued_and_a_later_submit_starts_a_new_thread():
    built: list[int] = []
    worker = RecordWorker(built.append, lambda item: None, lag_seconds=60)
    worker.submit(1)
    worker.close()
    assert built == [1]
    worker.submit(2)
    assert worker.flush(timeout=10) and built == [1, 2]
    worker.close()


def _wait_until(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


def test_a_step_is_built_while_the_newer_steps_device_work_runs_not_after_it():
    # busy() stands in for a CUDA event query on the work queued before the submit.
    built: list[int] = []
    device_busy = {2: False}
    worker = RecordWorker(built.append, lambda item: None, lag_seconds=60)
    worker.submit(1)
    worker.submit(2, busy=lambda: device_busy[2])
    time.sleep(0.1)
    assert built == []  # step 2's work already done: the host is awake, step 1 waits
    worker.submit(3, busy=lambda: True)  # the host queued more work and waits on it
    assert _wait_until(lambda: built == [1, 2])
    assert worker.flush(timeout=10) and built == [1, 2, 3]
    worker.close()


def test_a_build_pauses_between_records_once_the_host_is_awake_and_resumes_on_the_next_submit():
    records: list[tuple[int, int]] = []
    awake = threading.Event()
    holder: dict[str, RecordWorker] = {}

    def build(item: int) -> None:
        for r in range(4):
            records.append((item, r))
            if item == 1 and r == 1:
                awake.set()  # the device work of step 2 finishes while step 1 is built
            holder["w"].pause_point()

    worker = holder["w"] = RecordWorker(build, lambda item: None, lag_seconds=60)
    worker.submit(1)
    worker.submit(2, busy=lambda: not awake.is_set())
    assert _wait_until(lambda: len(records) >= 2)
    time.sleep(0.1)
    assert records == [(1, 0), (1, 1)]  # paused mid-step: the host has the interpreter
    worker.submit(3, busy=lambda: True)
    assert _wait_until(lambda: len(records) >= 8)
    assert records[:8] == [(1, r) for r in range(4)] + [(2, r) for r in range(4)]
    assert worker.flush(timeout=10)
    worker.close()


def test_a_backlog_is_built_even_while_the_host_is_awake():
    built: list[int] = []
    worker = RecordWorker(built.append, lambda item: None, lag_seconds=60, backlog=4)
    for i in range(4):
        worker.submit(i, busy=lambda: False)
    assert _wait_until(lambda: len(built) >= 1)
    worker.close()


def test_a_forked_child_never_builds_the_parents_queued_steps(tmp_path) -> None:
    """Steps still queued when the host forks are the parent's: the parent builds them into
    its own trace; the child's worker starts empty and builds only what the child submits."""
    import json
    import os

    built: list[list[object]] = []
    gate = threading.Event()

    def build(item: list[object]) -> None:
        gate.wait(10)  # the parent's worker is held here, so steps stay queued across the fork
        built.append(item)

    worker = RecordWorker(build=build, on_drop=lambda item: None, lag_seconds=0.0)
    for i in range(5):
        worker.submit(["parent", i], busy=lambda: False)
    time.sleep(0.2)  # the parent's thread has taken the first step and waits in build
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        try:
            gate.set()  # the child's copy of the event
            worker.submit(["child", 0], busy=lambda: False)
            worker.flush(5)
            out.write_text(json.dumps(built))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert json.loads(out.read_text()) == [["child", 0]]  # none of the parent's steps
    gate.set()
    assert worker.flush(10)
    assert built == [["parent", i] for i in range(5)]  # the parent built all of its own


def test_a_host_builds_the_landed_steps_at_the_queues_head_itself_in_order():
    built: list[tuple[int, str]] = []
    worker = RecordWorker(lambda item: built.append((item, threading.current_thread().name)), lambda item: None, lag_seconds=60)
    landed = {1, 2, 4}  # step 3's statistics are still on the device
    for i in (1, 2, 3, 4):
        worker.submit(i, busy=lambda: False)
    assert worker.build_landed_here(lambda item: item in landed) == 2
    # Steps 1 and 2, on this thread; step 4 waits behind step 3 (the order holds).
    assert built == [(1, threading.current_thread().name), (2, threading.current_thread().name)]
    assert worker.pending == 2 and not worker.idle()
    landed.add(3)
    assert worker.build_landed_here(lambda item: item in landed) == 2
    assert [i for i, _ in built] == [1, 2, 3, 4] and worker.idle()
    assert worker.flush(timeout=10)
    worker.close()


def test_a_host_builds_nothing_while_the_thread_builds_and_the_thread_waits_while_the_host_builds():
    order: list[int] = []
    release = threading.Event()
    started = threading.Event()

    def build(item: int) -> None:
        if item == 1 and threading.current_thread().name == "spectrace-records":
            started.set()
            release.wait(10)
        order.append(item)

    worker = RecordWorker(build, lambda item: None, lag_seconds=60)
    worker.submit(1)
    worker.submit(2, busy=lambda: True)  # the host waits on the device: the thread takes step 1
    assert started.wait(5)
    assert worker.build_landed_here(lambda item: True) == 0  # step 2 must not pass step 1
    release.set()
    assert worker.flush(timeout=10) and order == [1, 2]

    worker.close()


def test_the_thread_starts_nothing_newer_while_a_host_builds_what_it_took():
    order: list[tuple[int, str]] = []
    inside = threading.Event()
    go_on = threading.Event()

    def build(item: int) -> None:
        if item == 1:
            inside.set()
            go_on.wait(10)
        order.append((item, threading.current_thread().name))

    worker = RecordWorker(build, lambda item: None, lag_seconds=60)
    worker.submit(1, busy=lambda: False)  # alone and the host awake: not due for the thread
    host = threading.Thread(target=worker.build_landed_here, args=(lambda item: item == 1,), name="host")
    host.start()
    assert inside.wait(5)
    worker.submit(2, busy=lambda: True)
    worker.submit(3, busy=lambda: True)  # due for the thread, were step 1 not being built
    time.sleep(0.2)
    assert order == []
    go_on.set()
    host.join(10)
    assert worker.flush(timeout=10)
    assert order == [(1, "host"), (2, "spectrace-records"), (3, "spectrace-records")]
    worker.close()


def test_a_step_submitted_without_waking_the_thread_waits_for_the_host_the_lag_or_a_flush():
    built: list[int] = []
    worker = RecordWorker(built.append, lambda item: None, lag_seconds=60)
    worker.submit(1, busy=lambda: True)
    time.sleep(0.1)  # the thread has looked at step 1 (alone: not due) and waits
    worker.submit(2, busy=lambda: True, wake=False)  # woken, the thread would build step 1 now
    time.sleep(0.2)
    assert built == []  # each wake would be a turn at the GIL taken from the host
    assert worker.build_landed_here(lambda item: item == 1) == 1 and built == [1]
    assert worker.flush(timeout=10) and built == [1, 2]
    worker.close()

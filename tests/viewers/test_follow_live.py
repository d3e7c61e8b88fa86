"""``spectrace view --follow``'s live screen and the live acceptance check.

- the check (``checks/acceptance_live.py``) on windows of real ``Acceptance`` records;
- the screen (``viewers/follow.py``) over a file the real ``Recorder`` keeps appending to:
  status line, what is new, the live ``acceptance_collapse`` before the writer says it,
  a torn last line that is no error;
- end to end: a real writer process serving the tiny EAGLE-3 pair (``tests/scripts/
  follow_writer.py``, its capture switched off live) read by ``spectrace view --follow``
  in tmux at 80x40 and 120x40.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrace.checks.acceptance_live import SOURCE, LiveAcceptance, VerifyStep, check_collapse_window, verify_step
from spectrace.checks.calls import COLLAPSE_WINDOW, check_acceptance
from spectrace.recorder import Recorder
from spectrace.records import Acceptance, Finding, Header
from spectrace.settings import Settings
from spectrace.viewers.follow import NEW_HOLD_S, LiveScreen
from spectrace.viewers.loader import TraceFollower
from spectrace.viewers.model import ViewBuilder, ViewFilter
from spectrace.viewers.render import make_console
from tests.helpers import paths
from tests.viewers.test_viewer import Tmux, _shell_cmd, follow_json

REPO = paths.ROOT
WRITER = paths.SCRIPTS / "follow_writer.py"
TRACE = "trace-node1-4242-rank0.jsonl"


def acc(step: int, lengths: list[int], k: int = 4) -> Acceptance:
    return Acceptance(step=step, accept_lengths=lengths, draft_tokens=k, accepted_per_position=[])


# ------------------------------------------------------------------ the live check
def test_window_of_collapsed_records_is_a_live_collapse() -> None:
    records = [acc(s, [1, 1, 1, 2]) for s in range(40, 40 + COLLAPSE_WINDOW)]  # mean 1.25 per step
    assert check_collapse_window([verify_step(r) for r in records]) == []  # 1.25 is above the floor
    records = [acc(s, [1, 1, 1, 1, 2]) for s in range(40, 40 + COLLAPSE_WINDOW)]  # 1.2: the floor itself
    found = check_collapse_window([verify_step(r) for r in records], run_mean=3.5)  # type: ignore[misc]
    assert [f.code for f in found] == ["acceptance_collapse"]
    f = found[0]
    assert f.source == SOURCE and f.step == 40 and f.severity == "warning"
    assert f.evidence == {"window_mean": 1.2, "window": COLLAPSE_WINDOW, "draft_tokens": 4, "first_step": 40, "run_mean": 3.5}
    assert "steps 40..47" in f.message and "3.50 over the run so far" in f.message
    # The same decision as the writer's whole-run check on the same records.
    assert [x.code for x in check_acceptance(records)] == ["acceptance_collapse"]


def test_window_too_short_or_healthy_says_nothing() -> None:
    short = [VerifyStep(s, 1.0, 4) for s in range(COLLAPSE_WINDOW - 1)]
    assert check_collapse_window(short) == []
    healthy = [VerifyStep(s, 4.5, 4) for s in range(COLLAPSE_WINDOW)]
    assert check_collapse_window(healthy) == []
    # Only the last window counts: a collapse long over is not "now".
    over = [VerifyStep(s, 1.0, 4) for s in range(COLLAPSE_WINDOW)] + [VerifyStep(100 + s, 4.0, 4) for s in range(COLLAPSE_WINDOW)]
    assert check_collapse_window(over) == []
    assert verify_step(acc(3, [])) is None  # a step that names no request has no mean


def test_live_acceptance_fed_one_record_at_a_time() -> None:
    live = LiveAcceptance()
    said: list[Finding] = []
    for s in range(20):
        said += live.observe(acc(s, [5]))
    assert said == [] and live.now == 5.0 and live.run_mean == 5.0
    for s in range(20, 20 + COLLAPSE_WINDOW - 1):
        said += live.observe(acc(s, [1]))
    assert said == []  # one step short of a collapsed window: 7 x 1 + 5 = 12 / 8 = 1.5
    said += live.observe(acc(20 + COLLAPSE_WINDOW - 1, [1]))
    assert [f.code for f in said] == ["acceptance_collapse"] and said[0].step == 20
    assert live.now == 1.0 and live.finding is said[0]
    assert round(said[0].evidence["run_mean"], 3) == round((20 * 5 + COLLAPSE_WINDOW) / (20 + COLLAPSE_WINDOW), 3)
    for s in range(40, 60):
        said += live.observe(acc(s, [1]))
    assert len(said) == 1  # said once
    assert live.observe(acc(10, [1])) == [] and live.out_of_order == 1 and live.last_step == 59


# -------------------------------------------------------- the screen over a real file
def _screen_after(tmp_path: Path, records: list) -> str:
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name=TRACE, rank=0)
    for r in records:
        rec.emit(r)
    rec.flush()
    follower = TraceFollower(tmp_path)
    follower.poll()
    screen = LiveScreen(str(tmp_path), clock=Clock())
    screen.update(ViewBuilder(ViewFilter()).build(follower.trace_set), follower.notices)
    return _frame_text(screen, width=120)


def test_screen_takes_the_writers_sampling_verdict_over_a_live_collapse(tmp_path: Path) -> None:
    # A load at temperature 1: the writer read the requests' sampling and said acceptance_sampled.
    steps = [
        Acceptance(step=s, accept_lengths=[1, 1], draft_tokens=4, greedy=[False, False], temperatures=[1.0, 1.0])
        for s in range(COLLAPSE_WINDOW + 2)
    ]
    (sampled,) = check_acceptance(steps)
    assert sampled.code == "acceptance_sampled"
    text = _screen_after(tmp_path / "sampled", [*steps, sampled])
    assert "acceptance_sampled" in text and "acceptance_collapse" not in text
    # The same steps with no verdict from the writer: the live check says the collapse.
    alone = _screen_after(tmp_path / "alone", steps)
    assert re.search(r"LIVE +WARNING +acceptance_collapse", alone), alone


def test_screen_says_nothing_as_the_batch_empties(tmp_path: Path) -> None:
    healthy = [acc(s, [5] * 8) for s in range(16)]
    emptying = [acc(16 + i, [1] * n) for i, n in enumerate([7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1])]
    assert "acceptance_collapse" not in _screen_after(tmp_path / "drain", healthy + emptying)
    steady = [acc(16 + i, [1] * 8) for i in range(14)]
    assert "acceptance_collapse" in _screen_after(tmp_path / "steady", healthy + steady)


class Clock:
    """The screen's clock, moved by the test: how long a change stays "new" without waiting."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _frame_text(screen: LiveScreen, width: int = 80, height: int = 40) -> str:
    return screen.frame(height=height).text(make_console(plain=True, width=width))


def test_screen_over_a_recorder_file_shows_the_collapse_live(tmp_path: Path) -> None:
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name=TRACE, rank=0)
    for s in range(16):
        rec.emit(acc(s, [5, 4]))
    rec.flush()
    follower = TraceFollower(tmp_path)
    follower.poll()
    clock = Clock()
    screen = LiveScreen(str(tmp_path), clock=clock)
    builder = ViewBuilder(ViewFilter())
    screen.update(builder.build(follower.trace_set), follower.notices)
    first = _frame_text(screen)
    lines = first.splitlines()
    assert re.match(r"^ open +steps 0\.\.15 +accept now 4\.50 / run 4\.50 +dropped 0 so far", lines[0]), lines[0]
    assert "New: nothing in the last" in first  # what the file held at the start is the baseline
    assert "acceptance_collapse" not in first

    clock.t += 2
    for s in range(16, 16 + COLLAPSE_WINDOW + 1):  # the newest step counts once a later one is there
        rec.emit(acc(s, [1, 1]))
    rec.flush()
    assert follower.poll()
    screen.update(builder.build(follower.trace_set), follower.notices)
    text = _frame_text(screen)
    assert not any(f.code == "acceptance_collapse" for f in follower.trace_set.all("findings"))  # the writer said nothing
    assert re.search(r"LIVE +WARNING +acceptance_collapse +from step 16 ", text), text
    assert "accept now 1.00 / run" in text.splitlines()[0]
    new = text[text.index("New in the last") : text.index("Findings:")]
    assert "acceptance_collapse (live)" in new and re.search(r"accept length now 4\.50 -> 1\.\d\d", new), new

    # A torn last line (the writer mid-write) is no error: nothing on screen says so.
    line = acc(99, [3]).model_dump_json()
    with open(follower.readers[str(tmp_path / TRACE)].file.path, "a") as fh:
        fh.write(line[:17])
    follower.poll()
    screen.update(builder.build(follower.trace_set), follower.notices)
    assert follower.trace_set.problems == []
    assert "truncated" not in _frame_text(screen) and "load:" not in _frame_text(screen)

    # The changes fade from "new" after the hold; the finding stays, one line plus its fix no more.
    clock.t += NEW_HOLD_S + 1
    later = _frame_text(screen)
    assert "New: nothing in the last" in later and "LIVE" in later

    # The writer's own finding replaces the live one once written.
    with open(follower.readers[str(tmp_path / TRACE)].file.path, "a") as fh:
        fh.write(line[17:] + "\n")
    for found in check_acceptance([acc(s, [1, 1]) for s in range(16, 16 + COLLAPSE_WINDOW)]):
        rec.emit(found)
    rec.close()
    follower.poll()
    screen.update(builder.build(follower.trace_set), follower.notices)
    final = _frame_text(screen)
    assert "LIVE" not in final and re.search(r"WARNING +acceptance_collapse", final)
    assert final.startswith(" closed ")


def _new_lines(text: str) -> list[str]:
    if "New in the last" not in text:
        return []
    return text[text.index("New in the last") : text.index("Findings:")].splitlines()[1:]


def test_a_sliding_change_in_accept_length_is_one_line(tmp_path: Path) -> None:
    """The window slides through a change over several refreshes: one line follows it."""
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name=TRACE, rank=0)
    for s in range(16):
        rec.emit(acc(s, [5]))
    rec.flush()
    follower, clock = TraceFollower(tmp_path), Clock()
    follower.poll()
    screen, builder = LiveScreen(str(tmp_path), clock=clock), ViewBuilder()
    screen.update(builder.build(follower.trace_set), follower.notices)
    for s in range(16, 30):  # one collapsed step per refresh, a second apart
        clock.t += 1
        rec.emit(acc(s, [1]))
        rec.flush()
        follower.poll()
        screen.update(builder.build(follower.trace_set), follower.notices)
    lines = [x for x in _new_lines(_frame_text(screen)) if "accept length now" in x]
    assert len(lines) == 1 and re.search(r"accept length now 5\.00 -> 1\.00", lines[0]), lines
    assert screen.rate() == 1.0  # one step a second, over the last 5 s
    assert "1.0 steps/s" in _frame_text(screen, width=120).splitlines()[0]
    clock.t += 6  # nothing for longer than the span: the pace is 0, not the last one seen
    assert screen.rate() == 0.0
    rec.close()


def test_a_rotated_file_starts_the_live_window_over(tmp_path: Path) -> None:
    from tests.helpers.traces import write_trace

    head = Header(spectrace_version="0", pid=1, host="elsewhere", rank=0, started_unix=1.7e9)
    path = write_trace(tmp_path / TRACE, [head, *[acc(s, [1]) for s in range(COLLAPSE_WINDOW + 1)]])
    follower, clock = TraceFollower(tmp_path), Clock()
    follower.poll()
    screen, builder = LiveScreen(str(tmp_path), clock=clock), ViewBuilder()
    screen.update(builder.build(follower.trace_set), follower.notices)
    assert "LIVE" in _frame_text(screen)
    clock.t += 1
    fresh = tmp_path / "new.tmp"
    write_trace(fresh, [head, *[acc(s, [4]) for s in range(COLLAPSE_WINDOW + 4)]])
    os.replace(fresh, path)  # a new file took the name: read again from the start
    assert follower.poll()
    screen.update(builder.build(follower.trace_set), follower.notices)
    text = _frame_text(screen)
    assert "LIVE" not in text and "acceptance_collapse" not in text.split("New in the last")[0]
    assert re.search(r"accept now 4\.00 / run 4\.00", text), text
    assert any("read again from the start" in x for x in _new_lines(text))


def test_screen_cuts_the_rest_to_the_height_and_says_so(tmp_path: Path) -> None:
    from tests.helpers.traces import fc_bypass_records, write_trace

    write_trace(tmp_path / TRACE, fc_bypass_records(steps=12))
    follower = TraceFollower(tmp_path)
    follower.poll()
    screen = LiveScreen(str(tmp_path))
    screen.update(ViewBuilder().build(follower.trace_set), follower.notices)
    for width, height in ((80, 20), (120, 24)):
        lines = _frame_text(screen, width, height).splitlines()
        assert len(lines) == height and all(len(x) <= width for x in lines)
        assert lines[0].startswith(" not closed ") or lines[0].startswith(" closed ")
        assert re.match(r"\.\.\. \d+ more lines below; spectrace view ", lines[-1]), lines[-1]
        assert any(" ERROR " in x and "fc_bypass" in x for x in lines)  # findings above the cut
    tall = _frame_text(screen, 80, 400).splitlines()
    assert "more lines below" not in "\n".join(tall) and any("EAGLE-3 data path" in x for x in tall)


def test_filters_hide_the_live_finding_as_they_hide_written_ones(tmp_path: Path) -> None:
    path = tmp_path / TRACE
    with open(path, "w") as fh:
        fh.write(Header(spectrace_version="0", pid=1, host="elsewhere", rank=0, started_unix=1.7e9).model_dump_json() + "\n")
        for s in range(COLLAPSE_WINDOW + 2):
            fh.write(acc(s, [1]).model_dump_json() + "\n")
    for flt, shown in ((ViewFilter(), True), (ViewFilter(finding="fc_bypass"), False)):
        follower = TraceFollower(tmp_path)
        follower.poll()
        screen = LiveScreen(str(tmp_path), flt)
        screen.update(ViewBuilder(flt).build(follower.trace_set), follower.notices)
        assert bool(screen.live_findings()) is shown
        assert screen.live.finding is not None  # the check ran either way; the filter only hides it


# --------------------------------------------------------- end to end: tmux + writer
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class SizedTmux(Tmux):
    def __init__(self, name: str, width: int, height: int) -> None:
        super().__init__(name)
        self.width, self.height = width, height

    def __enter__(self) -> SizedTmux:
        subprocess.run(
            self.sock + ["new-session", "-d", "-s", self.name, "-x", str(self.width), "-y", str(self.height)],
            check=True,
            env=dict(os.environ, TERM="xterm-256color"),
        )
        return self


def _wait(what: str, ok: object, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def _trace_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.glob("trace-*.jsonl"))


@needs_tmux
@pytest.mark.usefixtures("no_spectrace_env")
@pytest.mark.parametrize("width", [80, 120])
def test_tmux_follow_a_running_writer_shows_the_collapse_live(tmp_path: Path, width: int) -> None:
    traces, control = tmp_path / "traces", tmp_path / "control"
    traces.mkdir()
    control.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHDYNAMO_DISABLE="1")
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), str(traces), str(control)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        with SizedTmux(f"live{width}", width, 40) as t:
            t.send(_shell_cmd(str(traces), "--follow", "--interval", "0.2") + "; echo EXIT=$?", "Enter")
            _wait("the writer serving", lambda: (control / "ready").exists())
            # The status line first: open, steps, accept now against the run, drops, rate.
            # The switch waits for a healthy window on screen (24 steps and more): a viewer slow
            # to start would otherwise first fill its window with collapsed steps, and a fall
            # it never saw from a healthy level is not a change to show.
            screen = t.wait_for(r"steps 0\.\.(2[4-9]|[3-9]\d|\d{3,}) .*accept now [3-5]\.\d\d / run [3-5]\.\d\d.*\n?.*steps/s", timeout=90)
            status = screen.splitlines()[0]
            assert re.match(r"^ open +steps 0\.\.\d+ +(\(\d+ traced\) +)?accept now [3-5]\.\d\d / run [3-5]\.\d\d", status), screen
            assert "dropped 0 so far" in screen.split("\n", 2)[0] + screen.split("\n", 2)[1]
            assert "acceptance_collapse" not in screen and " ERROR " not in screen

            (control / "switch").touch()  # the capture goes off under the running writer
            # Every "new" line stays 30 s; on a loaded machine the collapse may take longer
            # to show than that, so the new lines are collected from every screen on the way.
            news: list[str] = []
            deadline = time.monotonic() + 120
            while True:
                screen = t.screen()
                if "New in the last" in screen and "Findings:" in screen:
                    news.append(screen[screen.index("New in the last") : screen.index("Findings:")])
                if re.search(r"LIVE +WARNING +acceptance_collapse", screen) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert re.search(r"LIVE +WARNING +acceptance_collapse", screen), screen
            assert writer.poll() is None  # still running ...
            assert "acceptance_collapse" not in _trace_text(traces)  # ... and it has not said it: the screen read it live
            new, seen = news[-1], "\n".join(news)
            assert "acceptance_collapse (live)" in new
            assert re.search(r"finding fc_bypass \(error\)", seen), seen
            # The change line may be drawn while the window slides (from 2.50, say): it falls.
            drops = [(float(a), float(b)) for a, b in re.findall(r"accept length now (\d\.\d\d) -> (\d\.\d\d)", seen)]
            assert any(b < 2.0 and a - b > 0.5 for a, b in drops), seen
            assert re.search(r"fc: called -> bypassed", seen), seen
            assert re.search(r"accept now 1\.\d\d / run \d\.\d\d", screen)
            assert all(len(line) <= width for line in screen.splitlines())
            if width == 80:
                assert "more lines below; spectrace view" in screen  # the data path is cut to fit 40 rows

            (control / "stop").touch()
            _wait("the writer closing its trace", lambda: writer.poll() is not None)
            screen = t.wait_for(r"^ closed ", timeout=30)
            assert "acceptance_collapse" in _trace_text(traces)  # the writer said it at the end ...
            assert "LIVE" not in screen and re.search(r"WARNING +acceptance_collapse", screen)  # ... and it stands
            t.send("C-c")
            assert "EXIT=0" in t.wait_for(r"EXIT=\d")
            assert "Traceback" not in t.screen(history=True)
    finally:
        (control / "stop").touch()
        try:
            out, _ = writer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()
            out, _ = writer.communicate()
    assert writer.returncode == 0, out


def test_follow_json_lines_carry_the_live_findings(tmp_path: Path) -> None:
    """``--follow --json`` into a pipe: each line is the view model plus ``live_findings``,
    the live check's finding before the traced process writes one of its own."""
    import json
    import signal

    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name=TRACE, rank=0)
    for s in range(16):
        rec.emit(acc(s, [5, 4]))
    rec.flush()
    proc = follow_json(tmp_path)
    try:
        first = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert first["live_findings"] == [] and first["header"]["steps_traced"] == 16
        for s in range(16, 16 + COLLAPSE_WINDOW + 1):
            rec.emit(acc(s, [1, 1]))
        rec.flush()
        live: list = []
        while not live:  # the append may arrive over more than one poll
            line = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            live = line["live_findings"]
        (found,) = live
        assert found["code"] == "acceptance_collapse" and found["source"] == SOURCE and found["step"] == 16
        assert not any(f["code"] == "acceptance_collapse" for f in line["findings"])  # the writer said nothing
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # a loaded CI machine may starve it for seconds
        rec.close()
    assert proc.returncode == 0 and "Traceback" not in err

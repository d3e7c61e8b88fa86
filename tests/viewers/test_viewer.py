"""The terminal viewer: loader, view model, plain-text rendering, diff, commands, tmux.

Traces are real records from spectrace.records written as JSONL (see test_viewer_fixtures).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrace.cli.diff import main as diff_main
from spectrace.cli.view import main as view_main
from spectrace.viewers import loader as loader_mod
from spectrace.viewers.diff import diff_traces
from spectrace.viewers.loader import TraceFollower, load_traces
from spectrace.viewers.model import ViewFilter, build_view, name_matches
from spectrace.viewers.render import make_console, render_view, sparkline
from tests.helpers import paths
from tests.helpers.traces import (
    fc_bypass_records,
    header,
    healthy_records,
    layer_mismatch_records,
    write_trace,
)

REPO = paths.ROOT
TRACE = "trace-node1-4242-rank0.jsonl"


def plain(renderable: object) -> str:
    buf = io.StringIO()
    make_console(buf, width=80, plain=True).print(renderable)
    return buf.getvalue()


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    write_trace(tmp_path / "healthy" / TRACE, healthy_records())
    return tmp_path / "healthy"


@pytest.fixture
def bug1(tmp_path: Path) -> Path:
    write_trace(tmp_path / "bug1" / "trace-node1-777-rank0.jsonl", fc_bypass_records())
    return tmp_path / "bug1"


@pytest.fixture
def bug3(tmp_path: Path) -> Path:
    write_trace(tmp_path / "bug3" / TRACE, layer_mismatch_records())
    return tmp_path / "bug3"


# --------------------------------------------------------------------------- model
def test_name_matching_is_suffix_based() -> None:
    assert name_matches("draft.model.fc", "model.fc")
    assert name_matches("model.fc", "fc")
    assert name_matches("draft.model.layers.0", "layers.0")
    assert not name_matches("draft.model.layers.0.input_layernorm", "norm")
    assert name_matches("x.model.aux_concat", "*aux_concat*")


def test_healthy_view(healthy: Path) -> None:
    view = build_view(load_traces(healthy))
    dp = view.datapath
    assert view.findings == []
    assert view.header.steps_traced == 12 and view.header.records_dropped == 0
    assert dp.fc.status == "called" and dp.fc.in_shapes == [[4, 192]] and dp.fc.out_shapes == [[4, 64]]
    assert dp.layer.modules == ["draft.model.layers.0"]
    assert dp.norm.modules == ["draft.model.norm"] and dp.lm_head.out_shapes == [[4, 100]]
    assert dp.d2t.status == "loaded"
    assert dp.captures[0].boundaries == [1, 2, 3]
    assert [c.boundary for c in dp.fingerprints[0].chunks] == [1, 2, 3]
    assert all(not c.flags for c in dp.fingerprints[0].chunks)
    assert 2.5 < view.acceptance.overall_mean < 3.5 and view.acceptance.draft_tokens == 4
    assert len(view.acceptance.position_rate) == 4 and view.acceptance.position_rate[0] > 0.9


def test_fc_bypass_view(bug1: Path) -> None:
    view = build_view(load_traces(bug1))
    codes = [f.code for f in view.findings]
    assert codes[0] == "fc_bypass" and set(codes) == {"fc_bypass", "weights_missing", "acceptance_collapse"}
    fc = view.findings[0]
    assert (fc.count, fc.first_step, fc.last_step) == (3, 0, 8)
    assert fc.fix.startswith("make the target capture") and fc.evidence["seen_width"] == 64
    assert view.datapath.fc.status == "bypassed"
    assert view.datapath.aux.status == "disabled"
    assert view.header.records_dropped == 17  # stats counter (17) beats the coverage event count (5)
    assert view.header.coverage_gaps == ["40 steps ran under CUDA-graph replay and were not traced per module"]
    assert view.acceptance.overall_mean < 2


def test_fc_bypass_inferred_without_finding(tmp_path: Path) -> None:
    recs = [r for r in fc_bypass_records() if getattr(r, "type", "") != "finding"]
    write_trace(tmp_path / TRACE, recs)
    fc = build_view(load_traces(tmp_path)).datapath.fc
    assert fc.status == "bypassed" and "its fc never ran" in fc.note  # check_fc_called decides; the viewer shows it


def test_embedding_chunk_is_flagged(bug3: Path) -> None:
    fp = build_view(load_traces(bug3)).datapath.fingerprints[0]
    assert fp.chunk_width == 64 and [c.boundary for c in fp.chunks] == [0, 2, 3]
    assert fp.chunks[0].flags and "below" in fp.chunks[0].flags[0]
    assert not fp.chunks[1].flags and not fp.chunks[2].flags


def test_module_table_and_anomalies(tmp_path: Path) -> None:
    from tests.helpers.traces import call, meta

    recs = [
        header(),
        call(0, 0, "draft.model.norm", "RMSNorm", "draft", [], [meta("output", [2, 64], 0.0, absmax=0.0)]),
        call(0, 1, "draft.lm_head", "Linear", "draft", [], [meta("output", [2, 100], 1.0, absmax=3e5, nan=3)]),
    ]
    write_trace(tmp_path / TRACE, recs)
    rows = {r.module: r for r in build_view(load_traces(tmp_path)).modules}
    assert rows["draft.model.norm"].anomalies == ["constant"]
    assert rows["draft.lm_head"].anomalies == ["nan x3", "huge"]


def test_filters(bug1: Path) -> None:
    ts = load_traces(bug1)
    assert [f.code for f in build_view(ts, ViewFilter(finding="fc_bypass")).findings] == ["fc_bypass"]
    v = build_view(ts, ViewFilter(step_min=4, step_max=4))
    fc = next(f for f in v.findings if f.code == "fc_bypass")
    assert (fc.count, fc.first_step) == (1, 4) and v.acceptance.steps == [4]
    assert [r.module for r in build_view(ts, ViewFilter(module="*norm")).modules] == ["draft.model.norm"]
    assert build_view(ts, ViewFilter(rank=3)).header.processes == []


# -------------------------------------------------------------------------- render
def test_plain_render_of_bug_trace(bug1: Path) -> None:
    text = plain(render_view(build_view(load_traces(bug1)), modules=True))
    assert "\x1b[" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    for needle in (
        "ERROR",
        "fc_bypass",
        "3 times, steps 0..8",
        "fix",
        "EAGLE-3 data path",
        "fc  BYPASSED",
        "40 steps ran under CUDA-graph replay",
        "records dropped 17",
        "Modules",
        "pos 1",
    ):
        assert needle in text, needle
    # errors come first and in the catalogue's words
    assert text.index("fc_bypass") < text.index("weights_missing")


def test_sparkline_scales_and_buckets() -> None:
    assert sparkline([0, 5], 5) == "▁█"
    assert len(sparkline([1.0] * 500, 5, width=60)) == 60


def test_no_color_env_and_non_tty(bug1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    make_console(buf, width=80).print(render_view(build_view(load_traces(bug1))))
    assert "\x1b[" not in buf.getvalue() and "fc_bypass" in buf.getvalue()


# ---------------------------------------------------------------------------- diff
def test_diff_sees_embedding_chunk_at_same_width(healthy: Path, bug3: Path) -> None:
    result = diff_traces(load_traces(healthy), load_traces(bug3), rtol=0.25)
    kinds = {d.kind for d in result.differences}
    assert "shape" not in kinds  # both 192 wide: shapes cannot see bug 3
    fps = [d for d in result.differences if d.kind == "fingerprint"]
    assert fps and all("chunk 0" in d.where for d in fps) and "b1 vs b0" in fps[0].detail
    cap = next(d for d in result.differences if d.kind == "capture")
    assert cap.a == [1, 2, 3] and cap.b == [0, 2, 3]
    assert result.verdict.startswith(f"{len(result.differences)} differences: ")


def test_diff_agree_and_rtol(healthy: Path, tmp_path: Path) -> None:
    assert diff_traces(load_traces(healthy), load_traces(healthy)).verdict == "traces agree"
    write_trace(tmp_path / "b" / TRACE, healthy_records(chunk_std=(1.0, 1.2, 1.65)))
    loose = diff_traces(load_traces(healthy), load_traces(tmp_path / "b"), rtol=0.5)
    tight = diff_traces(load_traces(healthy), load_traces(tmp_path / "b"), rtol=0.01)
    assert not any(d.kind == "fingerprint" for d in loose.differences)
    assert any(d.kind == "fingerprint" and "chunk 2" in d.where for d in tight.differences)


def test_diff_modules_and_acceptance(healthy: Path, bug1: Path) -> None:
    r = diff_traces(load_traces(healthy), load_traces(bug1))
    only = {d.where for d in r.differences if d.kind == "module"}
    assert {"draft.model.fc", "target.model.aux_concat"} <= only
    assert any(d.kind == "acceptance" for d in r.differences)
    assert any(d.kind == "finding" and d.where == "fc_bypass" for d in r.differences)


def test_diff_main(healthy: Path, bug3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert diff_main([str(healthy), str(bug3), "--rtol", "0.2"]) == 1  # they differ, as diff(1) says
    out = capsys.readouterr().out
    assert "fingerprint" in out and "differences:" in out.splitlines()[-1]
    assert diff_main([str(healthy), str(healthy)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "traces agree"
    assert diff_main([str(healthy), str(bug3), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["differences"]
    assert diff_main([str(healthy), str(healthy / "nope")]) == 2
    assert "spectrace diff: error: B:" in capsys.readouterr().err
    assert diff_main([str(healthy), str(bug3), "--rtol", "-1"]) == 2


# ------------------------------------------------------------------- bad inputs
def _lines(recs: list[object]) -> bytes:
    return b"".join(r.model_dump_json().encode() + b"\n" for r in recs)  # type: ignore[attr-defined]


def test_truncated_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _lines(healthy_records())
    (tmp_path / TRACE).write_bytes(data + b'{"type": "call", "step": 99, "se')
    ts = load_traces(tmp_path)
    assert [p.kind for p in ts.problems] == ["truncated"]
    assert len(ts.files[0].calls) == 12 * 5
    assert view_main([str(tmp_path), "--no-pager"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spectrace view: warning: {TRACE}: last line is truncated (writer killed or still writing); 1 line skipped"]


def test_random_bytes_inside_a_trace(tmp_path: Path) -> None:
    data = _lines(healthy_records()[:5]) + os.urandom(300).replace(b"\n", b"x") + b"\n" + b"\xff\xfe\x00\n" + _lines(healthy_records()[5:])
    (tmp_path / TRACE).write_bytes(data)
    ts = load_traces(tmp_path)
    (problem,) = ts.problems
    assert problem.kind == "undecodable" and problem.count == 2 and problem.first_line == 6
    assert "2 undecodable lines" in problem.message and "\n" not in problem.message
    assert len(ts.files[0].calls) == 12 * 5


def test_unknown_type_and_invalid_record(tmp_path: Path) -> None:
    data = _lines(healthy_records()) + b'{"type": "telemetry", "x": 1}\n' * 3 + b'{"type": "call", "step": "soon"}\n'
    (tmp_path / TRACE).write_bytes(data)
    msgs = [p.message for p in load_traces(tmp_path).problems]
    assert any("3 records of an unknown type" in m and "'telemetry' x3" in m for m in msgs)
    assert any("1 record that does not match the schema skipped" in m and "call.step" in m for m in msgs)


def test_future_schema_is_read_best_effort(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = healthy_records()
    recs[0] = header(version=99)
    write_trace(tmp_path / TRACE, recs)
    ts = load_traces(tmp_path)
    assert [p.kind for p in ts.problems] == ["future_schema"]
    assert "schema_version 99" in ts.problems[0].message
    assert view_main([str(tmp_path), "--no-pager"]) == 0
    assert "schema_version 99" in capsys.readouterr().err


def test_non_trace_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text("hello, this is a log file\nline two\n")
    assert view_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"spectrace view: error: {path}: not a spectrace trace (its first line is not JSON); skipped\n"


@pytest.mark.parametrize("first", ['{"model_type": "llama", "hidden_size": 64}', "[1, 2, 3]"])
def test_another_programs_json_is_said_to_be_no_spectrace_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str) -> None:
    # A config.json or any JSON lines of another program: JSON, but not a trace (not "not JSON").
    path = tmp_path / "config.json"
    path.write_text(first + "\n")
    assert view_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"spectrace view: error: {path}: not a spectrace trace (its first line is JSON, not a spectrace record); skipped\n"


def test_binary_file_is_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loader_mod, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(8 << 20).replace(b"\n", b"x"))
    reader = loader_mod.FileReader(str(path))
    reader.read_available(final=True)
    assert reader.abandoned and reader.offset == 0 and reader.lineno == 1
    assert view_main([str(path)]) == 2
    assert "not a spectrace trace" in capsys.readouterr().err


def test_overlong_line_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_mod, "MAX_LINE_BYTES", 4096)
    recs = healthy_records()
    data = _lines(recs[:3]) + b'{"type": "call", "pad": "' + b"a" * 20000 + b'"}\n' + _lines(recs[3:])
    (tmp_path / TRACE).write_bytes(data)
    ts = load_traces(tmp_path)
    assert [p.kind for p in ts.problems] == ["too_long"] and len(ts.files[0].calls) == 60


def test_empty_folder_and_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert view_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("folder holds no trace-*.jsonl files")
    assert view_main([str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / TRACE).write_bytes(b"")
    assert view_main([str(tmp_path)]) == 2
    assert "empty file" in capsys.readouterr().err


def test_one_bad_file_among_good(tmp_path: Path, bug1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (bug1 / "trace-node1-1-rank1.jsonl").write_bytes(b"\x00\x01garbage")
    assert view_main([str(bug1), "--no-pager"]) == 0
    captured = capsys.readouterr()
    assert "fc_bypass" in captured.out and "load: trace-node1-1-rank1.jsonl: not a spectrace trace" in captured.out
    assert captured.err.count("\n") == 1


def test_json_and_usage(bug1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert view_main([str(bug1), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["datapath"]["fc"]["status"] == "bypassed" and data["findings"][0]["code"] == "fc_bypass"
    assert view_main([str(bug1), "--step", "x:y"]) == 2
    assert view_main(["--help"]) == 0
    assert "examples:" in capsys.readouterr().out


def test_view_never_tracebacks(bug1: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import spectrace.cli.view as commands

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(commands, "build_view", boom)
    assert view_main([str(bug1), "--no-pager"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("spectrace view: error: internal error (RuntimeError: kaboom)") and "Traceback" not in err


# ------------------------------------------------------------------------ follow
def test_follower_reads_only_complete_lines(tmp_path: Path) -> None:
    recs = healthy_records()
    path = tmp_path / TRACE
    path.write_bytes(_lines(recs[:3]))
    f = TraceFollower(tmp_path)
    assert f.poll() and f.trace_set.files[0].header is not None
    assert not f.poll()
    line = _lines(recs[3:4])
    with open(path, "ab") as fh:
        fh.write(line[:10])
    assert not f.poll() and f.trace_set.files[0].calls == []
    with open(path, "ab") as fh:
        fh.write(line[10:])
    assert f.poll() and len(f.trace_set.files[0].calls) == 1
    assert f.trace_set.problems == []
    write_trace(tmp_path / "trace-node1-5-rank1.jsonl", [header(pid=5, rank=1)])
    assert f.poll() and len(f.trace_set.files) == 2


def test_import_has_no_torch() -> None:
    code = "import sys, spectrace.cli.view, spectrace.cli.diff, spectrace.viewers.diff; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


# -------------------------------------------------------------------------- tmux
VIEW_CMD = "import sys; from spectrace.cli.view import main as view_main; sys.exit(view_main(sys.argv[1:]))"


def follow_json(folder: Path, *extra: str, **env: str) -> subprocess.Popen:
    """``spectrace view FOLDER --follow --json`` into a pipe, as a script reads it (``extra``:
    more arguments; ``env``: more environment)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spectrace", "view", str(folder), "--follow", "--json", "--interval", "0.05", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
    )


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sock = ["tmux", "-L", f"spectrace-{os.getpid()}-{name}"]

    def __enter__(self) -> Tmux:
        subprocess.run(
            self.sock + ["new-session", "-d", "-s", self.name, "-x", "80", "-y", "50"],
            check=True,
            env=dict(os.environ, TERM="xterm-256color"),
        )
        return self

    def send(self, *keys: str) -> None:
        subprocess.run(self.sock + ["send-keys", "-t", self.name, *keys], check=True)

    def screen(self, history: bool = False) -> str:
        extra = ["-S", "-"] if history else []  # "-S -": include what scrolled off the top
        return subprocess.run(
            self.sock + ["capture-pane", "-p", *extra, "-t", self.name], capture_output=True, text=True, check=True
        ).stdout

    def wait_for(self, needle: str, timeout: float = 15.0) -> str:
        """Wait until ``needle`` (a regular expression) is on screen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if re.search(needle, text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared on screen:\n{self.screen()}")

    def __exit__(self, *exc: object) -> None:
        subprocess.run(self.sock + ["kill-server"], capture_output=True)


def _shell_cmd(*args: str) -> str:
    import shlex

    return (
        f"cd {shlex.quote(str(REPO))} && PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -c {shlex.quote(VIEW_CMD)} "
        + " ".join(shlex.quote(a) for a in args)
    )


@needs_tmux
def test_tmux_view_shows_findings_and_data_path(bug1: Path) -> None:
    with Tmux("view") as t:
        t.send(_shell_cmd(str(bug1), "--no-pager") + "; echo EXIT=$?", "Enter")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d")
        screen = t.screen(history=True)
        for needle in ("fc_bypass", "EAGLE-3 data path", "fc  BYPASSED", "d2t", "mean accept length"):
            assert needle in screen, needle
        assert "Traceback" not in screen


@needs_tmux
@pytest.mark.skipif(shutil.which("less") is None, reason="less is not installed")
def test_tmux_view_pages_long_output(bug1: Path) -> None:
    with Tmux("pager") as t:
        t.send("export PAGER=less LESS=-R", "Enter")
        t.send(_shell_cmd(str(bug1), "--modules") + "; echo EXIT=$?", "Enter")
        screen = t.wait_for("ERROR")
        assert not re.search(r"EXIT=\d", screen)  # still in the pager
        t.send("q")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d")


@needs_tmux
def test_tmux_follow_shows_appended_records(tmp_path: Path) -> None:
    path = tmp_path / "live" / TRACE
    recs = healthy_records(steps=2)
    write_trace(path, recs)
    with Tmux("follow") as t:
        t.send(_shell_cmd(str(path.parent), "--follow", "--interval", "0.1") + "; echo EXIT=$?", "Enter")
        t.wait_for("following")
        assert "fc_bypass" not in t.screen()
        bug = fc_bypass_records(steps=1)
        with open(path, "a") as fh:
            for r in bug[3:]:
                if getattr(r, "type", "") == "finding":
                    fh.write(r.model_dump_json() + "\n")  # type: ignore[attr-defined]
        screen = t.wait_for("fc_bypass")
        assert "ERROR" in screen and "following" in screen
        t.send("C-c")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d")
        assert "Traceback" not in t.screen()


def test_follow_into_a_pipe_prints_updates_and_quits_on_ctrl_c(tmp_path: Path) -> None:
    import signal

    path = tmp_path / TRACE
    recs = healthy_records(steps=2)
    write_trace(path, recs)
    proc = follow_json(tmp_path)
    try:
        first = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert first["header"]["steps_traced"] == 2
        with open(path, "a") as fh:
            for r in fc_bypass_records(steps=1)[3:]:
                fh.write(r.model_dump_json() + "\n")  # type: ignore[attr-defined]
        codes: set[str] = set()
        while "fc_bypass" not in codes:  # the append may arrive over more than one poll
            codes = {f["code"] for f in json.loads(proc.stdout.readline())["findings"]}  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # a loaded CI machine may starve it for seconds
    assert proc.returncode == 0 and "Traceback" not in err


@needs_tmux
def test_tmux_colour_and_no_color(bug1: Path) -> None:
    colour = re.compile(r"\x1b\[[0-9;]*(3[0-7]|38;[0-9;]+)m")  # a foreground colour, in any form tmux writes
    with Tmux("color") as t:
        t.send("clear; " + _shell_cmd(str(bug1), "--no-pager", "--finding", "fc_bypass") + "; echo EXIT=$?", "Enter")
        t.wait_for(r"EXIT=\d")
        coloured = subprocess.run(t.sock + ["capture-pane", "-e", "-p", "-t", t.name], capture_output=True, text=True).stdout
        # Its own marker: on a loaded machine the first run's EXIT= stays on screen until `clear` runs.
        t.send(
            "clear; export NO_COLOR=1; " + _shell_cmd(str(bug1), "--no-pager", "--finding", "fc_bypass") + "; echo PLAIN_EXIT=$?", "Enter"
        )
        t.wait_for(r"PLAIN_EXIT=\d")
        plain_screen = subprocess.run(t.sock + ["capture-pane", "-e", "-p", "-t", t.name], capture_output=True, text=True).stdout
    assert colour.search(coloured), "a terminal should get colours"
    assert "fc_bypass" in plain_screen and not colour.search(plain_screen)


def test_folder_of_scenario_folders_points_one_level_down(healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "demo"
    shutil.copytree(healthy, root / "healthy")
    assert view_main([str(root), "--no-pager"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "its subfolders do: healthy (view one of them)" in err


def test_view_states_what_spectrace_own_serving_hooks_cost(tmp_path: Path, capsys) -> None:
    """The stats record's hook accounting becomes one header line: us per hook call and per verify step."""
    from spectrace.recorder import Recorder
    from spectrace.records import Acceptance
    from spectrace.settings import Settings

    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name="trace-h-rank0.jsonl", rank=0)
    for step in range(40):
        rec.emit(Acceptance(step=step, accept_lengths=[2, 1], draft_tokens=3, accepted_per_position=[1, 0, 0]))
    rec.counters.hook_calls, rec.counters.hook_seconds = 200, 0.001  # 5 us per call, 25 us per step
    rec.counters.hook_seconds_by_feature = {"graph_replay": 0.0002, "acceptance": 0.0008}
    rec.counters.hook_slow_seconds_by_feature = {"acceptance": 0.0004}  # 10 us per step in slow calls
    rec.close()
    assert view_main([str(tmp_path), "--no-pager"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the panel wraps the line
    assert "spectrace's own host time: 5.0 us per hook call in steady state (200 calls), 25.0 us per verify step" in out
    assert "(10.0 of it in calls over 100 us" in out
    assert "us per verify step by hook: acceptance 20.0, graph_replay 5.0" in out
    assert view_main([str(tmp_path), "--json"]) == 0
    header = json.loads(capsys.readouterr().out)["header"]
    assert (header["hook_calls"], header["hook_us_per_call"], header["hook_us_per_verify_step"]) == (200, 5.0, 25.0)
    assert header["hook_us_per_verify_step_in_slow_calls"] == 10.0
    # Split by feature, largest first, so the costly hook is named.
    assert list(header["hook_us_per_verify_step_by_feature"].items()) == [("acceptance", 20.0), ("graph_replay", 5.0)]
    # Acceptance records carry no time: no span is claimed (it used to print "span 0.0 s").
    assert header["span_s"] is None and "span" not in out


def test_view_says_start_up_apart_from_the_steady_state_hook_cost(tmp_path: Path, capsys) -> None:
    """A live server's aux-concat hook spends ~27 ms in its first calls at graph capture:
    paid once, so it is said apart and never averaged into the per-call figure."""
    from spectrace.recorder import Recorder
    from spectrace.records import Acceptance
    from spectrace.settings import Settings

    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name="trace-h-rank0.jsonl", rank=0)
    for step in range(40):
        rec.emit(Acceptance(step=step, accept_lengths=[2, 1], draft_tokens=3, accepted_per_position=[1, 0, 0]))
    rec.account_hook(0.027, "aux_concat@startup", calls=2)  # graph capture: start-up
    rec.account_hook(0.0008, "aux_concat", calls=160)  # 5 us a call, 20 us a verify step
    rec.close()
    assert view_main([str(tmp_path), "--no-pager"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the panel wraps the line
    assert "5.0 us per hook call in steady state (160 calls), 20.0 us per verify step" in out
    assert "start-up, paid once: 27.0 ms in 2 calls" in out
    assert "aux_concat@startup" not in out  # no start-up in the per-step split
    assert view_main([str(tmp_path), "--json"]) == 0
    header = json.loads(capsys.readouterr().out)["header"]
    assert (header["hook_us_per_call"], header["hook_startup_calls"], header["hook_startup_ms"]) == (5.0, 2, 27.0)
    assert header["hook_us_per_verify_step_by_feature"] == {"aux_concat": 20.0}

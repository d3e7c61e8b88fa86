"""The viewer against hostile traces: bounded memory, clean errors, no terminal injection,
and ``--follow`` across a rotated or truncated file.

Real parts only: generated traces of tens of MB measured with ``getrusage`` in a child
process, a real FIFO, a real ``tmux``, real subprocesses. The hypothesis cases follow
test_reliability_fuzz.py (``RELIABILITY_FUZZ_EXAMPLES`` sets the examples per test).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrace.cli.diff import main as diff_main
from spectrace.cli.view import main as view_main
from spectrace.records import Acceptance, Call, Capture, Finding, TensorMeta, TensorStats, Weights
from spectrace.viewers import loader
from spectrace.viewers.loader import TraceFollower, load_traces
from spectrace.viewers.terminal import printable
from tests.helpers import paths
from tests.helpers.traces import T0, fc_bypass_records, header, healthy_records, write_trace
from tests.viewers.test_viewer import REPO, TRACE, Tmux, _shell_cmd, follow_json, needs_tmux

FUZZ = settings(max_examples=int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "500")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
# What no terminal may receive from a trace: C0 but newline, DEL, C1 (0x9b is CSI).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
SGR = re.compile("\x1b\\[[0-9;]*m")  # rich's own colours, in a coloured run


def _run(main: Any, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _lines(records: list[Any]) -> str:
    return "".join(r.model_dump_json() + "\n" for r in records)


def _clean(err: str, prog: str = "spectrace view") -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert all(line.startswith(f"{prog}: ") for line in err.splitlines()), err


# ===================================================================== 7. memory
# The peak of this process's own memory: VmHWM. (ru_maxrss is carried over exec from the
# forking parent, so a child of a big pytest worker would report the worker's peak.)
MEM_CHILD = """
import contextlib, io, sys
from spectrace.cli.view import main as view_main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = view_main(sys.argv[1:])
with open("/proc/self/status") as fh:
    hwm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
print(code, hwm_kb // 1024, repr(err.getvalue()))
"""


def _peak_rss_mb(path: Path, *args: str) -> tuple[int, int, str]:
    """Exit code, peak RSS (MB) and stderr of ``spectrace view PATH --json`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="")
    out = subprocess.run(
        [sys.executable, "-c", MEM_CHILD, str(path), "--json", *args], capture_output=True, text=True, env=env, timeout=300
    ).stdout.split(" ", 2)
    return int(out[0]), int(out[1]), eval(out[2])  # noqa: S307 - our own child's repr()


def _write_mb(path: Path, mb: int, line_of: Any, head: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fh.write(head)
        i, size = 0, len(head)
        while size < mb << 20:
            line = line_of(i) + "\n"
            fh.write(line)
            size += len(line)
            i += 1


def _acceptance_line(i: int) -> str:
    lengths = [1 + (i + j) % 5 for j in range(16)]
    return json.dumps(
        {"type": "acceptance", "step": i, "accept_lengths": lengths, "draft_tokens": 4, "accepted_per_position": [12, 8, 4, 1]}
    )


def _finding_line(i: int) -> str:
    code = ("fc_bypass", "acceptance_collapse", "feature_skew")[i % 3]
    return json.dumps({"type": "finding", "code": code, "severity": "error", "message": f"seen at step {i} " + "x" * 200,
                       "module": f"draft.model.layer{i % 7}", "evidence": {"seen_width": 64, "i": i}, "fix": "y" * 80, "step": i})  # fmt: skip


_CALLS = [r.model_dump_json() for r in healthy_records(steps=4) if getattr(r, "type", "") == "call"]


def _call_line(i: int) -> str:
    return _CALLS[i % len(_CALLS)].replace('"step":', f'"step":{i // len(_CALLS)},"x":', 1)


@pytest.mark.parametrize(
    ("kind", "files", "line_of"),
    [("acceptance", 1, _acceptance_line), ("findings", 1, _finding_line), ("calls in a folder of 4 files", 4, _call_line)],
)
def test_memory_does_not_grow_with_the_trace(tmp_path: Path, kind: str, files: int, line_of: Any) -> None:
    """A 20 MB and an 80 MB trace (in all) peak at nearly the same RSS; before, acceptance
    took 14x its size, findings 4.5x, a folder of calls 12x."""
    head = header().model_dump_json() + "\n"
    peaks = {}
    for total in (20, 80):
        folder = tmp_path / f"{total}mb"
        for n in range(files):
            _write_mb(folder / f"trace-node1-{n}-rank{n}.jsonl", total // files, line_of, head.replace('"rank":0', f'"rank":{n}'))
        code, peaks[total], err = _peak_rss_mb(folder)
        assert code == 0, err
        _clean(err)
    growth = peaks[80] - peaks[20]
    # 60 MB more trace: at 4.5-14x per byte that was 270-840 MB more; bounded state adds little.
    assert growth < 40, f"{kind}: peak RSS {peaks[20]} MB at 20 MB of trace, {peaks[80]} MB at 80 MB"
    assert peaks[80] < 400, peaks


def test_every_kind_past_the_budget_is_counted_with_its_line(tmp_path: Path) -> None:
    """What the budget leaves out is counted per kind, with its first line number; the
    findings past it are still counted in their group."""
    path = tmp_path / TRACE
    _write_mb(path, 30, lambda i: _finding_line(i) if i % 4 == 0 else _call_line(i), header().model_dump_json() + "\n")
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    assert code == 0
    _clean(err)
    assert re.search(
        r"\d+ records not loaded: the viewer's memory budget \(16 MB of records\) is spent \(first at line \d+\): \d+ call", err
    )
    assert re.search(r"\d+ findings kept as counts only .*\(first at line \d+\)", err)
    view = json.loads(out)
    lines = sum(1 for _ in open(path)) - 1
    assert sum(g["count"] for g in view["findings"]) == (lines + 3) // 4  # every finding counted, kept or not


def test_a_billion_draft_tokens_allocate_nothing(tmp_path: Path) -> None:
    """A 604-byte trace claiming draft_tokens 10^9 took 23.8 GB (``[0] * k``); now the
    record is skipped and named by its line. The child runs under a 1 GB address-space
    limit, so a regression fails here instead of exhausting the machine."""
    bad = {"type": "acceptance", "step": 1, "accept_lengths": [2], "draft_tokens": 1_000_000_000, "accepted_per_position": [1]}
    path = write_trace(tmp_path / TRACE, [header()])
    with open(path, "a") as fh:
        fh.write(json.dumps(bad) + "\n")
    assert path.stat().st_size < 700
    child = "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n" + MEM_CHILD
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="")
    out = subprocess.run([sys.executable, "-c", child, str(path), "--json"], capture_output=True, text=True, env=env, timeout=60)
    code, _rss, err = out.stdout.split(" ", 2)
    assert code == "0", out.stderr
    assert "1 record with an impossible value skipped (first at line 2): acceptance: draft_tokens 1000000000" in eval(err)  # noqa: S307


# ================================================================ 8. clean errors
def test_accept_lengths_empty_is_shown_not_an_internal_error(tmp_path: Path) -> None:
    write_trace(tmp_path / TRACE, [header(), Acceptance(step=3, accept_lengths=[], draft_tokens=4)])
    code, out, err = _run(view_main, [str(tmp_path), "--no-pager"])
    assert code == 0 and err == ""
    assert "Acceptance  no requests in the acceptance records, k=4" in out
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    acc = json.loads(out)["acceptance"]
    assert code == 0 and acc["overall_mean"] is None and acc["requests"] == 0 and acc["draft_tokens"] == 4


@pytest.mark.parametrize("started", ["NaN", "Infinity", "-Infinity", "1e20", "-1e15", "-1"])
def test_a_header_time_that_is_no_date_fails_no_folder(tmp_path: Path, started: str) -> None:
    """One file's header says started_unix NaN (or inf, 1e20, -1e15): the folder still shows
    both processes, and that file is named with the line."""
    write_trace(tmp_path / TRACE, healthy_records(steps=2))
    bad = header(pid=5, rank=1).model_dump_json().replace(f'"started_unix":{T0}', f'"started_unix":{started}')
    assert started in bad
    (tmp_path / "trace-node1-5-rank1.jsonl").write_text(bad + "\n" + _lines(healthy_records(steps=2)[1:]))
    for args in (["--no-pager"], ["--json"]):
        code, out, err = _run(view_main, [str(tmp_path), *args])
        assert code == 0, err
        _clean(err)
        assert "trace-node1-5-rank1.jsonl: 1 time stamp that is no date ignored (first at line 1): header.started_unix" in err
    view = json.loads(out)
    assert [p["pid"] for p in view["header"]["processes"]] == [4242, 5]
    assert view["header"]["started"] == "2025-11-30 10:53:20 UTC"  # the good file's start


def test_an_accept_length_of_ten_to_the_400_is_skipped_with_its_line(tmp_path: Path) -> None:
    path = write_trace(tmp_path / TRACE, [header(), Acceptance(step=1, accept_lengths=[2, 3], draft_tokens=4)])
    with open(path, "a") as fh:
        fh.write('{"type":"acceptance","step":2,"accept_lengths":[1' + "0" * 400 + '],"draft_tokens":4}\n')
        fh.write(Acceptance(step=3, accept_lengths=[4], draft_tokens=4).model_dump_json() + "\n")
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    assert code == 0
    assert "1 record with an impossible value skipped (first at line 3): acceptance: an integer of 401 digits" in err
    acc = json.loads(out)["acceptance"]
    assert acc["steps"] == [1, 3] and acc["overall_mean"] == 3.0


@pytest.mark.parametrize("std", [5e-324, 2.2250738585072014e-308 / 3, 1e-310])
def test_subnormal_statistics_view_and_diff(tmp_path: Path, std: float) -> None:
    recs = healthy_records(steps=3)
    text = re.sub(r'"std":[0-9.e-]+', f'"std":{std!r}', _lines(recs))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / TRACE).write_text(text)
    write_trace(tmp_path / "good" / TRACE, recs)
    for main, argv in (
        (view_main, [str(tmp_path / "sub"), "--no-pager", "--modules"]),
        (view_main, [str(tmp_path / "sub"), "--json"]),
        (diff_main, [str(tmp_path / "good"), str(tmp_path / "sub")]),
        (diff_main, [str(tmp_path / "sub"), str(tmp_path / "good"), "--json"]),
    ):
        code, out, err = _run(main, argv)
        assert code in (0, 1) and out, err
        _clean(err, "spectrace view" if main is view_main else "spectrace diff")


def test_a_fifo_as_the_path_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO named as the trace used to hang ``spectrace view`` forever (open blocks for a writer)."""
    fifo = tmp_path / TRACE
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="")
    proc = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(fifo), "--no-pager"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"spectrace view: error: {fifo}: not a regular file (a FIFO); skipped"
    # Among good files in a folder, or read by the loader itself: skipped, the rest shown.
    write_trace(tmp_path / "trace-node1-5-rank1.jsonl", healthy_records(steps=2))
    ts = load_traces(fifo)
    assert [p.kind for p in ts.problems] == ["not_regular"] and not ts.readable
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    assert code == 0 and json.loads(out)["header"]["processes"][0]["pid"] == 4242


def test_a_device_is_refused_without_a_read(tmp_path: Path) -> None:
    ts = load_traces("/dev/zero")
    # The path as given: its last part alone ("zero") would not say which file it was.
    assert [p.message for p in ts.problems] == ["/dev/zero: not a regular file (a device); skipped"]


def test_a_bad_record_is_skipped_and_the_rest_of_the_folder_shown(tmp_path: Path) -> None:
    """Impossible sizes in each kind of record: each skipped, counted with its line, the rest read."""
    good = healthy_records(steps=2)
    write_trace(tmp_path / TRACE, good)
    bad = [
        {"type": "call", "step": 1, "seq": 1, "module": "m", "module_type": "Linear",
         "outputs": [{"arg": "output", "shape": [2**40, 2**40, 2**40], "dtype": "f32", "device": "cpu"}]},
        {"type": "call", "step": 1, "seq": 2, "module": "m", "module_type": "Linear", "tokens": -3},
        {"type": "acceptance", "step": 1, "accept_lengths": [-1], "draft_tokens": 4},
        {"type": "acceptance", "step": 1, "accept_lengths": [1], "draft_tokens": 4, "accepted_per_position": [-5]},
        {"type": "capture", "module": "t", "num_layers": -1, "hidden_size": 64, "rule": "r"},
        {"type": "coverage", "kind": "dropped", "detail": "d", "count": -9},
        {"type": "finding", "code": "c", "severity": "error", "message": "m", "fix": "f", "evidence": {"n": 10**30}},
    ]  # fmt: skip
    (tmp_path / "trace-node1-5-rank1.jsonl").write_text(_lines([header(pid=5, rank=1)]) + "".join(json.dumps(b) + "\n" for b in bad))
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    assert code == 0
    _clean(err)
    assert "trace-node1-5-rank1.jsonl: 7 records with impossible values skipped (first at line 2)" in err
    view = json.loads(out)
    assert len(view["header"]["processes"]) == 2 and view["acceptance"]["requests"] == 8


# ================================================================ 9. terminal injection
NASTY = "\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J\x9b31m\r\x08\u202e\x00"


def _hostile_trace(folder: Path, name: str = TRACE) -> Path:
    h = header().model_copy(update={"host": "node" + NASTY})
    t = TensorMeta(
        arg="output" + NASTY,
        shape=[4, 64],
        dtype="torch.bf16" + NASTY,
        device="cpu",
        stats=TensorStats(mean=0.0, std=1.0, absmax=3.0, numel=256),
    )
    recs: list[Any] = [
        h,
        Capture(module="target" + NASTY, boundaries=[1, 2], num_layers=4, hidden_size=64, rule="rule" + NASTY),
        Weights(module="draft" + NASTY, offered=["d2t"], written=["d2t"]),
        Call(step=0, seq=0, module="draft.fc" + NASTY, module_type="Linear" + NASTY, role="draft.fc", outputs=[t], inputs=[t]),
        Call(step=0, seq=1, module="[/bold][red]markup" + NASTY, module_type="X", outputs=[t]),
        Finding(code="fc_bypass" + NASTY, severity="error", message="msg" + NASTY, module="draft.fc" + NASTY,
                evidence={"k" + NASTY: "v" + NASTY}, fix="fix" + NASTY, step=0),
        Acceptance(step=0, accept_lengths=[2], draft_tokens=4),
    ]  # fmt: skip
    path = write_trace(folder / name, recs)
    with open(path, "ab") as fh:
        fh.write(b"not json " + NASTY.encode() + b"\n")  # a load problem on stderr
    return path


def _assert_no_raw_control(text: str, coloured: bool = False) -> None:
    if coloured:
        text = SGR.sub("", text)
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw {found.group()!r} reached the terminal near {text[max(0, found.start() - 40) : found.end() + 10]!r}"
    assert "\u202e" not in text


def test_view_escapes_every_control_character_and_json_stays_exact(tmp_path: Path) -> None:
    _hostile_trace(tmp_path, "trace-\x1b[2J-1.jsonl")
    code, out, err = _run(view_main, [str(tmp_path), "--no-pager", "--modules"])
    assert code == 0
    _assert_no_raw_control(out)
    _assert_no_raw_control(err)
    assert "\\x1b]52;c;ZWNobyBvd25lZA==" in out and "\\x9b31m" in out and "\\u202e" in out
    assert "[/bold][red]mark" in out  # markup in a name is shown, not read (it was a MarkupError)
    assert "trace-\\x1b[2J-1.jsonl: 1 undecodable line" in err
    code, out, err = _run(view_main, [str(tmp_path), "--json"])
    view = json.loads(out)
    assert view["findings"][0]["code"] == "fc_bypass" + NASTY and view["header"]["processes"][0]["host"] == "node" + NASTY


def test_coloured_view_and_diff_on_a_terminal_escape_control_characters(tmp_path: Path) -> None:
    """With colours on (FORCE_COLOR, as on a terminal), only rich's own SGR codes are raw."""
    _hostile_trace(tmp_path / "a")
    write_trace(tmp_path / "b" / TRACE, healthy_records(steps=2))
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="", FORCE_COLOR="1", COLUMNS="100")
    env.pop("NO_COLOR", None)
    for argv in (["view", str(tmp_path / "a"), "--no-pager", "--modules"], ["diff", str(tmp_path / "a"), str(tmp_path / "b")]):
        proc = subprocess.run([sys.executable, "-m", "spectrace", *argv], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode in (0, 1), proc.stderr
        assert SGR.search(proc.stdout), "colours expected"
        _assert_no_raw_control(proc.stdout, coloured=True)
        _assert_no_raw_control(proc.stderr)
        assert "\\x1b]52;c;" in proc.stdout


def test_diff_escapes_module_names(tmp_path: Path) -> None:
    _hostile_trace(tmp_path / "a")
    write_trace(tmp_path / "b" / TRACE, healthy_records(steps=2))
    code, out, err = _run(diff_main, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert code == 1
    _assert_no_raw_control(out + err)
    assert "draft.fc\\x1b]52;c;" in out
    code, out, _ = _run(diff_main, [str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert any(d["where"] == "draft.fc" + NASTY for d in json.loads(out)["differences"])


def test_audit_text_output_and_errors_are_escaped(tmp_path: Path) -> None:
    """Tensor names in a checkpoint reach the audit's table and messages; a path reaches its error line."""
    import struct

    fixture = paths.FIXTURES / "specforge_tiny"
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text((fixture / "config.json").read_text())
    blob = (fixture / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    meta = json.loads(blob[8 : 8 + n])
    name = next(k for k in meta if k != "__metadata__")
    meta["evil" + NASTY] = meta.pop(name)  # an unexpected tensor, and a missing one
    head = json.dumps(meta).encode()
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + blob[8 + n :])
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="", FORCE_COLOR="1", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "spectrace", "audit", str(draft)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    _assert_no_raw_control(proc.stdout, coloured=True)
    assert "evil\\x1b]52;c;" in proc.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    proc = subprocess.run(
        [sys.executable, "-m", "spectrace", "audit", str(tmp_path / ("gone" + NASTY.replace("\x00", "")))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    _assert_no_raw_control(proc.stderr)
    assert "gone\\x1b]52;c;" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "spectrace", "audit", str(draft), "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert "evil" + NASTY in json.loads(proc.stdout)["checkpoint"]["tensors"]  # --json stays exact


def test_names_that_are_not_utf8_or_lone_surrogates_break_neither_stderr_nor_json(tmp_path: Path) -> None:
    """A file name that is not UTF-8 was written to stderr as nothing (the write raised) and
    failed ``--json``; a ``"\\ud800"`` in a record failed ``--json``."""
    write_trace(tmp_path / os.fsdecode(b"trace-\xff-1.jsonl"), healthy_records(steps=2))
    (tmp_path / os.fsdecode(b"trace-\xfe-2.jsonl")).write_bytes(b"junk\n")
    with open(tmp_path / os.fsdecode(b"trace-\xff-1.jsonl"), "a") as fh:
        fh.write('{"type":"call","step":5,"seq":9,"module":"m\\ud800","module_type":"X"}\n')
        fh.write('{"type":"\\udcff"}\n')
    for args in (["--no-pager"], ["--json"]):
        code, out, err = _run(view_main, [str(tmp_path), *args])
        assert code == 0 and out
        _clean(err)
        assert "trace-\\xfe-2.jsonl: not a spectrace trace" in err
        assert "1 record with an impossible value skipped (first at line " in err and "a string with a lone surrogate" in err
    view = json.loads(out)
    assert "trace-\\xff-1.jsonl" in [p["file"] for p in view["header"]["processes"]]
    assert any("'\\\\udcff' x1" in line for line in view["header"]["load_problems"])


def test_printable_is_idempotent_and_keeps_text() -> None:
    assert printable("model.layers.0.fc ü 日本 ✓\n\t") == "model.layers.0.fc ü 日本 ✓\n\t"
    once = printable(NASTY + "\ud800")
    assert printable(once) == once and RAW_CONTROL.search(once) is None and "\\ud800" in once


_hostile_text = st.text(
    alphabet=st.one_of(st.characters(max_codepoint=0x2100), st.sampled_from(["\x1b", "\x9b", "\x07", "\r", "\x00", "\u202e", "["])),
    max_size=30,
)


@FUZZ
@given(host=_hostile_text, module=_hostile_text, code=_hostile_text, message=_hostile_text, fix=_hostile_text, ev=_hostile_text)
def test_any_string_in_a_trace_reaches_the_terminal_escaped(tmp_path_factory, host: str, module: str, code: str, message: str, fix: str, ev: str) -> None:  # fmt: skip
    folder = tmp_path_factory.mktemp("inject")
    t = TensorMeta(arg="output", shape=[2, 3], dtype="torch.float32", device="cpu", stats=TensorStats(mean=0.0, std=1.0, absmax=2.0))
    write_trace(
        folder / TRACE,
        [
            header().model_copy(update={"host": host}),
            Call(step=0, seq=0, module=module, module_type=module, outputs=[t]),
            Finding(code=code, severity="warning", message=message, module=module, fix=fix, evidence={ev: ev}),
        ],
    )
    code_, out, err = _run(view_main, [str(folder), "--no-pager", "--modules"])
    assert code_ == 0
    _clean(err)
    _assert_no_raw_control(out + err)
    code_, out, _ = _run(view_main, [str(folder), "--json"])
    view = json.loads(out)
    assert view["header"]["processes"][0]["host"] == host and view["findings"][0]["message"] == message


# ======================================================== hostile values, fuzzed
_extreme_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, -5e-324, 1e-310, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0, 1e20, -1e15]),
)
_big_int = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 10**400, 2**63, 2**63 + 1, 10**9]))


def _json_num(x: float | int) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x)


@FUZZ
@given(
    started=_extreme_float,
    t_unix=_extreme_float,
    std=_extreme_float,
    mean=_extreme_float,
    absmax=_extreme_float,
    numel=_big_int,
    dim=_big_int,
    lengths=st.lists(_big_int, max_size=4),
    draft_tokens=_big_int,
    positions=st.lists(_big_int, max_size=5),
    hook_seconds=_extreme_float,
)
def test_hostile_values_never_fail_view_or_diff(tmp_path_factory, started, t_unix, std, mean, absmax, numel, dim, lengths, draft_tokens, positions, hook_seconds) -> None:  # fmt: skip
    """Schema-valid records with any number: view (text and JSON) and diff give a result or
    one line, never an internal error, and the good file beside them is always shown."""
    folder = tmp_path_factory.mktemp("values")
    write_trace(folder / TRACE, healthy_records(steps=2))
    stats = f'{{"mean":{_json_num(mean)},"std":{_json_num(std)},"absmax":{_json_num(absmax)},"nan":0,"inf":0,"numel":{numel}}}'
    tensor = f'{{"arg":"output","shape":[4,{dim}],"dtype":"torch.bfloat16","device":"cpu","stats":{stats}}}'
    lines = [
        header(pid=5, rank=1).model_dump_json().replace(f'"started_unix":{T0}', f'"started_unix":{_json_num(started)}'),
        f'{{"type":"call","step":0,"seq":0,"module":"draft.model.fc","module_type":"Linear","role":"draft.fc","inputs":[{tensor}],"outputs":[{tensor}],"t_unix":{_json_num(t_unix)}}}',
        f'{{"type":"call","step":1,"seq":1,"module":"target.model.aux_concat","module_type":"AuxConcat","outputs":[{tensor.replace(chr(34) + "output" + chr(34), chr(34) + "output.chunk[0]" + chr(34))}]}}',
        f'{{"type":"fingerprint","module":"draft","chunk_width":64,"chunks":[{stats},{stats}]}}',
        f'{{"type":"acceptance","step":1,"accept_lengths":{json.dumps(lengths)},"draft_tokens":{draft_tokens},"accepted_per_position":{json.dumps(positions)}}}',
        f'{{"type":"finding","code":"fc_bypass","severity":"error","message":"m","fix":"f","step":1,"t_unix":{_json_num(t_unix)},"evidence":{{"seen_width":{dim}}}}}',
        f'{{"type":"counters","hook_calls":3,"hook_seconds":{_json_num(hook_seconds)},"hook_seconds_by_feature":{{"a":{_json_num(hook_seconds)}}}}}',
    ]  # fmt: skip
    (folder / "trace-node1-5-rank1.jsonl").write_text("\n".join(lines) + "\n")
    for argv in ([str(folder), "--no-pager", "--modules"], [str(folder), "--json"], [str(folder), "--json", "--step", "1"]):
        code, out, err = _run(view_main, argv)
        assert code == 0, err
        _clean(err)
    assert json.loads(out)["header"]["processes"][0]["pid"] == 4242
    good = tmp_path_factory.mktemp("good")
    write_trace(good / TRACE, healthy_records(steps=2))
    for argv in ([str(good), str(folder)], [str(folder), str(good), "--json"]):
        code, out, err = _run(diff_main, argv)
        assert code in (0, 1), err
        _clean(err, "spectrace diff")


# ======================================================================= 10. follow
def _rotate(path: Path, records: list[Any]) -> None:
    """logrotate's default: the old file moves away, a new one takes the name (a new inode)."""
    os.rename(path, path.with_suffix(".1"))
    write_trace(path, records)


def test_follower_reads_a_rotated_file_from_the_start(tmp_path: Path) -> None:
    path = write_trace(tmp_path / TRACE, fc_bypass_records(steps=4))
    follower = TraceFollower(tmp_path)
    follower.poll()
    assert {f.code for f in follower.trace_set.files[0].findings} >= {"fc_bypass"}
    # The new file is longer than the old offset: an offset check alone missed it.
    _rotate(path, healthy_records(steps=12))
    assert path.stat().st_size > follower.readers[str(path)].offset
    assert follower.poll()
    f = follower.trace_set.files[0]
    assert f.findings == [] and len(f.calls) == 12 * 5 and f.header is not None and f.header.pid == 4242
    assert follower.notices == [f"rotated: {TRACE} read again from the start"]
    assert not follower.poll() and len(follower.notices) == 1  # said once


def test_follower_reads_a_truncated_and_regrown_file_from_the_start(tmp_path: Path) -> None:
    """copytruncate: the same inode cut to 0 and written again, longer than before, by the next poll."""
    path = write_trace(tmp_path / TRACE, fc_bypass_records(steps=2))
    follower = TraceFollower(tmp_path)
    follower.poll()
    inode = path.stat().st_ino
    with open(path, "r+") as fh:
        fh.truncate(0)
        fh.write(_lines(healthy_records(steps=12)))
    assert path.stat().st_ino == inode and path.stat().st_size > follower.readers[str(path)].offset
    follower.poll()
    f = follower.trace_set.files[0]
    assert f.findings == [] and len(f.calls) == 60 and f.problems == []
    assert follower.notices == [f"rewritten: {TRACE} read again from the start"]
    with open(path, "r+") as fh:  # now cut short: nothing new yet
        fh.truncate(0)
    follower.poll()
    assert follower.trace_set.files[0].record_count == 0
    assert follower.notices[-1] == f"truncated: {TRACE} read again from the start"


def test_follow_json_stream_across_rotation_and_truncation(tmp_path: Path) -> None:
    """``--follow --json`` into a pipe: after a rotation the state is the new file's alone,
    and stderr says so once."""
    path = write_trace(tmp_path / TRACE, fc_bypass_records(steps=2))
    proc = follow_json(tmp_path, SPECTRACE="")
    try:
        first = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert "fc_bypass" in {f["code"] for f in first["findings"]}
        _rotate(path, healthy_records(steps=12))
        state = first
        for _ in range(200):  # bounded: each line is one refresh
            state = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            if state["header"]["steps_traced"] == 12:
                break
        assert state["findings"] == [] and state["header"]["steps_traced"] == 12
        with open(path, "r+") as fh:
            fh.truncate(0)
            fh.write(_lines(fc_bypass_records(steps=12)))
        for _ in range(200):
            state = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            if state["findings"]:
                break
        assert "fc_bypass" in {f["code"] for f in state["findings"]} and state["header"]["steps_traced"] == 12
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    _clean(err)
    assert err.count(f"rotated: {TRACE} read again from the start") == 1
    # Cut and written again: a poll between the two sees it shorter, a later one changed.
    assert len(re.findall(r"(truncated|rewritten): \S+ read again from the start", err)) == 1


@needs_tmux
def test_tmux_follow_across_rotation_and_truncation(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "live" / TRACE, fc_bypass_records(steps=2))
    with Tmux("rotate") as t:
        t.send(_shell_cmd(str(path.parent), "--follow", "--interval", "0.1") + "; echo EXIT=$?", "Enter")
        t.wait_for("fc_bypass")
        _rotate(path, healthy_records(steps=12))
        screen = t.wait_for(r"read again from the start")
        assert f"rotated: {TRACE} read again from the start" in screen
        screen = t.wait_for(r"steps 0\.\.11 ")  # every step traced: no "(N traced)"
        assert "fc_bypass" not in screen and "Findings: none" in screen
        time.sleep(0.3)
        with open(path, "r+") as fh:  # truncated and regrown past the old offset
            fh.truncate(0)
            fh.write(_lines(fc_bypass_records(steps=12)))
        screen = t.wait_for(f"(rewritten|truncated): {TRACE} read again from the start")
        screen = t.wait_for("fc_bypass")
        assert "ERROR" in screen
        t.send("C-c")
        assert "EXIT=0" in t.wait_for(r"EXIT=\d")
        assert "Traceback" not in t.screen(history=True)


def test_limits_are_stated() -> None:
    """The limits the docs state are the ones the loader applies."""
    doc = (REPO / "docs" / "viewer-limits.md").read_text()
    for key, value in loader.LIMITS.items():
        shown = f"{value >> 20} MB" if key.endswith("bytes") else f"{value:,}"
        assert shown in doc, (key, shown)

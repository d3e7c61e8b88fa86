"""The writer side of hardening: no trace lost to a name, and no loss without a word.

Real cases only: the repo's tiny Llama traced in-process and in server-like subprocesses
(``SPECTRACE=1``) whose output is compared with an untraced run; script names, argv and
``SPECTRACE_DIR`` holding a byte that is not UTF-8; the trace folder deleted, the file
deleted, replaced or renamed away while the process writes; every numbered name taken;
real pytest runs with ``--spectrace-dir``. RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

# Imported at collection (see tests/api/test_pytest_plugin.py): an in-process pytest run must
# not import transformers' Llama for the first time.
import transformers.models.llama.modeling_llama  # noqa: E402,F401

import spectrace  # noqa: E402
from spectrace.recorder import Recorder, safe_argv  # noqa: E402
from spectrace.records import RECORD_ADAPTER, Call, Counters, Finding, Header  # noqa: E402
from spectrace.settings import Settings  # noqa: E402
from spectrace.sinks.base import safe_text  # noqa: E402
from spectrace.sinks.jsonl import MAX_NAME_TRIES, numbered_name, trace_file_name  # noqa: E402
from tests.helpers import paths
from tests.helpers.models import tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_spectrace_env")
pytest_plugins = ["pytester"]

ROOT = paths.ROOT
PY = sys.executable
BAD = b"\xff"  # a byte that is never UTF-8

# A server-like host: builds the tiny Llama, runs forwards, prints what it computed (the
# untraced run must print the same), and does to the trace folder what argv[1] says
# halfway through (a tmp cleaner, a log rotation, another process taking the name).
HOST = textwrap.dedent(
    """
    import glob, os, shutil, sys, time
    sys.path.insert(0, {root!r})
    import torch
    from tests.helpers.models import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama()
    action = sys.argv[1] if len(sys.argv) > 1 else "none"
    folder = os.environ.get("SPECTRACE_DIR", "")
    total = 0.0
    with torch.no_grad():
        for i in range(12):
            if i == 6 and action != "none":
                time.sleep(0.4)  # past the flush interval: the first half is on disk
                files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.jsonl")))
                if action == "rmtree":
                    shutil.rmtree(folder)
                elif action == "unlink":
                    os.unlink(files[0])
                elif action == "replace":
                    os.unlink(files[0])
                    with open(files[0], "w") as planted:
                        planted.write("someone else's file\\n")
                elif action == "rename":
                    os.rename(files[0], files[0] + ".old")
            total += float(model(torch.tensor([[1, 2, 3 + i]])).logits.sum())
    print("result", round(total, 5))
    """
).format(root=str(ROOT))


def _env(**extra: str | bytes) -> dict[str, Any]:
    env: dict[str, Any] = {
        k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_")) and k not in ("RANK", "LOCAL_RANK")
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _run(script: bytes | str, *args: bytes | str, env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, script, *args], capture_output=True, text=True, errors="backslashreplace", env=env, timeout=120, cwd=str(ROOT)
    )


def _lines(path: Path | str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_bytes().decode("utf-8").splitlines()]


def _records(path: Path | str) -> list[Any]:
    # The viewer's own schema; strict UTF-8 decoding first (a lone surrogate is not UTF-8).
    return [RECORD_ADAPTER.validate_json(line) for line in Path(path).read_bytes().decode("utf-8").splitlines()]


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("spectrace: warning:")]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The host script and its untraced output (the reference every traced run must print)."""
    folder = tmp_path_factory.mktemp("host")
    script = folder / "host.py"
    script.write_text(HOST)
    plain = _run(str(script), env=_env())
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("result ")
    return script, plain.stdout


@pytest.fixture(scope="module")
def whole(host: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> int:
    """How many records (header and counters aside) a traced run of the host writes when nothing happens to its file."""
    folder = tmp_path_factory.mktemp("whole")
    _traced(host, folder)
    _, lines = _one_file(folder)
    assert lines[-1]["records_written"] == len(lines) - 2
    return len(lines) - 2


def _traced(host: tuple[Path, str], folder: Path | bytes, *args: str, script: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = _env(SPECTRACE="1", SPECTRACE_FLUSH_SECONDS="0.1")
    env["SPECTRACE_DIR"] = os.fsencode(folder)
    done = _run(script or str(host[0]), *args, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == host[1]  # the host computes what it computes untraced
    assert "Traceback" not in done.stderr
    return done


# ----------------------------------------------------------------------------- strings


def test_safe_text_is_one_convention() -> None:
    assert safe_text("plain héllo") == "plain héllo"
    assert safe_text(os.fsdecode(b"no" + BAD + b".jsonl")) == "no\\xff.jsonl"  # as `spectrace view` shows a path
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert safe_argv(["s\udcffrv.py", "--k\udcff=v", "-x", "secret\udcff"]) == ["s\\xffrv.py", "--k\\xff=<redacted>", "-x", "<redacted>"]
    assert safe_argv(["a", "v\udc80"], keep_values=True) == ["a", "v\\x80"]


@pytest.mark.slow  # a server-like subprocess (torch and transformers imported): ~15 s here
def test_non_utf8_script_folder_and_argv_keep_the_whole_trace(host: tuple[Path, str], tmp_path: Path) -> None:
    """Script name, SPECTRACE_DIR and kept argv each hold 0xff: the trace is whole, the host unchanged."""
    script = os.fsencode(tmp_path) + b"/h" + BAD + b"st.py"
    Path(os.fsdecode(script)).write_text(HOST)
    folder = os.fsencode(tmp_path) + b"/traces" + BAD
    env = _env(SPECTRACE="1", SPECTRACE_KEEP_ARGV="1")
    env["SPECTRACE_DIR"] = folder
    done = _run(script, b"none", b"--tag=" + BAD, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == host[1]
    assert "Traceback" not in done.stderr and "failed" not in done.stderr
    (path,) = Path(os.fsdecode(folder)).glob("*.jsonl")
    records = _records(path)
    header = records[0]
    assert isinstance(header, Header)
    assert header.argv[1:] == ["none", "--tag=\\xff"]
    assert header.argv[0].endswith("/h\\xffst.py")
    assert header.settings["dir"].endswith("/traces\\xff")
    counters = records[-1]
    assert isinstance(counters, Counters)
    calls = [r for r in records if isinstance(r, Call)]
    assert calls and counters.records_written == len(records) - 2  # every record counted is in the file
    assert counters.records_dropped == 0 and counters.sink_errors == 0 and counters.internal_errors == 0
    # The view reads the writer's file and names it by the same convention.
    view = subprocess.run(
        [PY, "-m", "spectrace", "view", "--json", os.fsencode(path)], capture_output=True, env=_env(), timeout=120, cwd=str(ROOT)
    )
    assert view.returncode == 0, view.stderr
    assert b"\\xff" in view.stdout


def test_trace_api_with_non_utf8_names_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``spectrace.trace()`` in a program whose argv and folder are not UTF-8: no exception at
    ``__exit__``, outputs unchanged, every call in the file."""
    monkeypatch.setattr(sys, "argv", [os.fsdecode(b"run" + BAD + b".py"), os.fsdecode(b"--out=" + BAD)])
    model = tiny_llama()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        plain = model(ids).logits
        folder = os.fsdecode(os.fsencode(tmp_path) + b"/t" + BAD)
        with spectrace.trace(model, directory=folder) as t:
            traced = model(ids).logits
    assert torch.equal(plain, traced)
    assert t.path is not None
    records = _records(t.path)
    assert records[0].argv == ["run\\xff.py", "--out=<redacted>"]
    assert sum(isinstance(r, Call) for r in records) == len(t.calls()) > 0
    assert records[-1].records_written == len(records) - 2  # header and counters aside
    assert t.recorder.counters.internal_errors == 0


def test_one_record_that_cannot_be_written_costs_only_itself(tmp_path: Path) -> None:
    """A record no encoder takes is counted and dropped; the header, the records around it
    and the counters all reach the file. A string with a surrogate is written escaped."""
    recorder = Recorder(Settings(), directory=str(tmp_path))
    recorder.emit(Finding(code="a", severity="info", message="before", fix=""))
    recorder.emit(Finding(code="b", severity="info", message="x", fix="", evidence={"what": object()}))
    recorder.emit(Finding(code="c", severity="info", message="name \udcff", fix="", module="m\udcff"))
    recorder.close()
    assert recorder.path is not None
    records = _records(recorder.path)
    assert [type(r).__name__ for r in records] == ["Header", "Finding", "Finding", "Counters"]
    assert [r.code for r in records if isinstance(r, Finding)] == ["a", "c"]
    assert records[2].module == "m\\xff" and records[2].message == "name \\xff"
    counters = records[-1]
    assert counters.records_written == 2 and counters.records_dropped == 1
    assert counters.dropped_by_reason == {"record build": 1}


def test_trace_exit_never_raises_on_its_own_io(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A trace folder that is a file: the ``with`` block ends normally, the failure counted
    and said once; the user's own exception still propagates unchanged."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model, directory=str(blocker / "traces")) as t:
        model(torch.tensor([[1, 2]]))
    assert t.recorder.counters.sink_errors >= 1 and t.path is None
    err = capfd.readouterr().err
    assert len([w for w in _warnings(err) if "sink error" in w]) == 1
    with pytest.raises(KeyError, match="mine"), spectrace.trace(model, directory=str(blocker / "traces")):
        raise KeyError("mine")


# ----------------------------------------------------------------------------- loss


def _one_file(folder: Path) -> tuple[Path, list[dict[str, Any]]]:
    files = sorted(folder.glob("*.jsonl"))
    assert len(files) == 1, files
    return files[0], _lines(files[0])


def _calls_counted(lines: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "counters"
    return sum(1 for r in lines if r["type"] == "call"), lines[-1]


@pytest.mark.slow  # server-like subprocesses: ~15 s each here
@pytest.mark.parametrize("action", ["rmtree", "unlink"])
def test_folder_or_file_deleted_mid_run_is_made_again_and_counted(host: tuple[Path, str], whole: int, tmp_path: Path, action: str) -> None:
    folder = tmp_path / "traces"
    done = _traced(host, folder, action)
    path, lines = _one_file(folder)
    assert (folder.stat().st_mode & 0o777) == 0o700 and (path.stat().st_mode & 0o777) == 0o600
    calls, counters = _calls_counted(lines)
    # Counted written = what the file holds; what went with the deleted file is dropped, by name.
    assert counters["records_written"] == len(lines) - 2 and calls > 0
    lost = counters["dropped_by_reason"]["file deleted"]
    assert lost > 0 and counters["records_dropped"] == lost
    assert counters["records_written"] + lost == whole  # each record either in the file or counted lost
    said = [w for w in _warnings(done.stderr) if "was deleted while tracing" in w]
    assert len(said) == 1 and f"{lost} records lost" in said[0]


@pytest.mark.slow  # a server-like subprocess (torch and transformers imported): ~15 s here
def test_file_replaced_mid_run_is_never_written_into(host: tuple[Path, str], tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    done = _traced(host, folder, "replace")
    files = sorted(folder.glob("*.jsonl"))
    planted = [f for f in files if f.read_text() == "someone else's file\n"]
    assert len(planted) == 1 and len(files) == 2  # the other file is left as it is
    (mine,) = set(files) - set(planted)
    assert mine.name == numbered_name(planted[0].name, 2)
    _, counters = _calls_counted(_lines(mine))
    assert counters["dropped_by_reason"]["file deleted"] > 0
    assert any("was deleted while tracing" in w for w in _warnings(done.stderr))


@pytest.mark.slow  # a server-like subprocess (torch and transformers imported): ~15 s here
def test_file_renamed_away_keeps_its_records_and_a_new_file_follows(host: tuple[Path, str], tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    done = _traced(host, folder, "rename")
    (old,) = folder.glob("*.jsonl.old")
    new, lines = _one_file(folder)
    before = _lines(old)
    assert before[0]["type"] == "header" and before[0] == lines[0]  # the same header, twice
    calls_new, counters = _calls_counted(lines)
    calls_old = sum(1 for r in before if r["type"] == "call")
    assert counters["records_dropped"] == 0 and calls_old > 0
    assert counters["records_written"] == len(before) - 1 + len(lines) - 2  # both files hold them all
    assert counters["calls_seen"] == calls_old + calls_new == sum(1 for r in before + lines if r["type"] == "call")
    assert any("renamed or moved away" in w for w in _warnings(done.stderr))


def test_every_numbered_name_taken_still_gives_a_unique_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A container restarted with pid 1 and the same host name, again and again."""
    first = trace_file_name()
    taken = [first] + [numbered_name(first, n) for n in range(2, MAX_NAME_TRIES + 1)]
    for name in taken:
        (tmp_path / name).write_text("an earlier run\n")
    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path)) as t:
        model(torch.tensor([[1, 2]]))
    assert t.path is not None and os.path.basename(t.path) not in taken
    assert os.path.basename(t.path).startswith(first.rsplit(".", 1)[0] + ".")
    assert all((tmp_path / name).read_text() == "an earlier run\n" for name in taken)
    records = _records(t.path)
    assert isinstance(records[0], Header) and records[-1].records_written == len(records) - 2
    assert len([w for w in _warnings(capfd.readouterr().err) if "already exists" in w]) == 1


# ----------------------------------------------------------------------------- pytest


PLUGIN = ("-p", "spectrace.pytest_plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning")

TEST_DELETES_ITS_FOLDER = """
import glob, os, shutil, sys, time
import torch
sys.path.insert(0, {root!r})
from tests.helpers.models import tiny_llama


def test_model(spectrace):
    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model) as t:
        for i in range(4):
            model(torch.tensor([[1, 2, 3 + i]]))
            if i == 1:
                t.recorder.flush()
                shutil.rmtree(os.path.dirname(t.path))  # a tmp cleaner, mid-test
"""

TEST_PLAIN = """
import sys
import torch
sys.path.insert(0, {root!r})
from tests.helpers.models import tiny_llama


def test_model(spectrace):
    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model):
        model(torch.tensor([[1, 2, 3]]))
"""


def test_pytest_summary_names_a_trace_that_lost_records(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_DELETES_ITS_FOLDER.format(root=str(ROOT)))
    result = pytester.runpytest(*PLUGIN, "--spectrace-dir", "traces")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*spectrace: traces lost or not written*", "*test_model: traces/*trace-main-1.jsonl misses * records (* file deleted)*"]
    )
    (path,) = (pytester.path / "traces").rglob("*.jsonl")
    lines = _lines(path)
    assert lines[0]["type"] == "header" and lines[-1]["records_written"] == len(lines) - 2


def test_pytest_summary_names_an_unwritable_trace_dir(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_PLAIN.format(root=str(ROOT)))
    (pytester.path / "blocked").write_text("a file where the folder should be\n")
    result = pytester.runpytest(*PLUGIN, "--spectrace-dir", "blocked/traces")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*spectrace: traces lost or not written*",
            "*test_model: no trace file written: blocked/traces/*/trace-main-1.jsonl (*Not a directory)*",
        ]
    )


def test_pytest_summary_is_silent_when_every_trace_is_whole(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_PLAIN.format(root=str(ROOT)))
    result = pytester.runpytest(*PLUGIN, "--spectrace-dir", "traces")
    result.assert_outcomes(passed=1)
    assert "traces lost" not in result.stdout.str()
    (path,) = (pytester.path / "traces").rglob("*.jsonl")
    assert _lines(path)[-1]["records_dropped"] == 0

"""Hardening of the traced process: hostile files, fork, bounds, lost spans, secrets, privacy.

Every case is real: a FIFO and other users' files at the trace's name, a symlink owned by
another user on the way to the folder, ``os.fork`` of a process that traced, settings past
every bound, a socket on 127.0.0.1 that accepts and never answers, and the repo's tiny
Llama traced with ``SPECTRACE=1``. RELIABILITY.md lists each promise with its test.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import spectrace  # noqa: E402
from spectrace import settings as settings_mod  # noqa: E402
from spectrace.recorder import Recorder  # noqa: E402
from spectrace.records import RECORD_ADAPTER, Call, Counters, Coverage, Header  # noqa: E402
from spectrace.settings import MAX_RECORD_CAP, Settings, redact_url  # noqa: E402
from spectrace.sinks.jsonl import ensure_private_dir, trace_file_name  # noqa: E402
from tests.helpers import paths
from tests.helpers.models import tiny_llama  # noqa: E402
from tests.helpers.otlp_receiver import OtlpReceiver  # noqa: E402

ROOT = paths.ROOT
PY = sys.executable
OTHER_UID = 54321  # a user that is not this one (the root-only cases chown to it)

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


def _env(**extra: str) -> dict[str, str]:
    # No SPECTRACE_* / OTEL_* of this process, and no RANK: the SGLang harness sets RANK=0 in
    # a test process, and a child that inherits it names its trace "...-rank0.jsonl".
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_")) and k not in ("RANK", "LOCAL_RANK")}
    env.update(extra)
    return env


def _records(path: Path | str) -> list[Any]:
    return [RECORD_ADAPTER.validate_json(line) for line in Path(path).read_text().splitlines()]


def _warnings(err: str, what: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("spectrace: warning:") and what in line]


@pytest.fixture(scope="module")
def small() -> tuple[Any, Any, Any]:
    model = tiny_llama(layers=2, hidden=32)
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits.clone()
    return model, ids, ref


def _bounded(target: Any, seconds: float = 60.0) -> None:
    """Run ``target`` on a thread; fail (not hang) when it has not returned in ``seconds``."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001
            failed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s: the host would hang"
    if failed:
        raise failed[0]


# ============================================================== 1. the trace file and folder
def test_fifo_at_the_trace_name_never_hangs_the_host(small, tmp_path: Path, capfd) -> None:
    """A FIFO at this process's predictable name: never opened; the trace goes to the next
    name. More than a pipe buffer (64 KiB) of records is written, which blocked before."""
    model, ids, ref = small
    folder = tmp_path / "t"
    folder.mkdir()
    fifo = folder / trace_file_name()
    os.mkfifo(fifo)
    box: dict[str, Any] = {}

    def run() -> None:
        with torch.no_grad(), spectrace.trace(model, directory=str(folder), settings=Settings(flush_seconds=0.001)) as t:
            for _ in range(60):
                assert torch.equal(model(ids).logits, ref)
        box["t"] = t

    _bounded(run)
    t = box["t"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert os.read(reader, 1) == b""  # nothing was ever written into it
    finally:
        os.close(reader)
    assert t.path == str(fifo).removesuffix(".jsonl") + ".2.jsonl"
    assert os.path.getsize(t.path) > 64 * 1024
    records = _records(t.path)
    assert isinstance(records[0], Header) and isinstance(records[-1], Counters)
    assert records[-1].sink_errors == 0 and records[-1].records_dropped == 0
    assert len(_warnings(capfd.readouterr().err, "already exists")) == 1


@pytest.mark.parametrize("kind", ["another_users", "mode_0666", "earlier_trace"])
def test_a_file_already_at_the_name_is_never_appended_to(kind: str, tmp_path: Path, capfd) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    planted = folder / "trace-x.jsonl"
    planted.write_text('{"planted": true}\n')
    if kind == "another_users":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(planted, OTHER_UID, OTHER_UID)
    elif kind == "mode_0666":
        os.chmod(planted, 0o666)
    before = planted.read_bytes(), os.stat(planted).st_mode
    rec = Recorder(Settings(), directory=str(folder), name="trace-x.jsonl")
    rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1)
    rec.close()
    assert (planted.read_bytes(), os.stat(planted).st_mode) == before
    assert rec.path == str(folder / "trace-x.2.jsonl")
    assert oct(os.stat(rec.path).st_mode & 0o777) == "0o600" and os.stat(rec.path).st_uid == os.geteuid()
    assert [type(r).__name__ for r in _records(rec.path)] == ["Header", "Call", "Counters"]
    assert len(_warnings(capfd.readouterr().err, "trace-x.jsonl already exists")) == 1


def test_every_numbered_name_taken_still_gives_a_file_with_a_random_part(tmp_path: Path, capfd) -> None:
    """FIFOs at the name and all 15 numbered names (a container restarted with pid 1 again and
    again): none is opened, and the trace still gets a file of its own, created exclusively."""
    folder = tmp_path / "t"
    folder.mkdir()
    os.mkfifo(folder / "trace-x.jsonl")
    for n in range(2, 17):
        os.mkfifo(folder / f"trace-x.{n}.jsonl")
    rec = Recorder(Settings(), directory=str(folder), name="trace-x.jsonl")
    _bounded(lambda: (rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1), rec.close()))
    assert rec.counters.sink_errors == 0 and rec.counters.records_dropped == 0
    assert rec.path is not None and re.fullmatch(r"trace-x\.[0-9a-f]{8}\.jsonl", os.path.basename(rec.path))
    assert all(stat.S_ISFIFO(os.lstat(p).st_mode) for p in folder.iterdir() if p.name != os.path.basename(rec.path))
    assert [type(r).__name__ for r in _records(rec.path)] == ["Header", "Call", "Counters"]
    assert len(_warnings(capfd.readouterr().err, "trace-x.jsonl already exists")) == 1


def test_a_symlink_of_another_user_on_the_way_to_the_folder_is_refused(tmp_path: Path, capfd) -> None:
    """SPECTRACE_DIR=/shared/traces with traces -> a system folder, planted by someone else."""
    if os.geteuid() != 0:
        pytest.skip("a symlink owned by another user needs root to make")
    system = tmp_path / "etc"
    system.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    (shared / "traces").symlink_to(system)
    os.lchown(shared / "traces", OTHER_UID, OTHER_UID)
    rec = Recorder(Settings(), directory=str(shared / "traces" / "run1"))
    rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1)
    rec.close()
    assert list(system.iterdir()) == []
    assert rec.counters.sink_errors >= 1 and len(rec.call_records()) == 1
    (line,) = _warnings(capfd.readouterr().err, "sink error")
    assert f"symlink owned by uid {OTHER_UID}" in line and str(shared / "traces") in line


def test_a_symlink_of_your_own_is_followed(tmp_path: Path) -> None:
    """The control: a user's own link (traces -> /scratch/me) is where the trace goes."""
    real = tmp_path / "scratch"
    real.mkdir()
    (tmp_path / "traces").symlink_to(real)
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path / "traces"))
    rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1)
    rec.close()
    assert rec.counters.sink_errors == 0 and [p.name for p in real.iterdir()] == [os.path.basename(rec.path or "")]


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o777])
def test_every_folder_created_is_0700_parents_included(umask: int, tmp_path: Path) -> None:
    old = os.umask(umask)
    try:
        ensure_private_dir(str(tmp_path / "a" / "b" / "c"))
    finally:
        os.umask(old)
    for folder in ("a", "a/b", "a/b/c"):
        assert oct(os.stat(tmp_path / folder).st_mode & 0o777) == "0o700", folder


def test_demo_output_root_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    script = "import os, sys; os.umask(0); from spectrace.cli.demo import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [PY, "-c", script, "--bug", "healthy", "--out", str(out), "--json"], capture_output=True, text=True, timeout=300, env=_env()
    )
    assert done.returncode == 0, done.stderr
    for folder in (tmp_path / "runs", out, out / "healthy"):
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700", folder
    (trace,) = (out / "healthy").glob("trace-*.jsonl")
    assert oct(os.stat(trace).st_mode & 0o777) == "0o600"


# ===================================================================================== 2. fork
FORK_CHILD = textwrap.dedent(
    """
    import json, os, sys, torch
    import spectrace
    from spectrace.settings import Settings
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).eval()
    parent_x, child_x = torch.randn(4, 8), torch.randn(3, 8)
    # flush_seconds=3600: the parent's calls are still queued in memory at the fork.
    with torch.no_grad():
        t = spectrace.trace(model, modules="*", directory=sys.argv[1], settings=Settings(flush_seconds=3600, quiet=True))
        model(parent_x); model(parent_x)
        pid = os.fork()
        if pid == 0:
            model(child_x)
            t.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        model(parent_x)
        t.close()
    print(json.dumps({"parent": os.getpid(), "child": pid, "status": status}))
    """
)


def test_a_forked_child_writes_its_own_file_and_never_the_parents_calls(tmp_path: Path) -> None:
    script = tmp_path / "fork.py"
    script.write_text(FORK_CHILD)
    done = subprocess.run([PY, str(script), str(tmp_path / "t")], capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    assert pids["status"] == 0
    files = {p.name: _records(p) for p in (tmp_path / "t").glob("*.jsonl")}
    assert set(files) == {trace_file_name(pid=pids["parent"]), trace_file_name(pid=pids["child"])}
    for who, rows in (("parent", 4), ("child", 3)):
        records = files[trace_file_name(pid=pids[who])]
        headers = [r for r in records if isinstance(r, Header)]
        assert len(headers) == 1 and records[0] is headers[0] and headers[0].pid == pids[who]
        calls = [r for r in records if isinstance(r, Call)]
        # The parent ran 3 steps of 2 modules, the child 1; each file holds its own only.
        assert len(calls) == (6 if who == "parent" else 2), who
        assert {c.inputs[0].shape[0] for c in calls} == {rows}, who
        counters = records[-1]
        assert isinstance(counters, Counters) and counters.records_dropped == 0
        assert counters.calls_seen == len(calls)


def test_fork_gives_the_child_fresh_locks(tmp_path: Path) -> None:
    """A lock held by another thread at the fork does not exist in the child: it must not wait on it."""
    script = tmp_path / "locks.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, threading
            from spectrace.recorder import Recorder
            from spectrace.records import Call
            from spectrace.settings import Settings
            rec = Recorder(Settings(quiet=True), directory=sys.argv[1])
            held, release = threading.Event(), threading.Event()
            def hold():
                with rec._lock:
                    held.set(); release.wait(30)
            threading.Thread(target=hold, daemon=True).start()
            held.wait(10)
            pid = os.fork()
            if pid == 0:
                rec.emit_step(0, [Call(step=0, seq=0, module="child", module_type="T")], 0, 1)
                rec.close()
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            release.set()
            print(pid, status)
            """
        )
    )
    done = subprocess.run([PY, str(script), str(tmp_path / "t")], capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    pid, status = map(int, done.stdout.split())
    assert status == 0
    records = _records(tmp_path / "t" / trace_file_name(pid=pid))
    assert [type(r).__name__ for r in records] == ["Header", "Call", "Counters"] and records[1].module == "child"


# ==================================================================================== 3. bounds
@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("SPECTRACE_RECORD_CAP", "99999999999999999999", "record_cap"),
        ("SPECTRACE_RECORD_CAP", str(MAX_RECORD_CAP + 1), "record_cap"),
        ("SPECTRACE_RECORD_CAP", "9" * 5000, "record_cap"),
        ("SPECTRACE_RECORD_CAP", "0", "record_cap"),
        ("SPECTRACE_SAMPLE", "1e9", "sample"),
        ("SPECTRACE_SAMPLE", "-1", "sample"),
        ("SPECTRACE_GRAPH_SAMPLE", "18446744073709551617", "graph_sample"),
        ("SPECTRACE_FLUSH_SECONDS", "inf", "flush_seconds"),
        ("SPECTRACE_FLUSH_SECONDS", "nan", "flush_seconds"),
        ("SPECTRACE_FLUSH_SECONDS", "1e400", "flush_seconds"),
        ("SPECTRACE_FLUSH_SECONDS", "1e6", "flush_seconds"),
        ("SPECTRACE_FLUSH_SECONDS", "0", "flush_seconds"),
    ],
)
def test_a_value_past_its_bound_warns_once_and_falls_back(name: str, value: str, field: str, capsys) -> None:
    settings_mod._bad_said.clear()
    default = getattr(Settings(), field)
    for _ in range(3):  # every trace() reads the environment again: still one warning
        s = Settings.from_env({name: value})
        assert getattr(s, field) == default
        Recorder(s)  # no OverflowError from a buffer sized by it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and f"using {default}" in err[0] and len(err[0]) < 200, err


def test_settings_built_in_code_are_bounded_too(capsys) -> None:
    settings_mod._bad_said.clear()
    s = Settings(record_cap=10**20, sample=0, flush_seconds=float("nan"))
    assert (s.record_cap, s.sample, s.flush_seconds) == (Settings().record_cap, 1, Settings().flush_seconds)
    Recorder(s)
    assert len(capsys.readouterr().err.strip().splitlines()) == 3


def test_spectrace_settings_shows_the_fallback_not_the_bad_value() -> None:
    done = subprocess.run(
        [PY, "-m", "spectrace", "settings"],
        capture_output=True, text=True, timeout=60, env=_env(SPECTRACE_RECORD_CAP="99999999999999999999"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr  # a bad value fails the check, its fallback shown
    assert "record_cap = 100000" in done.stdout and "99999999999999999999" not in done.stdout
    warning, error = done.stderr.strip().splitlines()
    assert (
        "SPECTRACE_RECORD_CAP" in warning
        and error == "spectrace settings: error: 1 bad value: SPECTRACE_RECORD_CAP (the fallbacks are shown)"
    )


@pytest.mark.slow
def test_a_traced_process_with_an_absurd_cap_runs_and_traces(tmp_path: Path) -> None:
    """SPECTRACE=1 with the cap of the report: the host runs, the trace is written, one warning."""
    code = "from spectrace.eagle3.target import tiny_llama; import torch; m = tiny_llama(num_layers=1)\nwith torch.no_grad(): m(torch.tensor([[1, 2]]))"
    env = _env(SPECTRACE="1", SPECTRACE_QUIET="1", SPECTRACE_DIR=str(tmp_path / "t"), SPECTRACE_RECORD_CAP="99999999999999999999")
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(_warnings(done.stderr, "SPECTRACE_RECORD_CAP")) == 1
    (path,) = (tmp_path / "t").glob("*.jsonl")
    records = _records(path)
    assert records[0].settings["record_cap"] == 100_000 and any(isinstance(r, Call) for r in records)
    assert records[-1].internal_errors == 0


# ================================================================================ 4. OTLP losses
def _hanging_collector() -> Any:
    server = __import__("socket").socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)  # the kernel accepts; nobody ever answers
    return server


def _failing_collector() -> Any:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(400)  # not retried by the exporter: a failed batch at once
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("collector", ["hanging", "failing"])
def test_spans_the_collector_never_got_are_counted_in_the_file(collector: str, small, tmp_path: Path, monkeypatch) -> None:
    model, ids, ref = small
    server = _hanging_collector() if collector == "hanging" else _failing_collector()
    port = server.getsockname()[1] if collector == "hanging" else server.server_address[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path), settings=Settings.from_env()) as t:
            for _ in range(3):
                assert torch.equal(model(ids).logits, ref)
    finally:
        if collector == "hanging":
            server.close()
        else:
            server.shutdown()
            server.server_close()
    (otel,) = [s for s in t.recorder.sinks if s.needs_objects]
    queued = otel.spans_queued
    assert queued >= 3 * 6 + 2  # 3 steps of 5 calls + their step spans, the header, the counters
    records = _records(t.path)
    counters = records[-1]
    assert isinstance(counters, Counters) and counters.sink_errors >= 1
    assert counters.otlp_spans_lost == queued  # none of them reached the collector
    (note,) = [r for r in records if isinstance(r, Coverage) and r.kind == "sink_error"]
    assert note.count == queued and f"{queued} of {queued} spans never reached the collector" in note.detail
    assert records.index(note) == len(records) - 2  # written after the shutdown, before the counters
    assert counters.records_dropped == 0  # the file itself is whole
    from spectrace.cli.view import main as view_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert view_main([str(tmp_path), "--no-pager"]) == 0
    text = " ".join(out.getvalue().replace("│", " ").split())  # the header box wraps the line
    assert f"{queued} sink errors (records not written): OpenTelemetry: {queued} of {queued} spans never reached" in text


def test_a_collector_that_got_every_span_costs_nothing_in_the_file(small, tmp_path: Path, monkeypatch) -> None:
    """The control: a real receiver confirms every batch, so nothing is counted as lost."""
    model, ids, ref = small
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path), settings=Settings.from_env()) as t:
            for _ in range(3):
                assert torch.equal(model(ids).logits, ref)
        got = len(receiver.spans)
    records = _records(t.path)
    assert records[-1].otlp_spans_lost == 0 and records[-1].sink_errors == 0
    assert not [r for r in records if isinstance(r, Coverage)]
    (otel,) = [s for s in t.recorder.sinks if s.needs_objects]
    assert got == otel.spans_queued == otel.undelivered()[1]


# ================================================================================== 5. secrets
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://collector:4318?api_key=s3cret", "http://collector:4318?api_key=<redacted>"),
        ("https://u:s3cret@c:4318/v1/traces?token=s3cret&x=1#s3cret", "https://<redacted>@c:4318/v1/traces?token=<redacted>&x=<redacted>"),
        ("https://s3cret@c", "https://<redacted>@c"),
        ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ("", ""),
    ],
)
def test_endpoint_secrets_are_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    rec = Recorder(Settings(otlp_endpoint=url))
    assert "s3cret" not in rec.header.model_dump_json() and rec.header.settings["otlp_endpoint"] == shown
    assert "s3cret" not in Settings(otlp_endpoint=url).describe()


def test_spectrace_settings_prints_no_credentials() -> None:
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT="https://user:t0ken@collector:4318/?api_key=k3y")
    done = subprocess.run([PY, "-m", "spectrace", "settings"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "t0ken" not in done.stdout and "k3y" not in done.stdout
    assert "otlp_endpoint = 'https://<redacted>@collector:4318/?api_key=<redacted>'" in done.stdout


def test_a_sink_error_quoting_the_endpoint_prints_no_secret(capfd) -> None:
    rec = Recorder(Settings())
    rec.sink_error("OTLP export raised ConnectionError: HTTPConnectionPool: url: http://u:t0ken@h:1/v1/traces?api_key=k3y")
    err = capfd.readouterr().err
    assert "t0ken" not in err and "k3y" not in err and "http://<redacted>@h:1/v1/traces?api_key=<redacted>" in err


# ================================================================================== 6. privacy
PRIVACY_CHILD = textwrap.dedent(
    """
    import torch
    from spectrace.eagle3.target import tiny_llama
    model = tiny_llama(num_layers=2)
    with torch.no_grad():
        model(torch.tensor([[5, 17, 33]]))
        model(torch.tensor([[101]]))  # a one-token decode step
    """
)


def _traced_tiny_llama(tmp_path: Path, **env: str) -> list[Any]:
    folder = tmp_path / "t"
    environ = _env(SPECTRACE="1", SPECTRACE_QUIET="1", SPECTRACE_DIR=str(folder), **env)
    done = subprocess.run([PY, "-c", PRIVACY_CHILD], capture_output=True, text=True, timeout=180, env=environ)
    assert done.returncode == 0, done.stderr
    (path,) = folder.glob("*.jsonl")
    return _records(path)


def _stats_of(records: list[Any], role: str, side: str) -> list[Any]:
    return [m.stats for r in records if isinstance(r, Call) and r.role == role for m in getattr(r, side) if m.dtype == "float32"]


def test_token_statistics_are_off_by_default(tmp_path: Path) -> None:
    records = _traced_tiny_llama(tmp_path)
    assert records[0].settings["token_stats"] is False
    embeds = [r for r in records if isinstance(r, Call) and r.role == "target.embed"]
    assert len(embeds) == 2
    for call in embeds:  # shape and dtype stay, statistics go
        (out,) = call.outputs
        assert out.stats is None and out.dtype == "float32" and out.shape[-1] == 64
    # The same tensor as the first layer's input carries none either; later layers keep theirs.
    assert _stats_of(records, "target.layer[0]", "inputs") == [None] * 2 * 3  # hidden_states, cos, sin
    assert all(s is not None for s in _stats_of(records, "target.layer[0]", "outputs"))
    assert all(s is not None for s in _stats_of(records, "target.layer[1]", "inputs")[::3])
    assert all(s is not None for s in _stats_of(records, "target.lm_head", "outputs"))


@pytest.mark.slow
def test_token_statistics_are_opt_in_and_then_spell_the_token(tmp_path: Path) -> None:
    """With SPECTRACE_TOKEN_STATS=1 the embedding output has statistics again, and the
    decode step's identify its token against the embedding table: why they are off."""
    records = _traced_tiny_llama(tmp_path, SPECTRACE_TOKEN_STATS="1")
    assert records[0].settings["token_stats"] is True
    decode = [r for r in records if isinstance(r, Call) and r.role == "target.embed"][-1]
    stats = decode.outputs[0].stats
    assert stats is not None and stats.mean is not None and stats.std is not None
    assert all(s is not None for s in _stats_of(records, "target.layer[0]", "inputs")[::3])
    from spectrace.eagle3.target import tiny_llama as build

    table = build(num_layers=2).get_input_embeddings().weight.detach().double()  # the model's own weights
    distance = (table.mean(1) - stats.mean).abs() + (table.std(1, unbiased=False) - stats.std).abs()
    assert int(distance.argmin()) == 101


def test_no_token_statistics_on_the_eagle3_draft_either() -> None:
    """The reference pipeline: the draft's embedding output and its decoder layer's
    ``embeds`` input (the same tensor) carry none; the draft's fc input keeps its own."""
    from spectrace.eagle3.bugs import build_scenario
    from spectrace.eagle3.loop import speculate
    from spectrace.eagle3.pair import demo_prompts

    scenario = build_scenario("healthy", load=False)
    scenario.draft.set_embed(scenario.target.get_embed())
    models = {"target": scenario.target, "draft": scenario.draft}
    with torch.no_grad(), spectrace.trace(models, profile="eagle3", settings=Settings(quiet=True)) as t:
        speculate(scenario.target, scenario.draft, demo_prompts()[0], k=2, max_new_tokens=4)
    calls = t.calls()
    draft_embeds = [c for c in calls if c.role == "draft.embed"]
    layers = [c for c in calls if c.role == "draft.layer"]
    assert draft_embeds and layers
    assert all(m.stats is None and m.shape for c in draft_embeds for m in c.outputs)
    for call in layers:
        embeds = next(m for m in call.inputs if m.dtype.startswith("float"))
        assert embeds.stats is None and embeds.shape
    assert any(m.stats is not None for c in calls if c.role == "draft.fc" for m in c.inputs)


def test_a_record_after_close_goes_to_the_same_file_never_to_what_replaced_it(tmp_path: Path) -> None:
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name="trace-x.jsonl")
    rec.emit(Coverage(kind="not_covered", detail="before close"))
    rec.close()
    rec.emit(Coverage(kind="not_covered", detail="after close"))  # e.g. another atexit handler
    assert [getattr(r, "detail", None) for r in _records(tmp_path / "trace-x.jsonl")][-1] == "after close"
    os.rename(tmp_path / "trace-x.jsonl", tmp_path / "moved.jsonl")
    os.mkfifo(tmp_path / "trace-x.jsonl")
    assert rec.sink is not None
    rec.sink.close()  # the next record opens the path again: a FIFO sits there now
    _bounded(lambda: rec.emit(Coverage(kind="not_covered", detail="into the fifo?")), 30)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "trace-x.jsonl").st_mode) and rec.counters.sink_errors == 1
    assert [getattr(r, "detail", None) for r in _records(tmp_path / "moved.jsonl")][-1] == "after close"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moved.jsonl", "trace-x.jsonl"]


MP_CHILD = textwrap.dedent(
    """
    import multiprocessing as mp, os, sys, torch
    from spectrace.eagle3.target import tiny_llama

    def work(model):
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))  # 3 rows: the child's

    if __name__ == "__main__":
        model = tiny_llama(num_layers=1)
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
        child = mp.get_context("fork").Process(target=work, args=(model,))
        child.start(); child.join(60)
        print(os.getpid(), child.pid, child.exitcode)
    """
)


@pytest.mark.slow
def test_a_multiprocessing_fork_child_closes_its_own_trace(tmp_path: Path) -> None:
    """SPECTRACE=1: a multiprocessing child leaves by os._exit (no atexit), and its queued
    calls and closing record still reach its own file."""
    script = tmp_path / "mp_child.py"
    script.write_text(MP_CHILD)
    # One OpenMP thread: libgomp's pool does not survive a fork (torch's attention would
    # wait on it forever in the child, traced or not).
    env = _env(SPECTRACE="1", SPECTRACE_QUIET="1", SPECTRACE_DIR=str(tmp_path / "t"), SPECTRACE_FLUSH_SECONDS="3600", OMP_NUM_THREADS="1")
    done = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    parent, child, code = map(int, done.stdout.split())
    assert code == 0
    for pid, rows in ((parent, 4), (child, 3)):
        records = _records(tmp_path / "t" / trace_file_name(pid=pid))
        assert records[0].pid == pid and isinstance(records[-1], Counters)
        calls = [r for r in records if isinstance(r, Call)]
        assert calls and {c.outputs[0].shape[-2] for c in calls if c.role and c.role.startswith("target.layer")} == {rows}


def test_an_unknown_profile_warns_once_and_falls_back(capsys) -> None:
    from spectrace.hooks.selection import PROFILES

    assert tuple(PROFILES) == settings_mod.PROFILE_NAMES  # the names checked are the profiles there are
    settings_mod._bad_said.clear()
    assert Settings.from_env({"SPECTRACE_PROFILE": "everything"}).profile == ""
    assert Settings.from_env({"SPECTRACE_PROFILE": "hf"}).profile == "hf"
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "SPECTRACE_PROFILE='everything' is not one of default, hf, eagle3, all" in line


def test_a_fifo_as_the_trace_folder_is_one_sink_error_never_a_hang(tmp_path: Path, capfd) -> None:
    os.mkfifo(tmp_path / "traces")
    rec = Recorder(Settings(), directory=str(tmp_path / "traces"))
    _bounded(lambda: (rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1), rec.close()), 30)
    assert rec.counters.sink_errors >= 1 and len(rec.call_records()) == 1
    assert len(_warnings(capfd.readouterr().err, "is not a folder")) == 1

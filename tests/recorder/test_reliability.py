"""Reliability and security: a tracer that never hurts the server and never leaks.

Every fault here is real (a raising exporter, a closed or hanging OTLP port, a file size
limit, a full tmpfs, a read-only folder, SIGKILL) and the model is a real one. Each test
checks the same promise: outputs are bit-identical, the fault is counted, one warning.
RELIABILITY.md lists every case with its figures and the command that reproduces it.

The 1M-call soak behind RELIABILITY.md's figure runs from this file as a script:

    $ .venv/bin/python tests/recorder/test_reliability.py soak 1000000 --cap 1000
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import paths

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)  # run as a script: the repository root, for tests.helpers

ROOT = paths.ROOT
PY = sys.executable


def _quiet_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_"))}


def _spectrace_lines(err: str, what: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("spectrace: warning:") and what in line]


# =============================================================================== faults
# The in-process fault tests use the repo's tiny Llama; the subprocess ones a plain torch
# MLP so that each child starts in about a second.

if __name__ != "__main__":
    import torch

    import spectrace
    from spectrace import api
    from spectrace.recorder import Recorder, safe_argv
    from spectrace.records import RECORD_ADAPTER, Call, Header, TensorMeta
    from spectrace.settings import Settings
    from spectrace.sinks import otel as otel_mod
    from spectrace.sinks.otel import OtelSink
    from tests.helpers.models import tiny_llama

    pytestmark = pytest.mark.usefixtures("no_spectrace_env")

    @pytest.fixture(scope="module")
    def small():
        model = tiny_llama(layers=2, hidden=32)
        ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = model(ids).logits.clone()
        return model, ids, ref

    def _run_traced(model: Any, ids: Any, ref: Any, steps: int = 3, **kw: Any) -> tuple[Any, float]:
        """Run ``steps`` traced forwards, assert each is bit-identical; returns the trace and close time."""
        with torch.no_grad():
            t = spectrace.trace(model, **kw)
            try:
                for _ in range(steps):
                    assert torch.equal(model(ids).logits, ref)
            finally:
                start = time.monotonic()
                t.close()
                closed = time.monotonic() - start
            assert torch.equal(model(ids).logits, ref)  # and after: hooks gone
        return t, closed


# ----------------------------------------------------------------------- OpenTelemetry
if __name__ != "__main__":
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class _RaisingExporter(SpanExporter):
        def __init__(self) -> None:
            self.calls = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.calls += 1
            raise RuntimeError(f"collector exploded on batch {self.calls}")

        def shutdown(self) -> None:
            raise OSError("and its shutdown too")

    def test_exporter_that_raises_is_counted_and_warned_once(small, monkeypatch, capfd) -> None:
        model, ids, ref = small
        exporter = _RaisingExporter()
        monkeypatch.setattr(api, "make_otel_sink", lambda s, err, rank=None: OtelSink(exporter, {"service.name": "t"}, err))
        t, closed = _run_traced(model, ids, ref, steps=3)
        assert exporter.calls >= 1
        assert t.recorder.counters.sink_errors >= 2  # the exports and the shutdown
        err = capfd.readouterr().err
        assert len(_spectrace_lines(err, "OTLP export raised RuntimeError")) == 1, err
        assert "Traceback" not in err and closed < otel_mod.SHUTDOWN_TIMEOUT_S + 1

    def _closed_port() -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    def test_otlp_endpoint_down(small, capfd, monkeypatch) -> None:
        model, ids, ref = small
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
        settings = Settings.from_env()
        t, closed = _run_traced(model, ids, ref, steps=3, settings=settings)
        assert t.recorder.counters.sink_errors >= 1
        err = capfd.readouterr().err
        lines = _spectrace_lines(err, "OTLP export failed")
        assert len(lines) == 1 and "Connection refused" in lines[0], err
        # The SDK's own per-batch and per-retry log lines are caught, not printed.
        assert "Transient error" not in err and "Failed to export" not in err.replace(lines[0], "")
        assert closed < otel_mod.SHUTDOWN_TIMEOUT_S + 1

    def test_otlp_endpoint_that_hangs_cannot_hold_the_exit(small, capfd, monkeypatch) -> None:
        model, ids, ref = small
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(64)  # accepts connections (the kernel does), never answers
        try:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
            settings = Settings.from_env()
            t, closed = _run_traced(model, ids, ref, steps=3, settings=settings)
        finally:
            server.close()
        assert closed < otel_mod.SHUTDOWN_TIMEOUT_S + 1, closed
        assert t.recorder.counters.sink_errors >= 1
        err = capfd.readouterr().err
        assert 1 <= len(_spectrace_lines(err, "sink error")) <= 2, err  # the export failure (+ the shutdown deadline)
        assert "Traceback" not in err and "Transient error" not in err

    class _StuckExporter(SpanExporter):
        """An exporter that never returns (a wedged client library)."""

        def __init__(self) -> None:
            self.release = threading.Event()

        def export(self, spans: Any) -> SpanExportResult:
            self.release.wait(60)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self.release.set()

    def test_exporter_that_never_returns_is_abandoned_at_the_deadline(small, monkeypatch, capfd) -> None:
        model, ids, ref = small
        exporter = _StuckExporter()
        monkeypatch.setattr(otel_mod, "SHUTDOWN_TIMEOUT_S", 1.0)
        monkeypatch.setattr(api, "make_otel_sink", lambda s, err, rank=None: OtelSink(exporter, {"service.name": "t"}, err))
        with monkeypatch.context() as m:
            m.setattr(otel_mod.OtelSink.shutdown, "__defaults__", (1.0,))
            t, closed = _run_traced(model, ids, ref, steps=3)
        assert 0.9 < closed < 2.5, closed
        err = capfd.readouterr().err
        assert len(_spectrace_lines(err, "OTLP shutdown did not finish in 1 s")) == 1, err
        assert exporter.release.is_set()  # told to stop, so its thread ends
        assert t.recorder.counters.sink_errors == 1

    def test_otlp_sdk_logging_of_the_host_is_untouched(caplog) -> None:
        """Only spectrace's own export is caught; the host's OpenTelemetry log lines pass."""
        import logging

        otel_mod._install_filter()
        with caplog.at_level(logging.WARNING, logger="opentelemetry.sdk._shared_internal"):
            logging.getLogger("opentelemetry.sdk._shared_internal").warning("host says hello")
        assert "host says hello" in caplog.text


# ---------------------------------------------------------------------------- the disk
MLP_CHILD = textwrap.dedent(
    """
    import hashlib, json, os, resource, sys, torch
    sys.path.insert(0, {root!r})
    import spectrace
    from spectrace.settings import Settings
    limit = int(sys.argv[2])
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: write gets EFBIG
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)]).eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        ref = model(x)
        with spectrace.trace(model, modules="*", directory=sys.argv[1], settings=Settings(flush_seconds=0.001)) as t:
            for _ in range(int(sys.argv[3])):
                assert torch.equal(model(x), ref)
        assert torch.equal(model(x), ref)
    print(t.recorder.counters.model_dump_json())
    """
)


def _check_lines(path: Path) -> tuple[int, bytes]:
    """Every complete line loads; returns the number of records and the unterminated tail."""
    data = path.read_bytes()
    *complete, tail = data.split(b"\n")
    for line in complete:
        RECORD_ADAPTER.validate_json(line)
    return len(complete), tail


def test_file_size_limit_reached_mid_run(tmp_path: Path) -> None:
    """RLIMIT_FSIZE: writes fail with EFBIG part-way, the torn last line is cut off."""
    script = tmp_path / "child.py"
    script.write_text(MLP_CHILD.format(root=str(ROOT)))
    out = subprocess.run(
        [PY, str(script), str(tmp_path / "t"), str(24 * 1024), "80"],
        capture_output=True, text=True, timeout=120, env=_quiet_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    counters = json.loads(out.stdout)
    assert counters["sink_errors"] >= 1 and counters["records_dropped"] > 0
    assert counters["records_written"] > 0  # it wrote until the limit
    lines = _spectrace_lines(out.stderr, "sink error")
    assert len(lines) == 1 and "cannot write" in lines[0], out.stderr
    (path,) = (tmp_path / "t").glob("*.jsonl")
    n, tail = _check_lines(path)
    assert n == counters["records_written"] + 1  # + the header; nothing torn, nothing extra
    assert tail == b"" and path.stat().st_size <= 24 * 1024


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_disk_full_on_a_small_tmpfs(small, tmp_path: Path, capfd) -> None:
    """ENOSPC from a real 64 KiB filesystem; space freed later, writing resumes cleanly."""
    model, ids, ref = small
    with _tmpfs(tmp_path / "full", "size=64k,mode=0755") as mnt:
        with torch.no_grad():
            t = spectrace.trace(model, directory=str(mnt / "t"), settings=Settings(flush_seconds=0.001))
            try:
                steps = 0
                while t.recorder.counters.sink_errors == 0 and steps < 500:
                    assert torch.equal(model(ids).logits, ref)
                    steps += 1
                for _ in range(5):  # keep running on a full disk
                    assert torch.equal(model(ids).logits, ref)
                dropped_full = t.recorder.counters.records_dropped
            finally:
                t.close()
        assert steps < 500 and t.recorder.counters.sink_errors >= 1 and dropped_full > 0
        (path,) = (mnt / "t").glob("*.jsonl")
        n, tail = _check_lines(path)  # no torn line left in the middle or at the end
        assert tail == b"" and n >= t.recorder.counters.records_written
    err = capfd.readouterr().err
    assert len(_spectrace_lines(err, "sink error")) == 1, err


def test_space_freed_after_a_short_write_glues_no_lines(tmp_path: Path) -> None:
    """A short write is cut back, so a later successful write starts on a fresh line."""
    with _tmpfs(tmp_path / "full", "size=32k,mode=0755") as mnt:
        filler = mnt / "filler"
        filler.write_bytes(b"x" * (32 * 1024 - 4096 - 100))  # leaves < one page for the trace
        rec = Recorder(Settings(quiet=True, flush_seconds=3600), directory=str(mnt / "t"))
        call = Call(step=0, seq=0, module="m" * 200, module_type="Linear")
        rec.emit_step(0, [call] * 40, 0, 1)
        rec.flush()
        assert rec.counters.sink_errors == 1
        filler.unlink()  # space is back
        rec.emit_step(1, [call] * 5, 0, 1)
        rec.close()
        (path,) = (mnt / "t").glob("*.jsonl")
        n, tail = _check_lines(path)
        assert tail == b"" and n == rec.counters.records_written + 1


def test_read_only_trace_folder(small, tmp_path: Path, capfd) -> None:
    model, ids, ref = small
    if os.geteuid() == 0:
        ctx = _tmpfs(tmp_path / "ro", "ro,size=64k")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        ctx = contextlib.nullcontext(tmp_path / "ro")
    with ctx as ro:
        t, closed = _run_traced(model, ids, ref, steps=3, directory=str(ro / "traces"), settings=Settings(flush_seconds=0.001))
        assert not (ro / "traces").exists()
    c = t.recorder.counters
    assert c.sink_errors >= 1 and c.records_written == 0 and c.records_dropped > 0
    assert len(t.calls()) == 3 * 5  # the in-memory trace is whole
    err = capfd.readouterr().err
    lines = _spectrace_lines(err, "sink error")
    assert len(lines) == 1 and ("Read-only" in lines[0] or "Permission denied" in lines[0]), err


def test_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    """In a shared folder a symlink at the trace's name must not redirect the trace:
    it is left alone and the trace goes to the next free name."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "trace-x.jsonl").symlink_to(victim)
    rec = Recorder(Settings(quiet=True), directory=str(tmp_path / "t"), name="trace-x.jsonl")
    rec.emit_step(0, [Call(step=0, seq=0, module="m", module_type="Linear")], 0, 1)
    rec.close()
    assert victim.read_text() == "precious\n" and (tmp_path / "t" / "trace-x.jsonl").is_symlink()
    assert rec.path == str(tmp_path / "t" / "trace-x.2.jsonl") and rec.counters.sink_errors == 0
    n, tail = _check_lines(Path(rec.path))
    assert n == 3 and tail == b""  # header, the call, the counters


# ------------------------------------------------------------------------ statistics
if __name__ != "__main__":

    def test_statistic_that_raises(small, monkeypatch, capfd) -> None:
        from spectrace.hooks import readback

        def broken(tensor: Any) -> Any:
            raise FloatingPointError("reduction kernel failed")

        monkeypatch.setattr(readback, "cpu_row", broken)
        monkeypatch.setattr(readback, "cpu_rows", broken)  # the same reductions, a pass's tensors together
        model, ids, ref = small
        t, _ = _run_traced(model, ids, ref, steps=3)
        assert len(t.calls()) == 3 * 5 and all(m.stats is None for c in t.calls() for m in c.outputs)
        assert t.recorder.counters.internal_errors >= 3  # at least once per step
        err = capfd.readouterr().err
        assert len(_spectrace_lines(err, "internal error")) == 1, err

    def test_statistics_readback_that_raises_keeps_the_calls(small, monkeypatch, capfd) -> None:
        from spectrace.hooks import readback

        def broken(*args: Any) -> Any:
            raise RuntimeError("device lost")

        monkeypatch.setattr(readback, "host_rows", broken)  # CPU rows: already on the host
        model, ids, ref = small
        t, _ = _run_traced(model, ids, ref, steps=3)
        assert len(t.calls()) == 3 * 5  # the calls of every step still arrive, without statistics
        assert t.recorder.counters.internal_errors >= 3 and t.recorder.counters.records_dropped == 0
        assert len(_spectrace_lines(capfd.readouterr().err, "internal error")) == 1

    # ------------------------------------------------------------------- tensor kinds
    def _kinds() -> dict[str, Any]:
        g = torch.Generator().manual_seed(3)
        base = torch.randn(6, 8, generator=g)
        kinds = {
            "bfloat16": base.bfloat16(),
            "float16": base.half(),
            "float8_e4m3fn": base.to(torch.float8_e4m3fn),
            "int8": (base * 20).to(torch.int8),
            "packed_int4_uint8": torch.randint(0, 256, (6, 4), dtype=torch.uint8, generator=g),
            "bool": base > 0,
            "complex64": torch.complex(base, -base),
            "empty": torch.empty(0, 8),
            "meta": torch.empty(6, 8, device="meta"),
            "sparse_coo": base.to_sparse(),
            "sparse_csr": base.to_sparse_csr(),
            "non_contiguous": base.t(),
            "strided_slice": base[:, ::3],
            "expanded": torch.randn(1, 8, generator=g).expand(6, 8),
            "bf16_transposed": base.bfloat16().t(),
            "int64_ids": torch.tensor([[117]]),
            "quantized": torch.quantize_per_tensor(base, 0.1, 0, torch.qint8),
            "nan_inf": torch.tensor([float("nan"), float("inf"), 1.0]),
        }
        if hasattr(torch, "float4_e2m1fn_x2"):
            kinds["float4_e2m1fn_x2"] = torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        return kinds

    # Kinds whose statistics make no sense (or cannot be computed): no stats, no error.
    NO_STATS = {"bool", "empty", "meta", "sparse_coo", "sparse_csr", "int64_ids", "quantized", "float4_e2m1fn_x2"}

    class _Pass(torch.nn.Module):
        """Takes the odd tensor in and hands it back out next to a normal activation."""

        def forward(self, x: Any, odd: Any) -> Any:
            return x * 2, odd

    @pytest.mark.parametrize("kind", sorted(_kinds()))
    def test_every_tensor_kind(kind: str, capfd) -> None:
        odd = _kinds()[kind]
        model = torch.nn.Sequential()
        model.add_module("inner", _Pass())
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
        ref, ref_odd = model.inner(x, odd)
        with spectrace.trace(model, modules="*", stats="full") as t:
            t.tracer.wrap_forward(model.inner)
            y, y_odd = model.inner(x, odd)
        assert torch.equal(y, ref) and y_odd is odd is ref_odd
        assert t.recorder.counters.internal_errors == 0, capfd.readouterr().err
        (call,) = t.calls("inner")
        meta_in = next(m for m in call.inputs if m.arg == "input[1]")
        meta_out = next(m for m in call.outputs if m.arg == "output[1]")
        assert meta_in.shape == list(odd.shape) == meta_out.shape
        assert meta_in.dtype == str(odd.dtype).removeprefix("torch.")
        if kind in NO_STATS:
            assert meta_in.stats is None and meta_out.stats is None
        else:
            s = meta_out.stats
            ref64 = (odd.abs() if odd.is_complex() else odd).to(torch.float64)
            finite = ref64[torch.isfinite(ref64)]
            assert s.numel == odd.numel()
            assert s.nan == int(torch.isnan(ref64).sum()) and s.inf == int(torch.isinf(ref64).sum())
            if odd.is_complex():  # |z| statistics: absmax stays, a "mean" of magnitudes drops out
                assert s.mean is None and s.std is None
                assert s.absmax == pytest.approx(ref64.max().item(), rel=1e-6)
            elif s.nan == 0 and s.inf == 0:
                assert s.mean == pytest.approx(finite.mean().item(), rel=1e-3, abs=1e-3)
                assert s.std == pytest.approx(finite.std(unbiased=False).item(), rel=1e-3, abs=1e-3)
                assert s.absmax == pytest.approx(finite.abs().max().item(), rel=1e-3)
            else:
                assert s.mean is None and s.absmax is None  # a NaN hides the extremes; counts say it
        assert "spectrace: warning" not in capfd.readouterr().err

    def test_nested_tensor_output_never_reaches_the_model(capfd) -> None:
        """A nested tensor has no sizes; reading its shape raises inside the hook.

        The call is kept with shape ``[]`` for the nested tensor (no internal error), and
        the model is unaffected.
        """
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            odd = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
        model = torch.nn.Sequential()
        model.add_module("inner", _Pass())
        x = torch.randn(3, 4)
        ref, _ = model.inner(x, odd)
        with spectrace.trace(model, modules="*") as t:
            t.tracer.wrap_forward(model.inner)
            y, y_odd = model.inner(x, odd)
        assert torch.equal(y, ref) and y_odd is odd
        assert t.recorder.counters.internal_errors == 0
        (call,) = t.calls("inner")
        assert [m.shape for m in call.inputs] == [[3, 4], []]


# ======================================================================= killed writers
WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from spectrace.recorder import Recorder
    from spectrace.records import Call, TensorMeta
    from spectrace.settings import Settings
    from spectrace.sinks.jsonl import JsonlSink, ensure_private_dir
    me, folder = sys.argv[1], sys.argv[2]
    s = Settings(flush_seconds=0.0005, quiet=True)
    own = Recorder(s, directory=folder)                                # trace-<host>-<pid>.jsonl

    class SharedFile(JsonlSink):
        # The trace file's own whole-line writes, into one file that four writers append
        # to (spectrace never shares a trace file: it creates its own with O_EXCL).
        def _open(self):
            if self._fd is None:
                ensure_private_dir(self.directory)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            return self._fd

    shared = Recorder(s, sinks=[SharedFile(folder, "trace-shared.jsonl")])  # four writers, one file
    print("ready", flush=True)
    seq = 0
    while True:
        calls = []
        for _ in range(1 + seq % 13):
            seq += 1
            # Lines from 0.3 KB to ~9 KB, so batches cross page and pipe-buffer sizes.
            pad = "x" * ((seq * 7919) % 9000)
            calls.append(Call(step=seq, seq=seq, module=f"writer{{me}}", module_type="T", root=f"writer{{me}}:{{seq}}:{{pad}}",
                              inputs=[TensorMeta(arg=f"writer{{me}}", shape=[seq], dtype="float32", device="cpu")]))
        own.emit_step(seq, calls, 0, 1)
        shared.emit_step(seq, calls, 0, 1)
    """
)


def _check_writer_line(line: bytes) -> tuple[str, int] | None:
    """One writer per line: the three places a call names its writer agree."""
    record = RECORD_ADAPTER.validate_json(line)
    if not isinstance(record, Call):
        return None
    who, seq, _pad = record.root.split(":", 2)
    assert who == record.module == record.inputs[0].arg and int(seq) == record.seq == record.inputs[0].shape[0]
    return who, record.seq


def kill_writers(folder: Path, writers: int = 4, rounds: int = 2, seed: int = 0) -> dict[str, int]:
    """Start ``writers`` processes per round, SIGKILL each at a random moment; check every file."""
    rng = random.Random(seed)
    script = folder.parent / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    figures = {"killed": 0, "files": 0, "lines": 0, "torn_tails": 0, "shared_file_glued_lines": 0}
    for r in range(rounds):
        procs = [
            subprocess.Popen([PY, str(script), f"{r}.{i}", str(folder)], stdout=subprocess.PIPE, env=_quiet_env()) for i in range(writers)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == b"ready"
        for p in rng.sample(procs, len(procs)):
            time.sleep(rng.uniform(0.05, 0.6))
            p.send_signal(signal.SIGKILL)
            figures["killed"] += 1
        for p in procs:
            assert p.wait(timeout=30) == -signal.SIGKILL
    for path in sorted(folder.glob("*.jsonl")):
        figures["files"] += 1
        *complete, tail = path.read_bytes().split(b"\n")
        figures["torn_tails"] += bool(tail)
        last: dict[str, int] = {}
        for number, line in enumerate(complete, 1):
            try:
                got = _check_writer_line(line)
            except Exception:
                # Only a file several processes share may hold one: a killed writer's
                # fragment that the next writer's line was appended to (see jsonl.py).
                assert path.name == "trace-shared.jsonl", f"{path.name}:{number} does not load"
                figures["shared_file_glued_lines"] += 1
                continue
            figures["lines"] += 1
            if got:
                who, seq = got
                assert seq > last.get(who, 0), f"{path.name}: writer {who} went back"
                last[who] = seq
        if path.name != "trace-shared.jsonl":
            assert len(last) <= 1, f"{path.name} holds lines of several writers"
    return figures


def test_four_writers_killed_at_random_moments(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    figures = kill_writers(folder, writers=4, rounds=2, seed=int(os.environ.get("RELIABILITY_SEED", "0")))
    assert figures["killed"] == 8 and figures["files"] == 8 + 1
    assert figures["lines"] > 100


if __name__ != "__main__":

    def test_threads_writing_through_one_recorder(tmp_path: Path) -> None:
        rec = Recorder(Settings(flush_seconds=0.0005, quiet=True), directory=str(tmp_path))
        per_thread, threads = 2000, 4

        def work(me: int) -> None:
            for seq in range(1, per_thread + 1):
                pad = "y" * ((seq * 7919) % 3000)
                call = Call(step=seq, seq=seq, module=f"writer{me}", module_type="T", root=f"writer{me}:{seq}:{pad}",
                            inputs=[TensorMeta(arg=f"writer{me}", shape=[seq], dtype="float32", device="cpu")])  # fmt: skip
                rec.emit_step(seq, [call], 0, 1)
                if seq % 97 == 0:
                    rec.flush()

        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        rec.close()
        (path,) = tmp_path.glob("*.jsonl")
        last: dict[str, int] = {}
        *complete, tail = path.read_bytes().split(b"\n")
        for line in complete:
            got = _check_writer_line(line)
            if got:
                assert got[1] == last.get(got[0], 0) + 1  # in order, none lost, none twice
                last[got[0]] = got[1]
        assert tail == b"" and last == {f"writer{i}": per_thread for i in range(threads)}
        assert rec.counters.records_dropped == 0 and rec.counters.records_written == threads * per_thread + 1

    def test_threads_running_one_traced_model(small) -> None:
        """Four threads share one traced model: outputs stay exact, nothing raises, every call is kept."""
        model, ids, ref = small
        errors: list[BaseException] = []

        def work() -> None:
            try:
                with torch.no_grad():
                    for _ in range(5):
                        assert torch.equal(model(ids).logits, ref)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        with spectrace.trace(model) as t:
            pool = [threading.Thread(target=work) for _ in range(4)]
            for th in pool:
                th.start()
            for th in pool:
                th.join()
        assert not errors
        assert len(t.calls()) == 4 * 5 * 5 and t.recorder.counters.calls_seen == 100
        steps: dict[int, list[str]] = {}
        for call in t.calls():
            steps.setdefault(call.step, []).append(call.module)
        assert len(steps) == 20 and all(len(m) == 5 for m in steps.values())  # no step mixes threads


# ================================================================================ soak
class _Soak:
    """A model of ``width`` tiny layers: ``n`` module calls cost n / width forwards."""

    @staticmethod
    def build(width: int) -> Any:
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(width)]).eval()


def soak(calls: int, cap: int, folder: str, stats: str = "basic", width: int = 10) -> dict[str, Any]:
    """Run ``calls`` module calls through a Tracer with record cap ``cap``; return the figures."""
    import torch

    from spectrace.hooks.engine import Tracer

    model = _Soak.build(width)
    x = torch.randn(2, 4)
    with torch.no_grad():
        ref = model(x)
    rec = Recorder(Settings(record_cap=cap, flush_seconds=3600, quiet=True), directory=folder)
    tracer = Tracer(rec, stats=stats)
    tracer.attach(model, modules="*")

    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()

    start, samples = time.time(), []
    forwards = calls // width
    with torch.no_grad():
        for i in range(forwards):
            out = model(x)
            if i % max(1, forwards // 10) == 0:
                samples.append(rss())
                assert torch.equal(out, ref)
                assert len(rec.calls) <= cap and len(rec._pending) <= cap and len(rec.important) < 10
    tracer.detach()
    rec.close()
    return {
        "calls": rec.counters.calls_seen,
        "cap": cap,
        "seconds": round(time.time() - start, 1),
        "rss_first_mb": round(samples[0] / 2**20, 1),
        "rss_growth_mb": round((max(samples) - samples[1]) / 2**20, 1) if len(samples) > 1 else 0.0,
        "records_written": rec.counters.records_written,
        "records_dropped": rec.counters.records_dropped,
        "file": rec.path,
    }


if __name__ != "__main__":

    def test_soak_100k_calls_with_a_small_cap(tmp_path: Path) -> None:
        from spectrace.cli.view import main as view_main

        fig = soak(100_000, cap=500, folder=str(tmp_path), stats="off")
        assert fig["calls"] == 100_000
        # The newest `cap` calls reach the file; every other one is counted, none vanishes.
        assert fig["records_dropped"] == 100_000 - 500 and fig["records_written"] == 500 + 1  # + stats record
        assert fig["rss_growth_mb"] < 30, fig
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert view_main([str(tmp_path), "--json"]) == 0
        assert json.loads(out.getvalue())["header"]["records_dropped"] == 99_500
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert view_main([str(tmp_path), "--no-pager"]) == 0
        assert "records dropped 99500" in " ".join(out.getvalue().split())


# ============================================================================= privacy
if __name__ != "__main__":

    def test_trace_holds_no_values_token_ids_or_prompt(small, tmp_path: Path, monkeypatch) -> None:
        model, _, _ = small
        secret = "the secret prompt"
        monkeypatch.setattr(sys, "argv", ["serve.py", "--prompt", secret, f"--system={secret}", "-p", "4242", secret])
        ids = torch.tensor([[117, 93, 117]])
        with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path)) as t:
            model(ids)
            model(torch.tensor([[109]]))  # one decode step: a mean of the ids *is* the token
        text = Path(t.path).read_text()

        def strings(value: Any) -> list[str]:  # numbers (times, pids) may spell any digits
            if isinstance(value, str):
                return [value]
            if isinstance(value, dict):
                return [x for k, v in value.items() for x in [k, *strings(v)]]
            return [x for v in value for x in strings(v)] if isinstance(value, list) else []

        written = [x for line in text.splitlines() for x in strings(json.loads(line))]
        assert "secret" not in text and not any("4242" in x for x in written)
        header = RECORD_ADAPTER.validate_json(text.splitlines()[0])
        assert isinstance(header, Header)
        assert header.argv == ["serve.py", "--prompt", "<redacted>", "--system=<redacted>", "-p", "<redacted>", "<redacted>"]
        for c in t.calls("model.embed_tokens"):
            assert c.inputs[0].dtype == "int64" and c.inputs[0].stats is None
        # Nothing but metadata and statistics: every tensor entry has exactly these keys.
        for line in text.splitlines():
            raw = json.loads(line)
            for side in ("inputs", "outputs"):
                for m in raw.get(side, []):
                    assert set(m) == {"arg", "shape", "dtype", "device", "stats"}
                    assert m["stats"] is None or set(m["stats"]) == {"mean", "std", "absmax", "nan", "inf", "numel"}

    def test_full_argv_is_opt_in_with_a_warning(monkeypatch, capsys) -> None:
        s = Settings.from_env({"SPECTRACE_KEEP_ARGV": "1"})
        assert s.keep_argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "SPECTRACE_KEEP_ARGV=1" in err[0] and "full command line" in err[0]
        monkeypatch.setattr(sys, "argv", ["serve.py", "--prompt", "hello"])
        assert Recorder(s).header.argv == ["serve.py", "--prompt", "hello"]
        assert Recorder(Settings()).header.argv == ["serve.py", "--prompt", "<redacted>"]
        assert not Settings.from_env({}).keep_argv and capsys.readouterr().err == ""

    def test_capture_values_keeps_values_only_and_says_so(capsys) -> None:
        # SPECTRACE_CAPTURE_VALUES now keeps fused-input values (compare-train), never the command line.
        s = Settings.from_env({"SPECTRACE_CAPTURE_VALUES": "1"})
        assert not s.keep_argv and s.capture_values == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "SPECTRACE_CAPTURE_VALUES=1" in line and "user data" in line

    def test_endpoint_credentials_stay_out_of_the_header() -> None:
        rec = Recorder(Settings(otlp_endpoint="https://user:s3cret@collector:4318/v1"))
        assert "s3cret" not in rec.header.model_dump_json()
        assert rec.header.settings["otlp_endpoint"] == "https://<redacted>@collector:4318/v1"

    @pytest.mark.parametrize(
        ("argv", "kept"),
        [
            (["a.py"], ["a.py"]),
            (
                ["a.py", "-v", "-x5", "--flag", "--k=v", "-", "--", "-3"],
                ["a.py", "-v", "<redacted>", "--flag", "--k=<redacted>", "<redacted>", "--", "<redacted>"],
            ),
        ],
    )
    def test_argv_redaction_rules(argv: list[str], kept: list[str]) -> None:
        assert safe_argv(argv) == kept and safe_argv(argv, keep_values=True) == argv

    def test_file_0600_in_a_folder_0700_whatever_the_umask(small, tmp_path: Path) -> None:
        model, ids, _ = small
        old = os.umask(0)
        try:
            with torch.no_grad(), spectrace.trace(model, directory=str(tmp_path / "a" / "traces")) as t:
                model(ids)
        finally:
            os.umask(old)
        assert oct(os.stat(tmp_path / "a" / "traces").st_mode & 0o777) == "0o700"
        assert oct(os.stat(t.path).st_mode & 0o777) == "0o600"


_LOADED = "print(sorted(k for k in sys.modules if k.startswith(('spectrace', '_spectrace'))))"


def test_bootstrap_off_runs_a_model_and_writes_nothing(tmp_path: Path) -> None:
    """SPECTRACE unset (SPECTRACE_DIR set): no spectrace module loads, a model run leaves no file."""
    env = _quiet_env()
    env["SPECTRACE_DIR"] = str(tmp_path / "t")
    code = f"import sys, torch\nm = torch.nn.Linear(2, 2)\nm(torch.ones(1, 2))\n{_LOADED}\n"
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert out.stderr == "" and not (tmp_path / "t").exists()


@pytest.mark.parametrize("value", ["", "0", "off", "false", "no"])
def test_bootstrap_false_values_import_nothing(value: str) -> None:
    env = {**_quiet_env(), "SPECTRACE": value}
    out = subprocess.run([PY, "-c", f"import sys; {_LOADED}"], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]" and out.stderr == "", out.stdout + out.stderr


def test_bootstrap_is_live_when_on() -> None:
    """The control: the same interpreter with SPECTRACE=1 does activate (so "nothing" above is the hook's choice)."""
    env = {**_quiet_env(), "SPECTRACE": "1", "SPECTRACE_QUIET": "1"}
    code = "import sys; print('spectrace.runtime' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


# ============================================================================== script
def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tests/recorder/test_reliability.py", description="figures for RELIABILITY.md")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("soak", help="N module calls with a small record cap")
    p.add_argument("calls", type=int)
    p.add_argument("--cap", type=int, default=1000)
    p.add_argument("--stats", default="basic")
    k = sub.add_parser("kill", help="SIGKILL writers at random moments")
    k.add_argument("--writers", type=int, default=4)
    k.add_argument("--rounds", type=int, default=5)
    k.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import tempfile

    global Recorder, Settings, RECORD_ADAPTER, Call, TensorMeta
    from spectrace.recorder import Recorder
    from spectrace.records import RECORD_ADAPTER, Call, TensorMeta
    from spectrace.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        if args.cmd == "soak":
            fig = soak(args.calls, args.cap, tmp, stats=args.stats)
            from spectrace.viewers.loader import load_traces

            ts = load_traces(tmp)
            fig["viewer_records_dropped"] = max(s.records_dropped for s in ts.all("counters"))
            fig["file"] = os.path.basename(fig["file"])
        else:
            fig = kill_writers(Path(tmp) / "traces", writers=args.writers, rounds=args.rounds, seed=args.seed)
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


def test_per_step_records_past_the_memory_cap_still_reach_the_file(tmp_path: Path, monkeypatch) -> None:
    """A long-running server emits one acceptance record per verify step: memory stays
    bounded, the file keeps every one, and only a memory-only recorder counts losses."""
    from spectrace.recorder import memory as recorder_module
    from spectrace.records import Acceptance

    monkeypatch.setattr(recorder_module, "IMPORTANT_CAP", 50)
    with_file = Recorder(Settings(quiet=True), directory=str(tmp_path / "t"), name="trace-x.jsonl")
    memory_only = Recorder(Settings(quiet=True))
    for step in range(200):
        record = Acceptance(step=step, accept_lengths=[2], draft_tokens=3, accepted_per_position=[1, 0, 0])
        with_file.emit(record)
        memory_only.emit(record)
    with_file.close()
    lines = (tmp_path / "t" / "trace-x.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if '"acceptance"' in line]
    assert steps == list(range(200)) and with_file.counters.records_dropped == 0 and len(with_file.important) == 50
    assert len(memory_only.important) == 50 and memory_only.counters.records_dropped == 150


def test_per_step_records_kept_in_memory_add_no_garbage_collector_work() -> None:
    """Acceptance records (one per verify step of a server) are kept as JSON text, which
    the garbage collector does not track, and read back as the records that were emitted,
    in emission order among the other records."""
    import gc

    from spectrace.recorder import Recorder
    from spectrace.records import Acceptance, Finding
    from spectrace.rules.catalogue import finding
    from spectrace.settings import Settings

    rec = Recorder(Settings(quiet=True))
    first = Acceptance(step=0, accept_lengths=[2, 4], draft_tokens=3, accepted_per_position=[2, 1, 1])
    rec.emit(first)
    rec.emit(finding("fc_bypass", "fc skipped", module="draft.fc"))
    rec.emit(Acceptance(step=1, accept_lengths=[1], draft_tokens=3, accepted_per_position=[0, 0, 0]))
    kept = [r for r in rec.important if not isinstance(r, Finding)]
    assert len(kept) == 2 and not any(gc.is_tracked(r) for r in kept)
    records = rec.records()
    assert [type(r).__name__ for r in records] == ["Acceptance", "Finding", "Acceptance"]
    assert records[0] == first and records[2].step == 1
    assert [f.code for f in rec.findings()] == ["fc_bypass"]

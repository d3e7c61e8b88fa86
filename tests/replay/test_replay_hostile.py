"""``spectrace replay`` on replay files nobody should trust: bounded before a tensor is read.

The reader checks the writer's own limits (``spectrace.replay.file``: forwards, rows, bytes,
dtypes, shapes) from the safetensors header alone; a file past them is one line and exit 2.
Real files only: the reference draft's own replay file, and files built from it. RELIABILITY.md
lists each case with its test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

from spectrace.cli.replay import main as replay_main
from spectrace.replay.file import MAX_BYTES, MAX_FORWARDS, MAX_ROWS
from tests.helpers import paths
from tests.replay.test_replay import _checkpoint, _serve_reference

NAME = "trace-h-1.replay.safetensors"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
    """The reference draft's own replay file: (its metadata, its tensors) and a checkpoint."""
    tmp = tmp_path_factory.mktemp("served")
    trace = _serve_reference(tmp)
    with safe_open(str(trace / NAME), "pt") as handle:
        meta = json.loads((handle.metadata() or {})["spectrace"])
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    return meta, tensors, _checkpoint(tmp / "ckpt")


def _write(folder: Path, name: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(save(tensors, metadata={"spectrace": json.dumps(meta)}))
    return path


def _raw(path: Path, header: dict[str, Any], data_bytes: int) -> None:
    """A safetensors file whose header declares ``data_bytes`` of data that are holes (sparse)."""
    blob = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + data_bytes)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err and "Traceback" not in err, err
    return err


LARGE = textwrap.dedent(
    r"""
    import re, sys
    sys.path.insert(0, sys.argv[1])
    from spectrace.cli.replay import main
    codes = [main([f, "--draft", sys.argv[2]]) for f in sys.argv[3:]]
    # The child's own peak (ru_maxrss would carry the parent's from before the exec).
    print(codes, int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) // 1024)
    """
)


def test_files_past_the_writers_limits_are_refused_before_loading(
    served: tuple[dict[str, Any], dict[str, torch.Tensor], Path], tmp_path: Path
) -> None:
    meta, tensors, ckpt = served
    base = sys.executable
    # 1. A 4 KiB sparse file declaring 1.3 GiB of one tensor.
    sparse = tmp_path / "sparse" / NAME
    sparse.parent.mkdir()
    huge = 1_300 << 20
    header = {
        "__metadata__": {"spectrace": json.dumps(meta)},
        "fwd0.hidden_in": {"dtype": "F32", "shape": [6, huge // 24], "data_offsets": [0, huge // 24 * 24]},
    }
    _raw(sparse, header, huge // 24 * 24)
    assert os.stat(sparse).st_blocks * 512 <= 64 << 10
    # 2. 8,000 rows of real data (the writer keeps at most MAX_ROWS).
    rows = dict(meta, rows=8000, forwards=[dict(meta["forwards"][0], rows=8000, keys=["input_ids", "hidden_in", "fc_out"])])
    g = torch.Generator().manual_seed(0)
    _write(
        tmp_path / "rows",
        NAME,
        rows,
        {
            "fwd0.input_ids": torch.zeros(8000, dtype=torch.long),
            "fwd0.hidden_in": torch.randn(8000, 192, generator=g),
            "fwd0.fc_out": torch.randn(8000, 64, generator=g),
        },
    )
    # 3. A file claiming 100,000 forwards (a header of a few MiB).
    many = dict(meta, forwards=[{"step": 0, "draft_call": i, "rows": 1} for i in range(100_000)])
    _write(tmp_path / "many", NAME, many, {})
    # 4. Five small forwards (the writer keeps at most MAX_FORWARDS).
    five = dict(meta, forwards=[dict(meta["forwards"][0], draft_call=i, keys=["input_ids"]) for i in range(MAX_FORWARDS + 1)])
    _write(tmp_path / "five", NAME, five, {f"fwd{i}.input_ids": tensors["fwd0.input_ids"].clone() for i in range(MAX_FORWARDS + 1)})
    files = [str(tmp_path / d / NAME) for d in ("sparse", "rows", "many", "five")]
    run = subprocess.run(
        [base, "-c", LARGE, str(paths.ROOT), str(ckpt), *files],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stderr
    codes, peak_mib = run.stdout.split("] ")
    assert codes == "[2, 2, 2, 2", run.stdout + run.stderr
    assert int(peak_mib) < 500, f"peak {peak_mib} MiB"
    lines = run.stderr.splitlines()
    assert len(lines) == 4 and not any("internal error" in line for line in lines), run.stderr
    assert "at most 64 MiB" in lines[0] and "8000 rows" in lines[1] and "header" in lines[2] and f"at most {MAX_FORWARDS}" in lines[3]
    assert MAX_BYTES == 64 << 20 and MAX_ROWS == 256  # the writer's limits, shared


@pytest.mark.parametrize(
    "case, said",
    [
        ("shape", "the metadata says 6 rows"),
        ("width", "other hidden states are 64 wide"),
        ("int8", "must be a floating dtype"),
        ("nothing", "nothing was compared"),
    ],
)
def test_a_malformed_small_file_is_one_line_never_a_verdict(
    served: tuple[dict[str, Any], dict[str, torch.Tensor], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, said: str
) -> None:
    meta, tensors, ckpt = served
    tensors = dict(tensors)
    if case == "shape":  # rows that disagree with the metadata's
        tensors["fwd0.layer_out"] = tensors["fwd0.layer_out"][:5]
    elif case == "width":  # a layer output 32 wide where the layer read 64
        tensors["fwd0.layer_out"] = tensors["fwd0.layer_out"][:, :32].contiguous()
    elif case == "int8":  # an integer fused input would compare as a false "fc DIVERGES"
        tensors["fwd0.hidden_in"] = tensors["fwd0.hidden_in"].to(torch.int8)
    else:  # only the ids: no module has both sides
        meta = dict(meta, forwards=[dict(meta["forwards"][0], keys=["input_ids"])])
        tensors = {"fwd0.input_ids": tensors["fwd0.input_ids"]}
    path = _write(tmp_path / "t", NAME, meta, tensors)
    assert replay_main([str(path.parent), "--draft", str(ckpt)]) == 2
    err = _one_line(capsys)
    assert said in err, err
    assert "matches its checkpoint" not in capsys.readouterr().out


def test_the_trace_s_own_file_and_the_latest_written_are_replayed(
    served: tuple[dict[str, Any], dict[str, torch.Tensor], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta, tensors, ckpt = served
    ids_only = (dict(meta, forwards=[dict(meta["forwards"][0], keys=["input_ids"])]), {"fwd0.input_ids": tensors["fwd0.input_ids"]})
    good = _write(tmp_path, "trace-h-1.replay.safetensors", meta, tensors)
    other = _write(tmp_path, "trace-h-12.replay.safetensors", *ids_only)  # another process's: a name that starts the same
    (tmp_path / "trace-h-1.jsonl").write_text("")
    os.utime(good, (1_000, 1_000))
    assert replay_main([str(tmp_path / "trace-h-1.jsonl"), "--draft", str(ckpt)]) == 0
    assert "matches its checkpoint" in capsys.readouterr().out
    assert replay_main([str(tmp_path), "--draft", str(ckpt)]) == 2  # the folder: trace-h-12 is the latest written
    capsys.readouterr()
    # The latest by the time written, not by name: trace-h-10 over trace-h-9.
    folder = tmp_path / "latest"
    old = _write(folder, "trace-h-9.replay.safetensors", *ids_only)
    new = _write(folder, "trace-h-10.replay.safetensors", meta, tensors)
    os.utime(old, (1_000, 1_000))
    os.utime(new, (2_000, 2_000))
    assert replay_main([str(folder), "--draft", str(ckpt)]) == 0
    assert "matches its checkpoint" in capsys.readouterr().out
    assert other.exists()


def test_a_forward_past_the_cap_is_counted_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spectrace.eagle3.pair import load_draft
    from spectrace.hooks.replay_capture import keep_replay
    from spectrace.recorder import Recorder
    from spectrace.records import Coverage
    from spectrace.replay.file import read_replay
    from spectrace.settings import Settings

    draft = load_draft()
    rec = Recorder(Settings(flush_seconds=3600, quiet=True), directory=str(tmp_path / "t"))
    capture = keep_replay(draft, rows=6, recorder=rec)
    g = torch.Generator().manual_seed(0)
    ids, fused = torch.randint(0, 128, (10,), generator=g), torch.randn(10, 192, generator=g)
    capture.bytes = MAX_BYTES - 1_000  # as if earlier forwards had filled the cap: this one would pass it
    with torch.no_grad():
        draft(ids, fused, torch.arange(10))
        draft(ids, fused, torch.arange(10))
    assert capture.kept == [] and len(capture.too_large) == 1
    said = [r for r in rec.records() if isinstance(r, Coverage) and "not kept" in r.detail]
    assert len(said) == 1 and "cap is 64.0 MiB" in said[0].detail and "SPECTRACE_REPLAY_ROWS" in said[0].detail
    rec.close()
    (path,) = (tmp_path / "t").glob("*.replay.safetensors")
    meta, forwards = read_replay(str(path))
    assert forwards == [] and meta.too_large == capture.too_large
    ckpt = _checkpoint(tmp_path / "ckpt")
    assert replay_main([str(tmp_path / "t"), "--draft", str(ckpt)]) == 2
    err = _one_line(capsys)
    assert "passed the 64 MiB cap" in err and "SPECTRACE_REPLAY=1" not in err

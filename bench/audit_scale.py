"""How ``spectrace audit`` scales with hostile checkpoints: time, peak memory, output size.

    python bench/audit_scale.py [--tensors 2000,20000,200000]

Each case is a real checkpoint folder in a temporary directory: safetensors written by the
``safetensors`` library (N unrelated tensor names, which SGLang drops), a hand-made 3 MB
header whose one shape has a million dims, and a 1 MB zip ``.bin`` whose deflated
``data.pkl`` would inflate to 1 GB (written as a stream: this script never holds it). Each audit runs in its own process, so its peak
RSS is its own. Prints one JSON object per case.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "fixtures" / "specforge_tiny" / "config.json"
CHILD = """
import contextlib, io, json, sys, time
from spectrace.cli.audit import main
out = io.StringIO()
start = time.perf_counter()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    code = main(sys.argv[1:])
text = out.getvalue()
print(json.dumps({"exit": code, "seconds": round(time.perf_counter() - start, 2),
                  # VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork and exec
                  "peak_rss_mb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) // 1024,
                  "output_lines": text.count("\\n"), "output_bytes": len(text)}))
"""


def folder(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir()
    shutil.copyfile(CONFIG, path / "config.json")
    return path


def unrelated_tensors(tmp: Path, n: int) -> Path:
    path = folder(tmp, f"tensors-{n}")
    save_file({f"junk{i}.weight": torch.zeros(1) for i in range(n)}, str(path / "model.safetensors"))
    return path


def long_shape(tmp: Path) -> Path:
    path = folder(tmp, "long-shape")
    raw = json.dumps({"a": {"dtype": "F32", "shape": [2] * 1_000_000, "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    return path


def deflated_pickle(tmp: Path, inflated: int = 1 << 30) -> Path:
    path = folder(tmp, "deflated-pickle")
    honest = io.BytesIO()
    torch.save({"fc.weight": torch.zeros(2, 2)}, honest)
    chunk = b"\0" * (1 << 20)
    with zipfile.ZipFile(io.BytesIO(honest.getvalue())) as zin, zipfile.ZipFile(path / "pytorch_model.bin", "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith("/data.pkl"):
                zout.writestr(info.filename, zin.read(info), compress_type=zipfile.ZIP_DEFLATED)
                continue
            entry = zipfile.ZipInfo(info.filename)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with zout.open(entry, "w", force_zip64=True) as member:
                # pickle protocol 4: BINBYTES8 <length> <bytes> STOP, one bytes object of `inflated` zeros
                member.write(b"\x80\x04\x8e" + struct.pack("<Q", inflated))
                for _ in range(inflated // len(chunk)):
                    member.write(chunk)
                member.write(b".")
    return path


def audit(path: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), *args], capture_output=True, text=True, env=env, timeout=600)
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", default="2000,20000,200000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cases = [(f"{n} unrelated tensors", unrelated_tensors(tmp, int(n))) for n in args.tensors.split(",")]
        cases += [("3 MB header, one shape of 1M dims", long_shape(tmp)), ("zip .bin, deflated data.pkl", deflated_pickle(tmp))]
        for label, path in cases:
            size = sum(f.stat().st_size for f in path.iterdir())
            for mode in ((), ("--json",)):
                print(json.dumps({"case": label, "mode": "json" if mode else "table", "input_bytes": size, **audit(path, *mode)}))


if __name__ == "__main__":
    main()

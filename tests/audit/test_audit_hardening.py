"""``spectrace audit`` against hostile checkpoints: bounded work, clean errors, no reads outside the folder.

Work bounds are checked by counting (findings, printed lines, name comparisons,
``torch.load`` calls), never by timing; ``bench/audit_scale.py`` shows the times.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from spectrace.audit.checkpoint import (
    DTYPE_BITS,
    MAX_AUX_IDS,
    MAX_INT_DIGITS,
    MAX_PICKLE_BYTES,
    MAX_SHAPE_RANK,
    AuditInputError,
    read_checkpoint,
    read_safetensors_header,
    read_torch_bin,
)
from spectrace.checks.checkpoint import audit
from spectrace.checks.load_replay import MAX_DROPPED_FINDINGS, RenameHints
from spectrace.checks.weights import rename_map
from spectrace.cli import audit as command
from spectrace.rules.engines import get_engine
from tests.helpers import paths

ROOT = paths.ROOT
FIX = paths.FIXTURES
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"
BASE_CONFIG = json.loads((SPECFORGE / "config.json").read_text())
CLI = "import sys; from spectrace.cli.audit import main; sys.exit(main(sys.argv[1:]))"
FUZZ = settings(max_examples=int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "500")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


def run_cli(*args: object) -> subprocess.CompletedProcess[bytes]:
    """The audit in a child process with a real (UTF-8) stdout; bytes back, so nothing is decoded for us."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    argv = [os.fsencode(a) if isinstance(a, (str, Path)) else str(a).encode() for a in args]
    return subprocess.run([os.fsencode(sys.executable), b"-c", CLI.encode(), *argv], capture_output=True, env=env, timeout=120)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = command.main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_clean_error(code: int, out: str, err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert lines[0].startswith("spectrace audit: error: ") and "internal error" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def draft_dir(tmp: Path, *, config: dict[str, Any] | None = None, name: str = "draft") -> Path:
    """A real checkpoint folder: the fixture's config (or ``config``) and a copy of its weights."""
    draft = tmp / name
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(BASE_CONFIG if config is None else config))
    shutil.copyfile(SPECFORGE / "model.safetensors", draft / "model.safetensors")
    return draft


def write_header(path: Path, header: bytes | dict[str, Any], data: int = 0) -> None:
    """A safetensors file with a hand-made header (the library refuses to write a hostile one)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + data)


# ============================================================ 11. work bounded by the input


class CountingName(str):
    """A tensor name that counts its equality tests: a list scan pays one per element."""

    compared = 0
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        CountingName.compared += 1
        return str.__eq__(self, other)


def test_name_lookups_are_linear_in_the_tensor_count() -> None:
    """``name not in replay.dropped`` on a list made the summary quadratic: 20k tensors 14.7 s, 200k never ended."""
    n = 3000
    cfg = read_checkpoint(SPECFORGE).config
    tensors = read_checkpoint(SPECFORGE).tensors
    info = next(iter(tensors.values()))
    hostile = {CountingName(f"junk{i}.weight"): info for i in range(n)}
    CountingName.compared = 0
    result = audit(cfg, {**tensors, **hostile}, get_engine("sglang"))
    assert len(result.summary["weights"]["dropped"]) == n
    assert CountingName.compared <= 4 * n, CountingName.compared  # a list scan costs n * n / 2 = 4.5M


def _brute_force_hint(name: str, candidates: list[str]) -> tuple[str, str] | None:
    """The rename hint as first written: every candidate scanned for every name."""
    parts = name.split(".")
    best: tuple[int, str, str] | None = None
    for cand in candidates:
        cparts = cand.split(".")
        k = 0
        while k < min(len(parts), len(cparts)) and parts[-1 - k] == cparts[-1 - k]:
            k += 1
        if k < 2 or k == len(parts) and k == len(cparts):
            continue
        src, dst = ".".join(parts[: len(parts) - k]), ".".join(cparts[: len(cparts) - k])
        if best is None or k > best[0]:
            best = (k, src, dst)
    return (best[1], best[2]) if best else None


_part = st.sampled_from(["model", "layers", "0", "1", "midlayer", "mlp", "up_proj", "weight", "fc", "norm", ""])
_dotted = st.lists(_part, min_size=1, max_size=6).map(".".join)


@FUZZ
@given(names=st.lists(_dotted, max_size=12), candidates=st.lists(_dotted, max_size=12))
def test_indexed_rename_hints_equal_the_full_scan(names: list[str], candidates: list[str]) -> None:
    hints = RenameHints(candidates)
    for name in names:
        assert hints(name) == _brute_force_hint(name, candidates), (name, candidates)


def _many_tensors(tmp: Path, n: int) -> Path:
    draft = tmp / f"draft{n}"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(BASE_CONFIG))
    state = load_file(str(SPECFORGE / "model.safetensors"))
    state.update({f"junk{i}.weight": torch.zeros(1) for i in range(n)})
    save_file(state, str(draft / "model.safetensors"))
    return draft


def test_unrelated_tensors_give_a_report_of_bounded_size(tmp_path: Path) -> None:
    """20,000 unrelated names were 20,000 findings and 160,000 printed lines; now the report's size does not grow."""
    lines = {}
    for n in (40, 4000):
        code, out, err = run_main([str(_many_tensors(tmp_path, n))])
        assert code == 1 and err == "", err
        lines[n] = out.count("\n")
        report = json.loads(run_main([str(tmp_path / f"draft{n}"), "--json"])[1])
        dropped = [f for f in report["findings"] if f["code"] == "weights_dropped"]
        assert len(dropped) == MAX_DROPPED_FINDINGS  # 15 groups and one for the rest
        assert sum(len(f["evidence"]["tensors"]) for f in dropped) == n  # nothing lost: every name is in the evidence
        assert f"{n - 15} more tensor(s), in {n - 15} other groups" in dropped[-1]["message"]
    assert lines[4000] <= lines[40] + 5, lines  # longer counts may wrap a line or two, no more


def test_a_rename_over_many_layers_is_one_finding(tmp_path: Path) -> None:
    """A rename is found for every name from one index: 2,000 renamed layers give one grouped finding."""
    layers = 2000
    config = {**BASE_CONFIG, "num_hidden_layers": layers}
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(config))
    save_file({f"decoder.{i}.mlp.down_proj.weight": torch.zeros(1) for i in range(layers)}, str(draft / "model.safetensors"))
    code, out, err = run_main([str(draft), "--json"])
    report = json.loads(out)
    renames = [f for f in report["findings"] if f["code"] == "weights_dropped" and "rename" in f["evidence"]]
    assert len(renames) == 1 and renames[0]["evidence"]["rename"] == {"from": "decoder.", "to": "layers."}
    assert len(renames[0]["evidence"]["tensors"]) == layers


def test_table_shows_a_bounded_number_of_findings_and_says_how_many_it_left_out(tmp_path: Path) -> None:
    """A 300-layer draft with none of its layers: 300 weights_missing findings, the table shows 40."""
    draft = draft_dir(tmp_path, config={**BASE_CONFIG, "num_hidden_layers": 300})
    report = json.loads(run_main([str(draft), "--json"])[1])
    total = len(report["findings"])
    assert total > command.MAX_TABLE_FINDINGS
    code, out, err = run_main([str(draft)])
    assert code == 1 and err == ""
    assert f"{total - command.MAX_TABLE_FINDINGS} more findings left out of the table; --json lists all {total}" in out
    assert out.count("weights_missing") == command.MAX_TABLE_FINDINGS - sum(
        f["code"] != "weights_missing" for f in report["findings"][: command.MAX_TABLE_FINDINGS]
    )


def test_long_shape_is_refused_by_its_rank(tmp_path: Path) -> None:
    """math.prod over a million dims took 1 min 46 s on a 4 MB header."""
    path = tmp_path / "model.safetensors"
    write_header(path, {"a": {"dtype": "F32", "shape": [2] * 1_000_000, "data_offsets": [0, 4]}}, data=4)
    with pytest.raises(AuditInputError, match=f"1000000 dimensions \\(limit {MAX_SHAPE_RANK}\\)"):
        read_safetensors_header(path)


def test_byte_count_stops_once_past_the_data(tmp_path: Path) -> None:
    """64 dims of 99 digits: the product is cut short, the error is one short line."""
    path = tmp_path / "model.safetensors"
    write_header(path, {"a": {"dtype": "F4", "shape": [10**98] * MAX_SHAPE_RANK, "data_offsets": [0, 4]}}, data=4)
    with pytest.raises(AuditInputError, match="does not match its 4 bytes") as info:
        read_safetensors_header(path)
    assert len(str(info.value)) < 300


def test_f4_and_f6_sizes_are_exact_integers(tmp_path: Path) -> None:
    """F4 is half a byte: sizes are counted in bits, rounded up, with no float on the way."""
    path = tmp_path / "model.safetensors"
    write_header(
        path,
        {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}, "b": {"dtype": "F6_E2M3", "shape": [5], "data_offsets": [2, 6]}},
        data=6,
    )
    assert {k: v.shape for k, v in read_safetensors_header(path).items()} == {"a": [3], "b": [5]}
    assert DTYPE_BITS["F4"] == 4 and DTYPE_BITS["F6_E2M3"] == 6


def _torch_zip(path: Path, *, pickle_bytes: bytes | None = None, compress: int = zipfile.ZIP_DEFLATED) -> None:
    """A real torch.save zip, rewritten with compressed records (and optionally another data.pkl)."""
    honest = io.BytesIO()
    torch.save({"fc.weight": torch.zeros(4, 4), "norm.weight": torch.ones(4)}, honest)
    with zipfile.ZipFile(io.BytesIO(honest.getvalue())) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if pickle_bytes is not None and info.filename.endswith("/data.pkl"):
                data = pickle_bytes
            zout.writestr(info.filename, data, compress_type=compress)


def test_deflated_pickle_is_refused_by_its_declared_size_before_torch_inflates_it(tmp_path: Path, monkeypatch) -> None:
    """A 3 MB .bin whose deflated data.pkl inflates to gigabytes took 6.4 GB of RSS."""
    path = tmp_path / "pytorch_model.bin"
    _torch_zip(path, pickle_bytes=pickle.dumps(b"\0" * (MAX_PICKLE_BYTES + 1), protocol=4))
    assert path.stat().st_size < MAX_PICKLE_BYTES // 100
    calls: list[Any] = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    with pytest.raises(AuditInputError, match="compressed record of .* bytes once inflated"):
        read_torch_bin(path)
    assert calls == []  # refused from the zip directory: torch never read the record


def test_a_record_that_understates_its_size_is_read_no_further(tmp_path: Path) -> None:
    """The check trusts the zip directory's sizes because torch allocates by them: a data.pkl
    that claims 1,000 bytes and inflates to 300 MB is read up to 1,000 bytes and refused."""
    path = tmp_path / "pytorch_model.bin"
    honest = io.BytesIO()
    torch.save({"fc.weight": torch.zeros(2, 2)}, honest)
    inflated, chunk = 300 << 20, b"\0" * (1 << 20)
    with zipfile.ZipFile(io.BytesIO(honest.getvalue())) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith("/data.pkl"):
                zout.writestr(info.filename, zin.read(info))
                continue
            entry = zipfile.ZipInfo(info.filename)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with zout.open(entry, "w") as member:  # streamed: this test never holds 300 MB
                member.write(b"\x80\x04\x8e" + struct.pack("<Q", inflated))
                for _ in range(inflated // len(chunk)):
                    member.write(chunk)
                member.write(b".")
    raw = bytearray(path.read_bytes())
    central = raw.find(b"PK\x01\x02")  # the zip directory's entries; find data.pkl's
    while not raw[central + 46 :].startswith(b"archive/data.pkl"):
        central = raw.find(b"PK\x01\x02", central + 4)
    assert struct.unpack_from("<I", raw, central + 24)[0] > MAX_PICKLE_BYTES  # the true size, before the lie
    struct.pack_into("<I", raw, central + 24, 1000)
    path.write_bytes(bytes(raw))
    probe = (
        "import sys; from pathlib import Path; from spectrace.audit.checkpoint import AuditInputError, read_torch_bin\n"
        "hwm = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) // 1024\n"
        "import torch; before = hwm()\n"
        "try: read_torch_bin(Path(sys.argv[1])); print('read')\n"
        "except AuditInputError as err: print('refused', hwm() - before)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=env, timeout=120)
    verdict, grew_mb = out.stdout.split()
    assert verdict == "refused" and int(grew_mb) < 100, out.stdout  # 300 MB inflated would show here


def test_zip_of_an_unknown_version_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: zipfile raises NotImplementedError ("zip file version 6.4"), not BadZipFile."""
    path = tmp_path / "pytorch_model.bin"
    torch.save({"fc.weight": torch.zeros(4, 4)}, path)
    raw = bytearray(path.read_bytes())
    central = raw.find(b"PK\x01\x02")
    struct.pack_into("<H", raw, central + 6, 64)  # "version needed to extract": 6.4
    path.write_bytes(bytes(raw))
    with pytest.raises(AuditInputError, match="not a readable zip archive"):
        read_torch_bin(path)


def test_deflated_honest_zip_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    _torch_zip(path)
    assert {k: v.shape for k, v in read_torch_bin(path).items()} == {"fc.weight": [4, 4], "norm.weight": [4]}


def test_zip_bin_goes_through_the_weights_only_loader_once(tmp_path: Path, monkeypatch) -> None:
    """No fallback to an unmapped load for a zip: that path would inflate every storage into memory."""
    seen: list[dict[str, Any]] = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k) or real(*a, **k))
    path = tmp_path / "pytorch_model.bin"
    _torch_zip(path, pickle_bytes=b"not a pickle")
    with pytest.raises(AuditInputError):
        read_torch_bin(path)
    assert [(k["weights_only"], k["mmap"]) for k in seen] == [(True, True)]


def test_thousands_of_aux_ids_are_refused(tmp_path: Path) -> None:
    """100,000 ids took 19.6 s and printed 25 MB."""
    ids = [i % 5 for i in range(100_000)]
    config = {**BASE_CONFIG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}
    assert_clean_error(*run_main([str(draft_dir(tmp_path, config=config))]), "holds 100000 ids", f"limit {MAX_AUX_IDS}")


def test_the_most_aux_ids_give_a_report_of_bounded_size(tmp_path: Path) -> None:
    ids = list(range(MAX_AUX_IDS))
    config = {**BASE_CONFIG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}
    code, out, err = run_main([str(draft_dir(tmp_path, config=config)), "--target-config", str(TARGET)])
    assert code in (0, 1) and err == ""
    assert len(out) < 100_000


# ============================================================ 12. clean errors


@pytest.mark.parametrize("dtype", [["F32"], {"F32": 1}, 32, None, True])
def test_dtype_of_another_json_type_is_a_clean_error(tmp_path: Path, dtype: Any) -> None:
    draft = draft_dir(tmp_path)
    write_header(draft / "model.safetensors", {"fc.weight": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}, data=4)
    assert_clean_error(*run_main([str(draft)]), "unknown dtype")


@pytest.mark.parametrize("digits", [MAX_INT_DIGITS + 1, 201, 4301, 50_000])
def test_long_integer_in_a_header_is_a_clean_error(tmp_path: Path, digits: int) -> None:
    """An F4 shape of 10**200, or any integer past Python's 4,300-digit int() limit."""
    draft = draft_dir(tmp_path)
    raw = b'{"fc.weight": {"dtype": "F4", "shape": [1' + b"0" * (digits - 1) + b'], "data_offsets": [0, 4]}}'
    write_header(draft / "model.safetensors", raw, data=4)
    assert_clean_error(*run_main([str(draft)]), f"integer of more than {MAX_INT_DIGITS} digits")


@pytest.mark.parametrize("where", ["draft", "target"])
def test_long_integer_in_a_config_is_a_clean_error(tmp_path: Path, where: str) -> None:
    draft = draft_dir(tmp_path)
    target = tmp_path / "target.json"
    target.write_text(TARGET.read_text())
    victim = draft / "config.json" if where == "draft" else target
    victim.write_text(victim.read_text().replace('"hidden_size": 64', '"hidden_size": ' + "7" * 5000, 1))
    assert "7" * 5000 in victim.read_text()
    assert_clean_error(*run_main([str(draft), "--target-config", str(target)]), f"integer of more than {MAX_INT_DIGITS} digits")


_big = st.one_of(st.integers(-(10**99), 10**99), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2, 4, 16]))
_jsonish = st.recursive(
    st.one_of(st.none(), st.booleans(), _big, st.floats(allow_nan=False), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=8,
)
_hostile_entry = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from(sorted(DTYPE_BITS)), _jsonish),
        "shape": st.one_of(st.lists(_big, max_size=6), _jsonish),
        "data_offsets": st.one_of(st.lists(_big, min_size=2, max_size=2), st.tuples(st.just(0), st.integers(0, 64)).map(list)),
    }
)


@FUZZ
@given(entries=st.dictionaries(st.text(max_size=8), st.one_of(_hostile_entry, _jsonish), max_size=4), long_int=st.booleans())
def test_any_header_types_give_a_result_or_one_clean_line(tmp_path_factory, entries: dict[str, Any], long_int: bool) -> None:
    """dtypes, shapes and offsets of every JSON type, integers up to 100 digits (and past it)."""
    draft = draft_dir(tmp_path_factory.mktemp("hdr"))
    raw = json.dumps(entries).encode()
    if long_int:
        raw = raw[:-1] + (b", " if entries else b"") + b'"x": ' + b"9" * 5000 + b"}"
    write_header(draft / "model.safetensors", raw, data=64)
    code, out, err = run_main([str(draft), "--json"])
    if code == 2:
        assert_clean_error(code, out, err)
        assert len(err) < 2000
    else:
        assert err == "" and not long_int
        assert set(json.loads(out)["checkpoint"]["tensors"]) <= set(entries)


# Lone surrogates (which st.characters never draws), any other character, and JSON's own specials.
_name_char = st.one_of(st.integers(0xD800, 0xDFFF).map(chr), st.characters(), st.sampled_from('."\\\n'))


@FUZZ
@given(names=st.lists(st.text(_name_char, min_size=1, max_size=6), min_size=1, max_size=4, unique=True))
def test_json_output_is_valid_and_exact_for_any_tensor_name(tmp_path_factory, names: list[str]) -> None:
    """A "\\ud800" tensor name made pydantic's encoder fail: the names come back exactly as the header had them."""
    draft = draft_dir(tmp_path_factory.mktemp("names"))
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    raw = json.dumps(header).encode()  # ensure_ascii: surrogates as \\udXXX escapes, a valid safetensors header
    write_header(draft / "model.safetensors", raw, data=4 * len(names))
    code, out, err = run_main([str(draft), "--json"])
    assert code in (0, 1) and err == "", err
    assert set(json.loads(out)["checkpoint"]["tensors"]) == set(json.loads(raw))


def test_surrogate_tensor_name_in_a_real_process(tmp_path: Path) -> None:
    """--json through a real UTF-8 stdout stays valid; the table prints the name escaped."""
    draft = draft_dir(tmp_path)
    write_header(draft / "model.safetensors", {"\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, data=4)
    proc = run_cli(draft, "--json")
    assert proc.returncode == 1 and proc.stderr == b"", proc.stderr
    report = json.loads(proc.stdout.decode("utf-8"))  # strict UTF-8: no raw surrogate was written
    assert list(report["checkpoint"]["tensors"]) == ["\ud800"]
    table = run_cli(draft)
    assert table.returncode == 1 and table.stderr == b"", table.stderr
    assert b"\\ud800" in table.stdout


def test_non_utf8_folder_and_file_names(tmp_path: Path) -> None:
    """Undecodable bytes in names broke --json; they come back as \\udcXX escapes that os.fsencode undoes."""
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/draft-\xff\xfe"))
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BASE_CONFIG))
    weights = Path(os.fsdecode(os.fsencode(folder) + b"/model-\xe9.safetensors"))
    shutil.copyfile(SPECFORGE / "model.safetensors", weights)
    proc = run_cli(folder, "--json", "--target-config", TARGET)
    assert proc.returncode in (0, 1) and proc.stderr == b"", proc.stderr
    report = json.loads(proc.stdout.decode("utf-8"))
    assert os.fsencode(report["checkpoint"]["path"]) == os.fsencode(folder)
    assert [os.fsencode(f) for f in report["checkpoint"]["files"]] == [b"model-\xe9.safetensors"]
    table = run_cli(folder, "--target-config", TARGET)
    assert table.returncode in (0, 1) and table.stderr == b"", table.stderr
    assert b"draft-\\udcff\\udcfe" in table.stdout


# ============================================================ 13. nothing read from outside the folder


def _first_bytes_as_length(path: Path) -> int:
    with open(path, "rb") as fh:
        return struct.unpack("<Q", fh.read(8))[0]


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "config.json"])
def test_link_out_of_the_folder_is_refused_unread(tmp_path: Path, name: str) -> None:
    """model.safetensors -> /etc/passwd quoted its first 8 bytes as a header length."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\nsecret-token-123\n")
    draft = draft_dir(tmp_path)
    if name != "config.json":
        (draft / "model.safetensors").unlink()
    (draft / name).unlink(missing_ok=True)
    os.symlink(secret, draft / name)
    code, out, err = run_main([str(draft)])
    assert_clean_error(code, out, err, name, "resolves outside the checkpoint folder")
    assert str(_first_bytes_as_length(secret)) not in err
    assert "root" not in err.replace(str(tmp_path), "") and "secret-token" not in err


def test_link_to_etc_passwd_is_refused(tmp_path: Path) -> None:
    passwd = Path("/etc/passwd")
    if not passwd.is_file():
        pytest.skip("no /etc/passwd")
    draft = draft_dir(tmp_path)
    (draft / "model.safetensors").unlink()
    os.symlink(passwd, draft / "model.safetensors")
    code, out, err = run_main([str(draft)])
    assert_clean_error(code, out, err, "resolves outside the checkpoint folder")
    assert str(_first_bytes_as_length(passwd)) not in err


def test_links_inside_the_folder_and_a_linked_folder_are_read(tmp_path: Path) -> None:
    draft = draft_dir(tmp_path)
    (draft / "weights").mkdir()
    (draft / "model.safetensors").rename(draft / "weights" / "real.safetensors")
    os.symlink("weights/real.safetensors", draft / "model.safetensors")
    os.symlink(draft, tmp_path / "alias")
    for path in (draft, tmp_path / "alias"):
        assert read_checkpoint(path).tensors["fc.weight"].shape == [64, 192]


def test_hugging_face_cache_snapshot_is_read(tmp_path: Path) -> None:
    """snapshots/<rev>/* link to ../../blobs/<hash>: the repository's blobs are inside the checkpoint."""
    repo = tmp_path / "models--org--draft"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    shutil.copyfile(SPECFORGE / "model.safetensors", repo / "blobs" / "aa11")
    shutil.copyfile(SPECFORGE / "config.json", repo / "blobs" / "bb22")
    os.symlink("../../blobs/aa11", snapshot / "model.safetensors")
    os.symlink("../../blobs/bb22", snapshot / "config.json")
    assert read_checkpoint(snapshot).tensors["fc.weight"].shape == [64, 192]
    # ...but not a link out of the repository.
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(SPECFORGE / "model.safetensors", outside)
    (snapshot / "model.safetensors").unlink()
    os.symlink(outside, snapshot / "model.safetensors")
    with pytest.raises(AuditInputError, match="outside the checkpoint folder"):
        read_checkpoint(snapshot)


def test_fifo_swapped_in_is_not_waited_on(tmp_path: Path) -> None:
    """The reader opens non-blocking and refuses anything but a regular file."""
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(AuditInputError, match="not a regular file"):
        read_safetensors_header(fifo)


@FUZZ
@given(claimed=st.integers(10**6, 2**64 - 1), body=st.binary(max_size=64))
def test_errors_never_quote_the_bytes_of_an_unparsed_file(tmp_path_factory, claimed: int, body: bytes) -> None:
    """Whatever the first 8 bytes say, the error does not repeat them."""
    path = tmp_path_factory.mktemp("q") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", claimed) + body)
    with pytest.raises(AuditInputError) as info:
        read_safetensors_header(path)
    assert str(claimed) not in str(info.value)


def test_rename_map_finds_the_rename_among_many_unrelated_names() -> None:
    """The runtime weights check: 20,000 unrelated names (each ending in "weight") do not drown the one rename."""
    dropped = [f"junk{i}.w.weight" for i in range(20_000)] + ["layers.0.mlp.up_proj.weight"]
    missing = [f"model.other{i}.x.weight" for i in range(20_000)] + ["model.midlayer.mlp.up_proj.weight"]
    assert rename_map(dropped, missing) == {"layers.0": "midlayer"}


def test_link_loop_is_a_clean_error(tmp_path: Path) -> None:
    loop = tmp_path / "model.safetensors"
    os.symlink(loop.name, loop)
    with pytest.raises(AuditInputError, match="resolves nowhere"):
        read_safetensors_header(loop)


@pytest.mark.parametrize("mode", [["--json"], []])
def test_stdout_closed_before_the_report_is_one_line_not_an_internal_error(tmp_path: Path, mode: list[str]) -> None:
    """`spectrace audit ... | head -1`: the reader went away (here before the first write, so the
    write surely breaks); said once on stderr, exit 2, no "internal error: SystemExit"."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CLI, str(SPECFORGE), "--target-config", str(TARGET), *mode],
            stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.decode().splitlines() == [
        "spectrace audit: error: stdout was closed before the whole report was written (e.g. piped into head)"
    ]

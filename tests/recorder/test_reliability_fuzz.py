"""Bad inputs, fuzzed: the trace loader, ``spectrace view`` and ``spectrace audit``.

The promise under test: any input gives records and counted problems (the loader), or a
result, or one line on stderr and exit status 2 (the commands); never a traceback, never
an internal error, never a read of more than the limits. Example counts are fixed
(``max_examples``) and RELIABILITY.md states them; ``--hypothesis-show-statistics``
prints what ran. The hand-written bad inputs live in test_viewer.py and test_audit.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrace.audit.checkpoint import (
    DTYPE_BYTES,
    MAX_CONFIG_BYTES,
    AuditInputError,
    read_safetensors_header,
    read_torch_bin,
)
from spectrace.cli import audit as command
from spectrace.cli.view import main as view_main
from spectrace.viewers.loader import load_traces
from tests.helpers import paths
from tests.helpers.traces import fc_bypass_records, header

FIX = paths.FIXTURES
SPECFORGE = FIX / "specforge_tiny"
TARGET = FIX / "target_llama_config.json"
FUZZ = settings(max_examples=int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "500")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


def _run(main: Any, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# ============================================================================ traces
GOOD = [r.model_dump_json().encode() for r in fc_bypass_records(steps=2)]

_piece = st.one_of(
    st.sampled_from(GOOD),  # a valid record
    st.sampled_from(GOOD).flatmap(lambda line: st.integers(1, len(line) - 1).map(lambda cut: line[:cut])),  # torn
    st.binary(max_size=200),  # random bytes
    st.sampled_from([
        b'{"type": "telemetry", "x": 1}', b'{"type": "call"}', b'{"type": "call", "step": "soon"}', b"[1, 2, 3]",
        b'"just a string"', b"null", b"{}", b'{"type": null}', b'{"type": ["call"]}', b"\x00\x00\x00",
        b'{"type": "stats", "records_dropped": -5}', b'{"type": "finding", "severity": "fatal"}',
        header(version=99).model_dump_json().encode(), b'{"type": "header", "schema_version": "two"}',
        b'{"type": "call", "step": 1e999}', b"NaN", b"{" * 5000, b"[" * 100_000,
    ]),
    st.sampled_from(GOOD).map(lambda line: line.replace(b'"call"', b'"call2"', 1)),  # future record type
    st.sampled_from(GOOD).map(lambda line: line[:-1] + b', "new_field": {"x": [1, 2]}}'),  # newer minor writer
)  # fmt: skip


@FUZZ
@given(pieces=st.lists(_piece, max_size=30), ending=st.sampled_from([b"\n", b"\r\n"]), final_newline=st.booleans())
def test_loader_and_view_never_fail_on_any_trace(tmp_path_factory, pieces: list[bytes], ending: bytes, final_newline: bool) -> None:
    folder = tmp_path_factory.mktemp("trace")
    data = ending.join(pieces) + (ending if final_newline and pieces else b"")
    (folder / "trace-fuzz-1.jsonl").write_bytes(data)
    ts = load_traces(folder)  # never raises
    for problem in ts.problems:
        assert "\n" not in problem.message and len(problem.message) < 400
    code, out, err = _run(view_main, [str(folder), "--json"])
    assert code == (0 if ts.readable else 2), err
    assert "Traceback" not in err and "internal error" not in err
    assert all(line.startswith("spectrace view: ") for line in err.splitlines()), err
    if code == 0:
        json.loads(out)
    else:
        assert out == "" and len(err.splitlines()) == 1


@FUZZ
@given(blob=st.binary(min_size=1, max_size=4096))
def test_random_bytes_are_never_a_trace(tmp_path_factory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("blob") / "trace-x-1.jsonl"
    path.write_bytes(blob)
    ts = load_traces(path)
    code, out, err = _run(view_main, [str(path)])
    assert code == (0 if ts.readable else 2) and "Traceback" not in err


def test_line_nested_a_hundred_thousand_deep(tmp_path: Path) -> None:
    """Found by the fuzzer: json.loads raised RecursionError out of the loader (a traceback in view)."""
    path = tmp_path / "trace-x-1.jsonl"
    path.write_bytes(GOOD[0] + b"\n" + b"[" * 100_000 + b"\n" + GOOD[1] + b"\n")
    ts = load_traces(path)
    assert [p.kind for p in ts.problems] == ["undecodable"] and ts.files[0].record_count == 1
    code, out, err = _run(view_main, [str(path), "--json"])
    assert code == 0 and "1 undecodable line" in err


def test_unknown_types_and_future_schema_only_is_exit_2_with_one_line(tmp_path: Path) -> None:
    """Nothing readable at all: a file of only unknown record types after a junk first line."""
    path = tmp_path / "trace-x-1.jsonl"
    path.write_bytes(b'{"type": "telemetry"}\n' * 5)
    code, out, err = _run(view_main, [str(path)])
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "not a spectrace trace" in err


# ============================================================================= audit
BASE_CONFIG = json.loads((SPECFORGE / "config.json").read_text())
CONFIG_KEYS = [
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
    "num_hidden_layers", "draft_vocab_size", "target_hidden_size", "tie_word_embeddings", "bias", "architectures",
    "eagle_aux_hidden_state_layer_ids", "eagle_config", "speculators_model_type", "transformer_layer_config",
    "norm_before_residual", "norm_before_fc",
]  # fmt: skip
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 3, 64, 10**12, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=12,
)
_ids = st.lists(st.integers(-(2**40), 2**40), max_size=6)
_value = st.one_of(
    _json, _ids, st.fixed_dictionaries({"eagle_aux_hidden_state_layer_ids": st.one_of(_ids, _json), "use_aux_hidden_state": _json})
)


def _draft(tmp: Path, config: dict[str, Any] | bytes) -> Path:
    draft = tmp / "draft"
    draft.mkdir()
    # A copy, not a link: the audit refuses files that resolve outside the checkpoint folder.
    shutil.copyfile(SPECFORGE / "model.safetensors", draft / "model.safetensors")
    (draft / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    return draft


def _assert_audit_contract(code: int, out: str, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("spectrace audit: error: ") and out == "", err
        assert "internal error" not in err, err  # the input check missed a case
    else:
        assert err == "", err
        json.loads(out)


@FUZZ
@given(
    changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), _value, min_size=1, max_size=4),
    drop=st.sets(st.sampled_from(CONFIG_KEYS), max_size=2),
)
def test_audit_any_config_gives_a_result_or_one_line(tmp_path_factory, changes: dict[str, Any], drop: set[str]) -> None:
    config = {k: v for k, v in {**BASE_CONFIG, **changes}.items() if k not in drop}
    draft = _draft(tmp_path_factory.mktemp("cfg"), config)
    _assert_audit_contract(*_run(command.main, [str(draft), "--json", "--target-config", str(TARGET)]))


TARGET_CONFIG = json.loads(TARGET.read_text())


@FUZZ
@given(
    changes=st.dictionaries(
        st.sampled_from(["num_hidden_layers", "hidden_size", "vocab_size", "model_type", "architectures", "text_config"]),
        _value,
        min_size=1,
        max_size=3,
    )
)
def test_audit_any_target_config_gives_a_result_or_one_line(tmp_path_factory, changes: dict[str, Any]) -> None:
    tmp = tmp_path_factory.mktemp("tgt")
    target = tmp / "target.json"
    target.write_text(json.dumps({**TARGET_CONFIG, **changes}))
    draft = _draft(tmp, BASE_CONFIG)
    _assert_audit_contract(*_run(command.main, [str(draft), "--json", "--target-config", str(target)]))


@FUZZ
@given(blob=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_audit_config_bytes_not_json(tmp_path_factory, blob: bytes) -> None:
    draft = _draft(tmp_path_factory.mktemp("raw"), blob)
    _assert_audit_contract(*_run(command.main, [str(draft), "--json"]))


_dtype = st.one_of(st.sampled_from(sorted(DTYPE_BYTES)), st.text(max_size=6), st.integers(), st.none())
_shape = st.one_of(st.lists(st.integers(-3, 2**40), max_size=5), st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), max_size=4), _json)
_offsets = st.one_of(
    st.lists(st.integers(-10, 2**64), min_size=2, max_size=2), st.tuples(st.just(0), st.integers(0, 4096)).map(list), _json
)
_entry = st.one_of(st.fixed_dictionaries({"dtype": _dtype, "shape": _shape, "data_offsets": _offsets}), _json)


@FUZZ
@given(
    entries=st.dictionaries(st.text(max_size=20), _entry, max_size=5),
    metadata=st.one_of(st.none(), _json),
    data=st.integers(0, 4096),
    claimed_delta=st.sampled_from([0, 0, 0, -1, 1, 2**40]),
)
def test_any_safetensors_header_gives_tensors_or_one_line(
    tmp_path_factory, entries: dict[str, Any], metadata: Any, data: int, claimed_delta: int
) -> None:
    head = dict(entries)
    if metadata is not None:
        head["__metadata__"] = metadata
    raw = json.dumps(head).encode()
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", max(0, len(raw) + claimed_delta)) + raw)
        fh.truncate(8 + len(raw) + data)  # sparse: the data section costs no disk
    try:
        tensors = read_safetensors_header(path)
    except AuditInputError as err:
        assert "\n" not in str(err) and len(str(err)) < 2000
        return
    for info in tensors.values():
        assert all(isinstance(d, int) and d >= 0 for d in info.shape)


def test_safetensors_header_nested_a_million_deep(tmp_path: Path) -> None:
    raw = b"[" * 1_000_000 + b"]" * 1_000_000
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(AuditInputError, match="not valid JSON"):
        read_safetensors_header(path)


def test_config_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    draft = _draft(tmp_path, b"{")
    with open(draft / "config.json", "r+b") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse 16 MiB of NULs
    code, out, err = _run(command.main, [str(draft)])
    assert code == 2 and "a config is at most" in err and len(err.splitlines()) == 1


def test_config_nested_too_deep(tmp_path: Path) -> None:
    draft = _draft(tmp_path, b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    code, out, err = _run(command.main, [str(draft)])
    assert code == 2 and len(err.splitlines()) == 1 and "internal error" not in err, err


@pytest.mark.parametrize("where", ["draft", "target"])
@pytest.mark.parametrize("layers", [10**9, 2**63, 10**40])
def test_absurd_layer_count_is_refused_not_walked(tmp_path: Path, where: str, layers: int) -> None:
    """Found by the fuzzer: the checks walk range(num_hidden_layers); 10**9 kept the audit busy for hours."""
    import time

    draft = _draft(tmp_path, {**BASE_CONFIG, "num_hidden_layers": layers} if where == "draft" else BASE_CONFIG)
    target = tmp_path / "target.json"
    target.write_text(json.dumps({**TARGET_CONFIG, "num_hidden_layers": layers} if where == "target" else TARGET_CONFIG))
    start = time.monotonic()
    code, out, err = _run(command.main, [str(draft), "--target-config", str(target)])
    assert time.monotonic() - start < 10
    assert code == 2 and "implausibly large" in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------- pickled .bin
@FUZZ
@given(blob=st.binary(max_size=2048))
def test_any_bin_bytes_are_refused_with_one_line(tmp_path_factory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("bin") / "pytorch_model.bin"
    path.write_bytes(blob)
    with pytest.raises(AuditInputError) as info:
        read_torch_bin(path)
    assert "\n" not in str(info.value)


_HONEST = io.BytesIO()
torch.save({"fc.weight": torch.zeros(4, 4), "norm.weight": torch.ones(4)}, _HONEST)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(_HONEST.getvalue()) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupted_torch_zip_gives_tensors_or_one_line(tmp_path_factory, flips: list[tuple[int, int]]) -> None:
    data = bytearray(_HONEST.getvalue())
    for at, byte in flips:
        data[at] = byte
    path = tmp_path_factory.mktemp("zip") / "pytorch_model.bin"
    path.write_bytes(bytes(data))
    try:
        read_torch_bin(path)
    except AuditInputError as err:
        assert "\n" not in str(err)


class _Payload:
    """Unpickling this would call ``fn(*args)``: a code-execution gadget."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return (self.fn, self.args)


@pytest.mark.parametrize("writer", ["pickle0", "pickle2", "pickle5", "torch.save"])
@pytest.mark.parametrize("gadget", ["os.system", "builtins.exec", "builtins.eval", "subprocess"])
def test_malicious_pickle_never_runs(tmp_path: Path, writer: str, gadget: str) -> None:
    """Each gadget would create ``marker``; torch's weights-only unpickler refuses them all."""
    import subprocess

    marker = tmp_path / "pwned"
    shell = f"touch {marker}"
    payload = {
        "os.system": _Payload(os.system, shell),
        "builtins.exec": _Payload(exec, f"open({str(marker)!r}, 'w')"),
        "builtins.eval": _Payload(eval, f"open({str(marker)!r}, 'w')"),
        "subprocess": _Payload(subprocess.call, ["touch", str(marker)]),
    }[gadget]
    state = {"fc.weight": torch.zeros(2, 2), "evil": payload}
    path = tmp_path / "pytorch_model.bin"
    if writer == "torch.save":
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state, protocol=int(writer[-1])))
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(SPECFORGE / "config.json", draft / "config.json")
    shutil.copy(path, draft / "pytorch_model.bin")
    code, out, err = _run(command.main, [str(draft)])
    assert not marker.exists()
    assert code == 2 and len(err.splitlines()) == 1 and "pytorch_model.bin" in err, err


def test_bin_files_are_only_loaded_weights_only(tmp_path: Path, monkeypatch) -> None:
    seen: list[dict[str, Any]] = []
    real = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    path = tmp_path / "pytorch_model.bin"
    torch.save({"fc.weight": torch.zeros(2, 2)}, path)
    read_torch_bin(path)
    torch.save({"fc.weight": torch.zeros(2, 2)}, path, _use_new_zipfile_serialization=False)  # legacy: no mmap
    read_torch_bin(path)
    assert len(seen) == 2 and all(k.get("weights_only") is True for k in seen)
    assert [k.get("mmap") for k in seen] == [True, False]  # the zip is mapped, the legacy file read (size-capped)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "--hypothesis-show-statistics"]))

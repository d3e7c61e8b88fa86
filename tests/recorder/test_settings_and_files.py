"""Bad numeric settings and hostile user-named files, in real processes.

Every numeric setting goes through one parser: ASCII digits only (``str.isdigit()`` and
``int()`` take '²', '①'), a bound each, one warning naming the variable, the value and
the fallback. A host traced with ``SPECTRACE=1`` under every bad value at once runs as it
runs untraced, and still writes its trace. The paths a user names (``SPECTRACE_CONTROL``,
``SPECTRACE_FINGERPRINT``, ``fingerprint --out``, a values file) go through
``spectrace.safe_files``: a real FIFO, ``/dev/zero``, a huge sparse file and a planted
symlink are each one line, never a hang, a flood or a write through the link.
RELIABILITY.md lists each case with its test.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spectrace import settings as settings_mod
from spectrace.eagle3.fingerprint import FingerprintError, load_fingerprint, save_fingerprint
from spectrace.records import RECORD_ADAPTER, Call, Counters, Fingerprint, Header, TensorStats
from spectrace.safe_files import FileTooLarge, NotRegularFile, SafeFileError, open_regular, read_regular, write_private
from spectrace.settings import MAX_RANK, Settings, parse_number

PY = sys.executable
# Every numeric variable, and the value each falls back to (what its warning says).
NUMERIC = {
    "SPECTRACE_RANK": "no rank",
    "RANK": "no rank",
    "SPECTRACE_SAMPLE": "1",
    "SPECTRACE_RECORD_CAP": "100000",
    "SPECTRACE_GRAPH_SAMPLE": "64",
    "SPECTRACE_CAPTURE_VALUES": "0 (off)",
    "SPECTRACE_FLUSH_SECONDS": "2.0",
    "SPECTRACE_BUDGET": "0 (off",
}
BAD = {"superscript two": "²", "circled one": "①", "one squared": "1²", "ten superscript": "¹⁰", "5000 digits": "7" * 5000}

HOST = textwrap.dedent(
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    ids = torch.arange(1, 9).unsqueeze(0)
    with torch.no_grad():
        for _ in range(3):
            logits = model(ids).logits
    print(" ".join(float(x).hex() for x in logits.flatten()[:64]))
    """
)


def _env(**extra: str) -> dict[str, str]:
    # Nothing of this process's SPECTRACE_* / OTEL_* / rank: the child sees only what a case sets.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_")) and k not in ("RANK", "LOCAL_RANK")}
    env.update(extra)
    return env


def _warnings(err: str, name: str) -> list[str]:
    """The warning lines about variable ``name`` (``RANK=`` is not ``SPECTRACE_RANK=``)."""
    return [line for line in err.splitlines() if line.startswith(f"spectrace: warning: {name}=")]


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def untraced() -> str:
    done = _run([PY, "-c", HOST], _env())
    assert done.returncode == 0, done.stderr
    return done.stdout


# ============================================================ 1. one parser for every number
@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
@pytest.mark.slow
def test_every_numeric_setting_bad_at_once_leaves_the_host_and_the_trace_whole(bad: str, untraced: str, tmp_path: Path) -> None:
    """SPECTRACE=1 with all eight numeric variables bad in one process: the host's output is
    the untraced one, rc 0, one warning per variable naming it, its value and the fallback,
    and the trace is written (tracing stays on: a bad SAMPLE used to turn it off)."""
    folder = tmp_path / "t"
    done = _run([PY, "-c", HOST], _env(SPECTRACE="1", SPECTRACE_DIR=str(folder), **dict.fromkeys(NUMERIC, bad)))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == untraced
    shown = ascii(bad) if len(bad) <= 40 else ascii(bad[:40])
    for name, fallback in NUMERIC.items():
        lines = _warnings(done.stderr, name)
        assert len(lines) == 1, (name, done.stderr)
        assert shown in lines[0] and f"using {fallback}" in lines[0] and lines[0].isascii() and len(lines[0]) < 200, lines
    (path,) = folder.glob("trace-*.jsonl")
    assert "rank" not in path.name  # no rank of 5,000 digits (or of '²') in the name
    records = [RECORD_ADAPTER.validate_json(line) for line in path.read_text().splitlines()]
    header = records[0]
    assert isinstance(header, Header) and header.rank is None
    assert header.settings["sample"] == 1 and header.settings["record_cap"] == 100_000 and header.settings["capture_values"] == 0
    assert sum(isinstance(r, Call) for r in records) >= 3 * 4  # three forwards of the traced modules
    assert isinstance(records[-1], Counters) and records[-1].internal_errors == 0


def test_a_bad_spectrace_rank_falls_back_to_rank() -> None:
    """SPECTRACE_RANK=² with RANK=3: one warning naming RANK's 3 as the fallback, rank 3 in effect."""
    done = _run([PY, "-m", "spectrace", "settings"], _env(SPECTRACE_RANK="²", RANK="3"), timeout=60)
    assert done.returncode == 2, done.stderr
    line, error = done.stderr.strip().splitlines()
    assert error.startswith("spectrace settings: error: 1 bad value: SPECTRACE_RANK")
    assert line.startswith("spectrace: warning: SPECTRACE_RANK=") and "using 3 (from RANK)" in line
    assert "rank = 3" in done.stdout.splitlines()


def test_the_rank_bound_is_the_viewers() -> None:
    """A rank up to 2^63 is kept (the viewer reads any integer up to it); one past is refused."""
    from spectrace.viewers.loader import MAX_INT

    assert MAX_RANK == MAX_INT
    settings_mod._bad_said.clear()
    assert Settings.from_env({"RANK": str(MAX_RANK)}).rank == MAX_RANK
    assert Settings.from_env({"RANK": str(MAX_RANK + 1)}).rank is None
    assert Settings.from_env({"RANK": "007"}).rank == 7
    assert Settings(rank=-1).rank is None


@pytest.mark.parametrize("raw", ["²", "①", "١", "1_000", "+5", "-1", "0x10", "1e3", " ", "inf", "nan", "1e400", "½"])
def test_the_parser_takes_ascii_decimal_only(raw: str) -> None:
    settings_mod._bad_said.clear()
    assert parse_number({"N": raw}, "N", 9, 1, 1000) == 9
    as_float = parse_number({"N": raw}, "N", 2.0, 0, 86400, integer=False, low_open=True)
    assert as_float == (1000.0 if raw == "1e3" else 2.0)


def test_spectrace_settings_lists_each_bad_value_in_one_line() -> None:
    done = _run([PY, "-m", "spectrace", "settings"], _env(**dict.fromkeys(NUMERIC, "¹⁰"), SPECTRACE_FUSED_STATS="maybe"), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == len(NUMERIC) + 2, err  # a warning each, then the one line that names them all
    assert err[-1].startswith(f"spectrace settings: error: {len(NUMERIC) + 1} bad values: ")
    for name in [*NUMERIC, "SPECTRACE_FUSED_STATS"]:
        assert len(_warnings(done.stderr, name)) == 1, name
    out = done.stdout.splitlines()
    assert "sample = 1" in out and "rank = None" in out and "fused_stats = True" in out
    assert "¹⁰" not in done.stdout


# ================================================================ 2. files a user names
def test_control_naming_a_fifo_a_link_or_a_huge_file_never_blocks(tmp_path: Path) -> None:
    """SPECTRACE_CONTROL at a FIFO (no writer: a plain open blocks for ever), a symlink and a
    1 GiB sparse file: "not paused", one warning each however often it is looked at; a
    regular file saying ``off`` still pauses."""
    fifo, link, big, ctl = tmp_path / "fifo", tmp_path / "link", tmp_path / "big", tmp_path / "ctl"
    os.mkfifo(fifo)
    ctl.write_text("off\n")
    link.symlink_to(ctl)
    with open(big, "wb") as handle:
        handle.truncate(1 << 30)
    script = textwrap.dedent(
        """
        import os, sys
        from spectrace import control
        control.CHECK_EVERY_S = 0.0
        for path in sys.argv[1:]:
            os.environ["SPECTRACE_CONTROL"] = path
            control.reset()
            print(all(control.paused() for _ in range(5)), any(control.paused() for _ in range(5)))
        """
    )
    done = _run([PY, "-c", script, str(fifo), str(link), str(big), str(ctl), str(tmp_path / "none")], _env(), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == ["False False", "False False", "False False", "True True", "False False"]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("spectrace: warning: SPECTRACE_CONTROL: ") for line in lines), lines
    assert "(a FIFO)" in lines[0] and "symbolic link" in lines[1] and "1073741824 bytes" in lines[2]


def test_fingerprint_naming_a_fifo_a_device_or_a_huge_file_is_one_line(tmp_path: Path) -> None:
    """SPECTRACE_FINGERPRINT at a FIFO (blocked start-up before), /dev/zero (read until OOM
    before) and a 64 GiB sparse file: a one-line reason at once, memory unmoved; a values
    file at a FIFO the same."""
    fifo, big = tmp_path / "fifo", tmp_path / "big.json"
    os.mkfifo(fifo)
    with open(big, "wb") as handle:
        handle.truncate(64 << 30)
    script = textwrap.dedent(
        """
        import json, resource, sys
        from spectrace.checks.live import fingerprint_from_env
        from spectrace.values_file import ValuesFileError, read_values
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = [fingerprint_from_env({"SPECTRACE_FINGERPRINT": p}) for p in sys.argv[1:]]
        try:
            read_values(sys.argv[1])
        except ValuesFileError as exc:
            values = str(exc)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(json.dumps({"out": [[fp is None, why] for fp, why in out], "values": values, "grown_kib": grown}))
        """
    )
    done = _run([PY, "-c", script, str(fifo), "/dev/zero", str(big)], _env(), timeout=30)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    (fifo_none, fifo_why), (zero_none, zero_why), (big_none, big_why) = got["out"]
    assert fifo_none and zero_none and big_none
    assert "(a FIFO)" in fifo_why and "(a device)" in zero_why and "68719476736 bytes" in big_why
    assert all("\n" not in why and why.endswith("the feature_skew check is off") for _, why in got["out"])
    assert "(a FIFO)" in got["values"]
    assert got["grown_kib"] < 64 * 1024  # nothing was read: no 1 MiB bound's worth, let alone /dev/zero's


@pytest.mark.slow
def test_fingerprint_out_onto_a_planted_symlink_leaves_its_target_alone(tmp_path: Path) -> None:
    """``spectrace fingerprint --out NAME`` where NAME is a symlink to another file: the
    link is replaced by a new 0600 file, the target keeps its bytes and mode."""
    victim, out = tmp_path / "victim", tmp_path / "fp.json"
    victim.write_text("keep me\n")
    victim.chmod(0o644)
    out.symlink_to(victim)
    done = _run([PY, "-m", "spectrace", "fingerprint", "--out", str(out)], _env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "keep me\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    info = os.lstat(out)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert load_fingerprint(str(out)).chunks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp.json", "victim"]  # no temporary file left


def _fingerprint() -> Fingerprint:
    return Fingerprint(module="m", chunk_width=4, chunks=[TensorStats(mean=0.0, std=1.0, absmax=2.0, numel=3)])


def test_written_files_are_0600_in_0700_folders_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        save_fingerprint(_fingerprint(), str(tmp_path / "a" / "b" / "fp.json"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "fp.json").st_mode) == 0o600
    assert load_fingerprint(str(tmp_path / "a" / "b" / "fp.json")) == _fingerprint()


def test_a_folder_at_the_name_is_one_line_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "fp.json").mkdir()
    with pytest.raises(FingerprintError) as caught:
        save_fingerprint(_fingerprint(), str(tmp_path / "fp.json"))
    assert "\n" not in str(caught.value) and "a folder is there" in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["fp.json"]


def test_read_regular_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_regular(tmp_path / "f", 10) == b"x" * 10
    with pytest.raises(FileTooLarge):
        read_regular(tmp_path / "f", 9)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotRegularFile) as caught:
        read_regular(tmp_path / "fifo", 10)
    assert caught.value.kind == "a FIFO"
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(NotRegularFile):
        read_regular(tmp_path / "link", 10)
    fd, size = open_regular(tmp_path / "link", follow_links=True)  # the viewer's semantics: links followed
    os.close(fd)
    assert size == 10
    with pytest.raises(SafeFileError) as missing:
        read_regular(tmp_path / "no\x1b[31m", 10)
    assert "\x1b" not in str(missing.value) and "\\x1b" in str(missing.value)


def test_write_private_replaces_a_planted_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"theirs")
    (tmp_path / "name").symlink_to(target)
    write_private(tmp_path / "name", b"mine")
    assert target.read_bytes() == b"theirs"
    assert not os.path.islink(tmp_path / "name") and (tmp_path / "name").read_bytes() == b"mine"

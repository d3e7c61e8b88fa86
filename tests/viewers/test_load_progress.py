"""load_traces(progress=...): a long load says how far it is, and a broken callback never stops it."""

from __future__ import annotations

from pathlib import Path

from spectrace.viewers.loader import PROGRESS_STEP, load_traces
from tests.helpers.traces import healthy_records, write_trace


def _traces(tmp_path: Path) -> tuple[Path, int]:
    records = healthy_records()
    write_trace(tmp_path / "trace-node1-1-rank0.jsonl", records)
    big = tmp_path / "trace-node1-2-rank1.jsonl"
    write_trace(big, records[:1] + records[1:] * 80)  # one header; a few PROGRESS_STEPs long
    assert big.stat().st_size > 3 * PROGRESS_STEP
    (tmp_path / "notes.txt").write_text("not a trace, not counted")
    total = sum(p.stat().st_size for p in tmp_path.glob("trace-*.jsonl"))
    return tmp_path, total


def test_progress_reaches_the_total(tmp_path: Path) -> None:
    folder, total = _traces(tmp_path)
    seen: list[tuple[int, int]] = []
    ts = load_traces(folder, progress=lambda done, of: seen.append((done, of)))
    assert seen[-1] == (total, total)
    assert {of for _, of in seen} == {total}
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert len(seen) >= 3  # in steps along the big file, not only at the end
    assert len(ts.files) == 2 and not ts.problems


def test_a_failing_callback_is_dropped(tmp_path: Path) -> None:
    folder, _ = _traces(tmp_path)
    calls: list[int] = []

    def broken(done: int, of: int) -> None:
        calls.append(done)
        raise RuntimeError("a progress bar's bug")

    ts = load_traces(folder, progress=broken)
    assert len(calls) == 1  # called once, then left out
    again = load_traces(folder)
    assert [f.record_count for f in ts.files] == [f.record_count for f in again.files]
    assert not ts.problems

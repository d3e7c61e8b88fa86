"""``spectrace calls`` and ``spectrace export`` on SGLang 0.5.23's own target and EAGLE-3
draft classes, traced by ``SPECTRACE=1`` in a child process (CPU), as the live-records
tests run them: the engine's forward mode, token rows and aux-hidden-state chunks, read
back call by call and on a timeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="needs scripts/install-sglang-cpu.sh")
pytestmark = pytest.mark.sglang

from spectrace.cli.calls import main as calls_main  # noqa: E402
from spectrace.cli.export import main as export_main  # noqa: E402
from tests.integrations.sglang.test_sglang_live_records import HIDDEN, _run  # noqa: E402
from tests.viewers.test_export import check_format, check_nesting, end, x_events  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("sglang")
    records = _run(tmp, "healthy")
    return tmp / "traces-healthy", records


def test_calls_of_sglang_classes_show_mode_tokens_and_every_chunk(
    served: tuple[Path, list[dict]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, records = served
    aux = [r for r in records if r["type"] == "call" and r["role"] == "target.aux_concat"]
    assert calls_main([str(folder), "--role", "target.aux_concat", "--limit", "0", "--no-pager"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{len(aux)} calls"
    assert lines.count("  role target.aux_concat  mode EXTEND  tokens 12") == len(aux)
    chunks = [line.split()[:3] for line in lines if line.startswith("  out output.chunk[")]
    assert chunks == [["out", f"output.chunk[{i}]", f"[12,{HIDDEN}]"] for _ in aux for i in range(3)]
    assert max(len(line) for line in lines) <= 80

    assert calls_main([str(folder), "--role", "draft.fc", "--jsonl"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got == [r for r in records if r["type"] == "call" and r["role"] == "draft.fc"]


def test_export_of_sglang_classes_nests_and_counts_every_call(served: tuple[Path, list[dict]], tmp_path: Path) -> None:
    folder, records = served
    out = tmp_path / "sglang.json"
    assert export_main([str(folder), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    check_format(doc)
    check_nesting(doc)
    calls = [r for r in records if r["type"] == "call"]
    slices = x_events(doc)
    assert sorted(e["args"]["call"] for e in slices) == sorted(c["seq"] for c in calls)
    steps = {e["args"]["step"]: e for e in x_events(doc, step=True)}
    assert set(steps) == {c["step"] for c in calls}
    assert {e["name"] for e in steps.values()} == {f"step {s} EXTEND" for s in steps}
    for e in slices:
        s = steps[e["args"]["step"]]
        assert s["ts"] - 0.002 <= e["ts"] and end(e) <= end(s) + 0.002
        assert e["args"]["forward_mode"] == "EXTEND" and e["args"]["tokens"] == 12
    fc = [e for e in slices if e["cat"] == "draft.fc"]
    assert fc and all(e["args"]["inputs"]["input[0]"]["shape"] == f"[12,{3 * HIDDEN}]" for e in fc)

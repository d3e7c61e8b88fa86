"""The viewer is linear in its input and says why records were lost.

- 20,000 distinct finding codes and 5,000 traced modules each view in under 3 s of CPU
  time with a bounded screen; ``--json`` keeps every code and every module.
- Each drop is named by the reason its writer recorded (a real :class:`Recorder`).
- ``--follow`` into a pipe says a growing count of bad lines once, not once per poll.

CPU time of a fresh child process is measured, not wall time: the machine is shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrace.records import Finding
from spectrace.viewers.drops import drop_lines
from spectrace.viewers.fold import fold_layers, spans
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import build_view
from spectrace.viewers.notices import ProblemNotes
from tests.helpers.traces import call, header, meta
from tests.viewers.test_viewer import REPO

CPU_LIMIT_S = 3.0
MAX_SCREEN_LINES = 200

# A child that views PATH and reports its own CPU time, peak memory and output size.
CHILD = """
import contextlib, io, resource, sys
from spectrace.cli.view import main as view_main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    code = view_main(sys.argv[1:])
ru = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as fh:
    hwm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
sys.stderr.write(f"{code} {ru.ru_utime + ru.ru_stime:.3f} {hwm_kb // 1024}\\n")
sys.stdout.write(out.getvalue())
"""


def codes_trace(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        fh.write(header().model_dump_json() + "\n")
        for i in range(n):
            fd = Finding(
                code=f"custom_code_{i:05d}",
                severity="error" if i % 3 == 0 else "warning",
                message=f"something {i} was off",
                fix="do the thing",
                step=i % 50,
                module=f"model.layers.{i % 40}.mlp",
            )
            fh.write(fd.model_dump_json() + "\n")
    return path


def modules_trace(path: Path, n: int) -> Path:
    kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "mlp"]
    with path.open("w") as fh:
        fh.write(header().model_dump_json() + "\n")
        for i in range(n):
            c = call(
                0,
                i,
                f"model.layers.{i // 5}.{kinds[i % 5]}",
                "Linear",
                "LlamaForCausalLM",
                [meta("x", [4, 64], 1.0)],
                [meta("out", [4, 64], 1.0)],
            )
            fh.write(c.model_dump_json() + "\n")
    return path


def _view(path: Path, *args: str) -> tuple[int, float, int, str]:
    """Exit code, CPU seconds, peak MB and stdout of ``spectrace view PATH ARGS`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="", COLUMNS="80")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "--no-pager", *args], capture_output=True, text=True, env=env, timeout=300
    )
    code, cpu, mb = done.stderr.split()[-3:]
    return int(code), float(cpu), int(mb), done.stdout


@pytest.mark.slow
def test_twenty_thousand_codes_view_in_bounded_time_and_lines(tmp_path: Path) -> None:
    trace = codes_trace(tmp_path / "trace-codes.jsonl", 20_000)
    code, cpu, _, out = _view(trace)
    assert code == 0 and cpu < CPU_LIMIT_S, cpu
    lines = out.splitlines()
    assert len(lines) < MAX_SCREEN_LINES, len(lines)
    assert "Findings: 20000 codes, 6667 errors" in out
    (more,) = [line for line in lines if "more codes" in line]
    assert more.startswith("… 19988 more codes: --finding CODE or --json"), more
    # --json keeps every code; --finding shows the one asked for.
    code, cpu, _, out = _view(trace, "--json")
    assert code == 0 and cpu < CPU_LIMIT_S, cpu
    assert len(json.loads(out)["findings"]) == 20_000
    code, _, _, out = _view(trace, "--finding", "custom_code_19998")
    assert code == 0 and "custom_code_19998" in out and "more code" not in out


@pytest.mark.slow
def test_five_thousand_modules_fold_into_a_screen(tmp_path: Path) -> None:
    trace = modules_trace(tmp_path / "trace-mods.jsonl", 5_000)
    code, cpu, _, out = _view(trace)
    assert code == 0 and cpu < CPU_LIMIT_S, cpu
    assert len(out.splitlines()) < 60
    assert "layers.[0-999].q_proj" in out and "--all-layers" in out
    code, cpu, _, out = _view(trace, "--json")
    assert code == 0 and cpu < CPU_LIMIT_S, cpu
    assert len(json.loads(out)["modules"]) == 5_000
    # --all-layers: every module asked for, the screen still capped with a line saying so.
    code, cpu, _, out = _view(trace, "--all-layers")
    assert code == 0 and cpu < CPU_LIMIT_S, cpu
    assert "… 4800 more rows: --module GLOB or --json" in out


def test_root_causes_are_grouped_in_one_pass(tmp_path: Path) -> None:
    # Quadratic grouping took 6 s for 5,000 codes; linear takes a fraction of one.
    trace = codes_trace(tmp_path / "trace-codes.jsonl", 5_000)
    ts = load_traces(str(trace))
    t0 = time.process_time()
    view = build_view(ts)
    assert time.process_time() - t0 < 1.5
    assert len(view.findings) == 5_000


def test_folding_keeps_a_layer_with_something_wrong_by_name() -> None:
    from spectrace.viewers.model import ModuleRow, StatsSummary

    def row(i: int, nan: int = 0) -> ModuleRow:
        agg = StatsSummary(mean=float(i), std=1.0, absmax=2.0 + i, nan=nan, samples=2)
        return ModuleRow(
            module=f"m.layers.{i}.mlp",
            module_type="MLP",
            calls=2,
            out_shapes=[[4, 8]],
            dtypes=["f32"],
            agg=agg,
            anomalies=["nan x1"] if nan else [],
        )

    rows = [row(0), row(1), row(2, nan=1), row(3)]
    folded = fold_layers(rows)
    assert [r.module for r in folded] == ["m.layers.[0-1,3].mlp", "m.layers.2.mlp"]
    assert folded[0].calls == 6 and folded[0].agg.absmax == 5.0 and folded[0].agg.mean == pytest.approx(4 / 3)
    assert spans([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"


# ----------------------------------------------------------------------- drop reasons
def test_the_view_names_each_drop_by_its_recorded_reason(tmp_path: Path) -> None:
    from spectrace.recorder import Recorder
    from spectrace.settings import Settings

    rec = Recorder(Settings(quiet=True), directory=str(tmp_path), name="trace-h-rank0.jsonl", rank=0)
    rec.count_dropped(175, "sink error")
    rec.count_dropped(3, "record cap")
    rec.close()
    view = build_view(load_traces(str(tmp_path)))
    assert view.header.records_dropped == 178
    assert view.header.dropped_by_reason == {"sink error": 175, "record cap": 3}
    code, _, _, out = _view(tmp_path)
    assert code == 0
    assert "sink error 175: the file could not be written (disk full, I/O error)" in out
    assert "record cap 3:" in out and "ring buffer" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_drops_without_a_recorded_reason_say_so() -> None:
    assert drop_lines({}, 5) == ["reason not recorded (an older writer)"]
    assert drop_lines({"memory cap": 2}, 5) == [
        "memory cap 2: a memory-only trace passed its cap: oldest lost",
        "3: reason not recorded (an older writer)",
    ]


# ----------------------------------------------------------------------- --follow
def test_a_growing_count_of_bad_lines_is_said_once_a_minute() -> None:
    class P:
        def __init__(self, count: int) -> None:
            self.path, self.kind, self.count = "t.jsonl", "undecodable", count

        @property
        def message(self) -> str:
            return f"t.jsonl: {self.count} undecodable lines skipped"

    now = [0.0]
    notes = ProblemNotes(clock=lambda: now[0])
    said = []
    for poll in range(40):  # a bad line every 0.25 s for 10 s
        now[0] = poll * 0.25
        said += notes.due([P(poll + 1)])
    assert said == ["t.jsonl: 1 undecodable lines skipped"]
    now[0] = 61.0
    assert notes.due([P(45)]) == ["t.jsonl: 45 undecodable lines skipped"]
    assert notes.due([P(45)]) == []


def test_follow_into_a_pipe_does_not_repeat_a_growing_problem(tmp_path: Path) -> None:
    trace = tmp_path / "trace-h-1.jsonl"
    trace.write_text(header().model_dump_json() + "\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECTRACE="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectrace", "view", str(trace), "--follow", "--interval", "0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(3)  # start-up on a shared machine
        for _ in range(12):
            with trace.open("a") as fh:
                fh.write("{not json\n")
            time.sleep(0.25)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    warnings = [line for line in err.splitlines() if "undecodable" in line or "skipped" in line]
    assert 1 <= len(warnings) <= 2, err  # said once (twice if the first poll saw an early count)

"""``spectrace view`` filters and exit codes, over traces the recorder really wrote.

The demo's fc-bypass scenario runs the reference pipeline traced (findings at error and
warning severity, every data-path stage); a tiny Llama traced under a named rank gives a
trace with a rank. Each command runs through ``view_main``, as ``spectrace view`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import spectrace as st
from spectrace.cli.view import main as view_main
from tests.helpers.models import tiny_llama


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranked")
    model = tiny_llama(layers=2)
    with st.trace(model, directory=str(out)) as t, torch.no_grad():
        t.recorder.set_rank(1)
        model(torch.arange(1, 9).unsqueeze(0))
    return out


def view(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = view_main([*args, "--no-pager"])
    out, err = capsys.readouterr()
    return rc, out, err


def view_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    rc, out, err = view(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


# ------------------------------------------------------------------ filters that match nothing
@pytest.mark.parametrize(
    "args, said",
    [
        (["--module", "nonexistent"], ["--module 'nonexistent' matches no module", "draft.model.layers.0"]),
        # A typo gets the nearest name (the Python API's difflib matching, shared).
        (
            ["--module", "hiden_norm"],
            ["--module 'hiden_norm' matches no module; did you mean 'draft.model.layers.0.hidden_norm'? (modules: "],
        ),
        (["--finding", "fc_bypas"], ["--finding fc_bypas matches no finding; did you mean 'fc_bypass'? (not a finding code"]),
        (["--finding", "nope"], ["--finding nope matches no finding", "not a finding code", "fc_bypass", "acceptance_collapse"]),
        (["--rank", "5"], ["--rank 5 matches no process", "records a rank"]),
        (["--step", "5:2"], ["--step 5:2 is an empty range", "steps 0.."]),
        (["--step", "100000:"], ["--step 100000: matches no step", "steps 0.."]),
        (["--finding", "fc_bypass", "--step", "10:20"], ["--finding fc_bypass matches no finding", "aux_capture_disabled"]),
    ],
)
def test_a_filter_that_matches_nothing_says_so_and_exits_2(
    bypass: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: list[str]
) -> None:
    rc, out, err = view(capsys, str(bypass), *args)
    assert rc == 2
    assert out == ""  # no view that could read as a healthy run
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectrace view: error: ")
    for part in said:
        assert part in lines[0]


def test_json_of_a_filter_that_matches_nothing_is_an_error_too(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = view(capsys, str(bypass), "--module", "nonexistent", "--json")
    assert (rc, out) == (2, "")
    assert "matches no module" in err


def test_rank_filter_names_the_ranks_present(ranked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = view(capsys, str(ranked), "--rank", "5")
    assert (rc, out) == (2, "")
    assert err.strip() == "spectrace view: error: --rank 5 matches no process (ranks present: 1)"
    rows = view_json(capsys, str(ranked), "--rank", "1")["modules"]
    assert any(r["module"].endswith("model.layers.1") for r in rows)


def test_filters_that_match_exit_0(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--module", "*fc"], ["--finding", "fc_bypass"], ["--step", "10:20"], ["--step", "0"]):
        rc, out, err = view(capsys, str(bypass), *args)
        assert rc == 0, (args, err)
        assert "EAGLE-3 data path" in out


# ------------------------------------------------------------------ --module and --step narrow the data path
def test_module_filter_narrows_the_data_path(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = view_json(capsys, str(bypass))["datapath"]
    assert whole["fc"]["status"] == "bypassed" and whole["captures"]

    layer = view_json(capsys, str(bypass), "--module", "layers.0")["datapath"]
    assert layer["layer"]["calls"] == whole["layer"]["calls"] > 0
    assert layer["layer"]["total"] == whole["layer"]["total"]  # the same statistics, not a subset
    for stage in ("aux", "fc", "norm", "lm_head", "target_lm_head", "d2t"):
        assert layer[stage]["status"] == "not in --module", stage
        assert layer[stage]["calls"] == 0
    assert layer["captures"] == [] and layer["fc"]["widths"]["in_features"] is None

    fc = view_json(capsys, str(bypass), "--module", "*fc")["datapath"]
    assert fc["fc"]["status"] == "bypassed"  # its finding names draft.model.fc
    assert fc["layer"]["status"] == "not in --module" and fc["norm"]["calls"] == 0

    rc, out, _ = view(capsys, str(bypass), "--module", "layers.0")
    assert rc == 0
    assert "fc  not in --module" in out and "target capture  not in --module" in out
    assert "BYPASSED" not in out and "DISABLED" not in out


def test_step_filter_narrows_the_data_path(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = view_json(capsys, str(bypass))
    part = view_json(capsys, str(bypass), "--step", "10:20")
    dp = part["datapath"]
    assert dp["steps_seen"] == 11 and 10 <= dp["window_first_step"] <= dp["window_last_step"] <= 20
    assert 0 < dp["layer"]["calls"] < whole["datapath"]["layer"]["calls"]
    # The bypass is stated from the steps shown, not from the finding of step 0 the list hides.
    assert "fc_bypass" not in [g["code"] for g in part["findings"]]
    assert dp["fc"]["status"] == "bypassed" and "ran in 11 steps and its fc never ran" in dp["fc"]["note"]
    assert part["acceptance"]["steps"] == list(range(10, 21))


# ------------------------------------------------------------------ --fail-on
@pytest.mark.parametrize(
    "args, status",
    [
        ([], 0),
        (["--fail-on", "error"], 1),
        (["--fail-on", "warning"], 1),
        (["--fail-on", "error", "--finding", "acceptance_collapse"], 0),  # a warning alone
        (["--fail-on", "warning", "--finding", "acceptance_collapse"], 1),
        (["--fail-on", "error", "--json"], 1),
    ],
)
def test_fail_on_gates_on_the_findings_shown(bypass: Path, capsys: pytest.CaptureFixture[str], args: list[str], status: int) -> None:
    rc, out, err = view(capsys, str(bypass), *args)
    assert rc == status, err
    assert out  # the view is shown either way
    if status == 0:
        assert err == ""
    else:  # one closing line says why the run fails, naming the findings (stdout stays the view)
        (line,) = err.splitlines()
        assert line.startswith(f"spectrace view: exit 1 (--fail-on {args[1]}): "), line
        expected = "acceptance_collapse" if "--finding" in args else "aux_capture_disabled"
        assert expected in line, line


def test_fail_on_passes_a_trace_without_findings(ranked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = view(capsys, str(ranked), "--fail-on", "warning")
    assert rc == 0 and "Findings: none" in out


def test_fail_on_rejects_other_severities(bypass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = view(capsys, str(bypass), "--fail-on", "info")
    assert (rc, out) == (2, "")
    assert "invalid choice: 'info'" in err

"""The pytest plugin and its assertions, exercised through pytester on tiny real models.

Inner runs load the plugin with ``-p spectrace.pytest_plugin``; the plugin makes that
safe whether or not the ``spectrace`` pytest11 entry point is installed (one test
simulates the entry point with a throw-away dist-info).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The in-process runs below restore sys.modules afterwards: a module first imported inside
# one (transformers' Llama pulls in triton, a nanobind extension) would be imported again by
# a later test in this process, and triton aborts on a second registration. Import it at
# collection, before any run.
import transformers.models.llama.modeling_llama  # noqa: E402,F401

from spectrace.assertions import format_pattern, shape_matches
from spectrace.pytest_plugin import node_dirname

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "spectrace.pytest_plugin")

CONFTEST = """
import pytest
import torch
from torch import nn


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 4)).eval()


@pytest.fixture
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def error_finding():
    from spectrace.rules.catalogue import finding
    return finding("fc_bypass", "draft got 32-wide states, fc expects 96", module="draft.model.fc")
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # In-process runs re-import nothing, so pytest notes it cannot rewrite the plugin's asserts.
    return pytester.runpytest(*PLUGIN, "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


# ----------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    "shape, pattern, ok",
    [
        ([1, 8, 96], (..., 96), True),
        ([96], (..., 96), True),
        ([1, 8, 96], (None, None, 96), True),
        ([1, 8, 96], (1, ..., 8, 96), True),
        ([1, 8, 96], (None, 96), False),
        ([1, 8, 32], (..., 96), False),
        ([], (...,), True),
        ([3], (3, ..., 3), False),
    ],
)
def test_shape_patterns(shape, pattern, ok):
    assert shape_matches(shape, pattern) is ok


def test_shape_pattern_rejects_two_ellipses():
    with pytest.raises(ValueError, match="at most one"):
        shape_matches([1, 2], (..., ...))
    assert format_pattern((..., None, 96)) == "(..., *, 96)"


def test_node_dirname_is_safe_and_keeps_parameters_apart():
    assert node_dirname("tests/test_a.py::test_b") == "tests_test_a.py__test_b"
    a, b = node_dirname("t.py::test[a/b]"), node_dirname("t.py::test[a_b]")
    assert a != b and "/" not in a and "[" not in a
    assert len(node_dirname("t.py::test_" + "x" * 500)) <= 130


def test_importing_the_plugin_does_not_import_torch():
    code = "import sys, spectrace.pytest_plugin; print('torch' in sys.modules, 'spectrace.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ----------------------------------------------------------------------------- passing contracts


def test_shape_dtype_and_stats_contracts_pass_on_a_real_llama(inner):
    inner.makepyfile(
        """
        import torch

        def test_llama(spectrace, llama):
            with spectrace.trace(llama) as t:
                llama(torch.arange(8).view(1, 8))
            t.assert_called("model.layers.*", times=2)
            t.assert_called("**.lm_head")
            t.assert_shape("model.embed_tokens", input=(1, 8), output=(..., 32))
            t.assert_shape("model.layers.*", input=(None, None, 32), output=(..., 32))
            t.assert_shape("lm_head", output=(1, ..., 128))
            t.assert_dtype("**.layers.*", input=torch.float32, output="float32")
            t.assert_stats("model.layers.*", finite=True, absmax=1e3)
            t.assert_no_findings()

        def test_sequential(spectrace, mlp):
            with spectrace.trace(mlp, modules="**") as t:
                mlp(torch.ones(2, 3, 8))
            t.assert_shape("0", input=(..., 8), output=(2, 3, 24))
            t.assert_shape("2", output=(..., 4), call=0)
        """
    )
    run(inner).assert_outcomes(passed=2)


# ----------------------------------------------------------------------------- failure messages


def test_shape_mismatch_shows_observed_shape_and_call_list(inner):
    inner.makepyfile(
        """
        import torch

        def test_fc_width(spectrace, mlp):
            with spectrace.trace(mlp, modules="**") as t:
                mlp(torch.ones(1, 5, 8))
            t.assert_shape("2", input=(..., 3 * 32))
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "ShapeContractError: shape contract of '2' broken in 1 place" in out
    assert "input[0] (first input) is (1, 5, 24), expected (..., 96)" in out
    # The mismatch first, then the findings and what ran; the call list is opt-in (err.data_path).
    result.stdout.fnmatch_lines(
        [
            "*ShapeContractError: shape contract of '2' broken in 1 place:",
            "*Findings: none.",
            "*Called: 0 ×1, 1 ×1, 2 ×1",
            "*Every call that ran: err.data_path, or t.data_path().",
        ]
    )
    assert "Observed data path" not in out


def test_assert_called_on_a_module_never_called_lists_what_ran(inner):
    inner.makepyfile(
        """
        import torch
        from torch import nn

        class Draft(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(96, 32)
                self.layer = nn.Linear(32, 32)

            def forward(self, hidden):
                if hidden.shape[-1] != 32:  # SGLang's test: a 32-wide input skips fc
                    hidden = self.fc(hidden)
                return self.layer(hidden)

        def test_fc_called(spectrace):
            draft = Draft()
            with spectrace.trace({"draft": draft}, modules=["fc", "layer"]) as t:
                draft(torch.ones(1, 8, 32))
            t.assert_called("**.fc")
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CallContractError: '**.fc' was never called (it is traced, as draft.fc).",
            "*Called: draft.layer ×1",
        ]
    )


def test_assert_on_an_untraced_module_says_so(inner):
    inner.makepyfile(
        """
        import torch

        def test_untraced(spectrace, mlp):
            with spectrace.trace(mlp, modules="0") as t:
                mlp(torch.ones(1, 8))
            t.assert_called("2")
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*'2' matches no traced module, so spectrace cannot say whether it ran*"])


def test_assert_no_findings_shows_code_message_and_fix(inner):
    inner.makepyfile(
        """
        import torch
        from conftest import error_finding

        def test_clean(spectrace, mlp):
            with spectrace.trace(mlp, modules="**") as t:
                mlp(torch.ones(1, 8))
                t.emit(error_finding())
            t.assert_no_findings()
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*FindingError: 1 unexpected finding of severity error or worse: fc_bypass",
            "*ERROR fc_bypass at draft.model.fc*: draft got 32-wide states, fc expects 96",
            "*fix: make the target capture the aux layers*",
        ]
    )


def test_assert_stats_reports_nan_and_scale(inner):
    inner.makepyfile(
        """
        import pytest
        import torch
        from spectrace.assertions import StatsContractError

        def test_nan(spectrace, mlp):
            with torch.no_grad():
                mlp[2].weight[0, 0] = float("nan")
            with spectrace.trace(mlp, modules="**") as t:
                mlp(torch.ones(1, 8))
            t.assert_stats("0", finite=True, absmax=100.0)
            with pytest.raises(StatsContractError, match="absmax .* expected in \\\\[1000.0, 2000.0\\\\]"):
                t.assert_stats("0", absmax=(1000.0, 2000.0))
            t.assert_stats("2", finite=True)
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*StatsContractError*", "*2 (step 0 #3) output (1, 4) float32 holds 1 NaN and 0 Inf of 4 values*"])


def test_findings_hold_fc_bypass_and_assert_finding_returns_it(inner):
    inner.makepyfile(
        """
        import torch
        from spectrace.eagle3.draft import DraftConfig, Eagle3Draft

        def test_bypass(spectrace):
            draft = Eagle3Draft(DraftConfig(hidden_size=64)).eval()
            with spectrace.trace({"draft": draft}, modules=["model.fc", "model.layers.0"]) as t, torch.no_grad():
                draft(torch.arange(1, 8), torch.randn(7, 64))  # 1x wide: fc is skipped
            t.assert_not_called("draft.model.fc")
            assert [f.code for f in t.findings] == ["fc_bypass"]  # the view's check, run at close
            assert t.check() == [] and t.detect() == []  # nothing new: made once
            assert t.assert_finding("fc_bypass").module == "draft.model.layers.0"
        """
    )
    run(inner).assert_outcomes(passed=1)


# ----------------------------------------------------------------------------- --spectrace and markers

FINDING_TESTS = """
import pytest
import torch
import spectrace as st
from conftest import error_finding

def test_via_fixture(spectrace, mlp):
    with spectrace.trace(mlp, modules="**") as t:
        mlp(torch.ones(1, 8))
        t.emit(error_finding())

def test_via_plain_trace_call(mlp):
    with st.trace(mlp, modules="**") as t:
        mlp(torch.ones(1, 8))
        t.emit(error_finding())

def test_claimed(spectrace, mlp):
    with spectrace.trace(mlp, modules="**") as t:
        mlp(torch.ones(1, 8))
        t.emit(error_finding())
    t.assert_finding("fc_bypass")

@pytest.mark.no_spectrace
def test_opted_out(spectrace, mlp):
    with spectrace.trace(mlp, modules="**") as t:
        t.emit(error_finding())

def test_warning_only(spectrace, mlp):
    from spectrace.rules.catalogue import finding
    with spectrace.trace(mlp, modules="**") as t:
        t.emit(finding("unsupported_config_flag", "norm_before_residual is ignored", severity="warning"))
"""


def test_without_spectrace_flag_findings_do_not_fail(inner):
    inner.makepyfile(FINDING_TESTS)
    run(inner).assert_outcomes(passed=5)


def test_spectrace_flag_fails_tests_with_unclaimed_error_findings(inner):
    inner.makepyfile(FINDING_TESTS)
    result = run(inner, "--spectrace")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "FAILED test_spectrace_flag_fails_tests_with_unclaimed_error_findings.py::test_via_fixture" in out
    assert "FAILED test_spectrace_flag_fails_tests_with_unclaimed_error_findings.py::test_via_plain_trace_call" in out
    result.stdout.fnmatch_lines(
        [
            "*spectrace: the trace made during this test holds 1 error finding (fc_bypass)*",
            "*ERROR fc_bypass at draft.model.fc*",
            "*fix: make the target capture the aux layers*",
            "*Claim expected ones with t.assert_finding(code)*",
        ]
    )


def test_marker_opts_a_single_test_in(inner):
    inner.makepyfile(
        """
        import pytest
        import torch
        from conftest import error_finding

        @pytest.mark.spectrace
        def test_marked(spectrace, mlp):
            with spectrace.trace(mlp, modules="**") as t:
                t.emit(error_finding())

        def test_unmarked(spectrace, mlp):
            with spectrace.trace(mlp, modules="**") as t:
                t.emit(error_finding())
        """
    )
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_marker_opts_a_single_test_in.py::test_marked" in result.stdout.str()


def test_markers_are_registered(inner):
    result = run(inner, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.spectrace:*", "@pytest.mark.no_spectrace:*"])


def test_traces_are_closed_and_hooks_removed_even_when_a_test_fails(inner):
    inner.makepyfile(
        """
        import pytest
        import spectrace as st
        from torch import nn

        MODELS = []

        @pytest.mark.spectrace
        def test_fails_with_open_traces(spectrace):
            model = nn.Sequential(nn.Linear(4, 4))
            MODELS.append(model)
            spectrace.trace(model, modules="**")  # never closed by the test
            st.trace(model, modules="**")          # adopted: the test opted in below
            raise RuntimeError("boom")

        def test_nothing_left_behind():
            model = MODELS[0]
            assert "forward" not in model.__dict__
            assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
            from spectrace.api import Trace
            assert Trace.__init__.__qualname__ == "Trace.__init__"  # adoption patch undone
        """
    )
    run(inner).assert_outcomes(passed=1, failed=1)


# ----------------------------------------------------------------------------- --spectrace-dir and xdist

DIR_TESTS = """
import pytest
import torch
import spectrace as st

@pytest.mark.parametrize("n", [1, 2])
def test_traced(spectrace, mlp, n):
    with spectrace.trace(mlp, modules="**") as t:
        for _ in range(n):
            mlp(torch.ones(1, 8))
    t.assert_called("0", times=n)

@pytest.mark.spectrace
def test_adopted(mlp):
    with st.trace(mlp, modules="**"):
        mlp(torch.ones(1, 8))

def test_untraced():
    pass
"""


def _trace_files(root: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.jsonl")):
        found.setdefault(path.parent.name, []).append(path)
    return found


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_spectrace_dir_keeps_each_tests_trace(inner):
    inner.makepyfile(test_dirs=DIR_TESTS)
    run(inner, "--spectrace-dir", "traces").assert_outcomes(passed=4)
    files = _trace_files(inner.path / "traces")
    assert sorted(files) == [
        "test_dirs.py__test_adopted",
        node_dirname("test_dirs.py::test_traced[1]"),
        node_dirname("test_dirs.py::test_traced[2]"),
    ]
    for paths in files.values():
        assert [p.name for p in paths] == ["trace-main-1.jsonl"]
    records = _records(files[node_dirname("test_dirs.py::test_traced[2]")][0])
    assert records[0]["type"] == "header"
    assert sum(r["type"] == "call" for r in records) == 6

    # A re-run replaces the files instead of appending to them.
    run(inner, "--spectrace-dir", "traces").assert_outcomes(passed=4)
    again = _records(_trace_files(inner.path / "traces")[node_dirname("test_dirs.py::test_traced[2]")][0])
    assert sum(r["type"] == "header" for r in again) == 1


@pytest.mark.slow
def test_xdist_workers_write_separate_files(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_dirs=DIR_TESTS)
    result = inner.runpytest_subprocess(*PLUGIN, "-p", "xdist", "-n", "2", "--dist", "each", "--spectrace-dir", "traces")
    result.assert_outcomes(passed=8)  # --dist each: every test on both workers, into the same test folders
    files = _trace_files(inner.path / "traces")
    assert len(files) == 3
    for paths in files.values():
        assert sorted(p.name for p in paths) == ["trace-gw0-1.jsonl", "trace-gw1-1.jsonl"]
        pids = [_records(p)[0]["pid"] for p in paths]
        assert len(set(pids)) == 2  # one writer per file
        for p in paths:
            assert sum(r["type"] == "header" for r in _records(p)) == 1


# ----------------------------------------------------------------------------- loading


@pytest.mark.slow
def test_plugin_loads_once_with_the_entry_point_installed_too(inner, tmp_path, monkeypatch):
    """``-p spectrace.pytest_plugin`` and ``pytest_plugins`` must not clash with the pytest11 entry point."""
    dist = tmp_path / "site" / "spectrace_ep_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spectrace-ep-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nspectrace = spectrace.pytest_plugin\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(dist.parent), os.environ.get("PYTHONPATH", "")]))
    inner.makepyfile(
        textwrap.dedent(
            """
            pytest_plugins = ["spectrace.pytest_plugin"]

            def test_fixture(spectrace):
                assert spectrace.traces == []
            """
        )
    )
    for args in ([], list(PLUGIN)):
        inner.runpytest_subprocess(*args).assert_outcomes(passed=1)

"""The ``spectrace`` command's basics, and ``pytest --spectrace`` on NaN and Inf.

The command runs as users run it (``python -m spectrace`` in a subprocess); the plugin runs
in an inner pytest over a tiny real Llama whose layer is given a NaN weight.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# Imported at collection, before the in-process inner runs (see test_pytest_plugin).
import transformers.models.llama.modeling_llama  # noqa: F401

from spectrace.cli import COMMANDS, main

pytest_plugins = ["pytester"]


def spectrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectrace", *args], capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- the command
def test_a_mistyped_command_gets_the_nearest_one() -> None:
    result = spectrace("vew")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "spectrace: error: unknown command 'vew' (did you mean 'view'?)"
    far = spectrace("zzzz")
    assert far.stderr.splitlines()[0] == "spectrace: error: unknown command 'zzzz'"  # nothing near: no guess


def test_no_command_prints_the_usage_and_exits_2() -> None:
    result = spectrace()
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: spectrace COMMAND")
    for name in COMMANDS:
        assert f"  {name} " in result.stderr


def test_help_still_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: spectrace COMMAND")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: spectrace {name}")
    tail = out.lower().split("example", 1)
    assert len(tail) == 2, f"spectrace {name} --help shows no example"
    assert f"spectrace {name}" in tail[1]  # an example is a command line, not a word


@pytest.mark.parametrize("args", [["--bogus"], ["extra"], ["--profile", "eagle3"]])
def test_settings_rejects_unknown_arguments_in_one_line(args: list[str]) -> None:
    result = spectrace("settings", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectrace settings: error: unrecognized arguments:")
    assert args[0] in lines[0]


def test_settings_without_arguments_prints_them() -> None:
    result = spectrace("settings")
    assert result.returncode == 0, result.stderr
    assert "record_cap = 100000" in result.stdout.splitlines()


def test_settings_exits_2_naming_the_bad_values_and_the_docs_name_its_default_profile() -> None:
    import os

    from tests.helpers import paths

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    bad = {"SPECTRACE_SAMPLE": "x", "SPECTRACE_STATS": "loud"}
    result = subprocess.run(
        [sys.executable, "-m", "spectrace", "settings"], capture_output=True, text=True, timeout=120, env={**clean, **bad}
    )
    assert result.returncode == 2, result.stderr
    assert "stats = 'basic'" in result.stdout.splitlines()  # the fallbacks in effect are still shown
    last = result.stderr.splitlines()[-1]
    assert last.startswith("spectrace settings: error: 2 bad values: ") and all(name in last for name in bad), last
    good = subprocess.run([sys.executable, "-m", "spectrace", "settings"], capture_output=True, text=True, timeout=120, env=clean)
    assert good.returncode == 0 and good.stderr == "", good.stderr
    # The default profile has one name: the one settings prints is the one the docs give.
    line = next(x for x in good.stdout.splitlines() if x.startswith("# hooked modules"))
    name = line.split("profile '")[1].split("'")[0]
    row = next(x for x in (paths.ROOT / "docs" / "settings.md").read_text().splitlines() if x.startswith("| `SPECTRACE_PROFILE`"))
    assert f"`{name}` (the default" in row and f"`{name}` everywhere" in row, row


@pytest.mark.parametrize(
    ("env", "source", "first", "absent"),
    [
        ({}, "profile 'eagle3', the default", "**.embed_tokens", None),
        ({"SPECTRACE_PROFILE": "hf"}, "profile 'hf'", "**.embed_tokens", "**.fc"),
        ({"SPECTRACE_MODULES": "model.layers.3,lm_head"}, "SPECTRACE_MODULES", "model.layers.3", "**.embed_tokens"),
    ],
)
def test_settings_says_which_modules_a_traced_program_hooks(env: dict[str, str], source: str, first: str, absent: str | None) -> None:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    result = subprocess.run(
        [sys.executable, "-m", "spectrace", "settings"], capture_output=True, text=True, timeout=120, env={**clean, "SPECTRACE": "1", **env}
    )
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("# hooked modules"))
    assert line.startswith(f"# hooked modules ({source}): {first}")
    if absent is not None:
        assert absent not in line
    assert "tracing is off" not in result.stdout  # SPECTRACE=1: the profile shown is the one in effect


# ----------------------------------------------------------------------------- pytest --spectrace
NAN_TESTS = """
import pytest
import torch
import spectrace as st
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(nan_in_layer=None):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    if nan_in_layer is not None:
        with torch.no_grad():
            model.model.layers[nan_in_layer].mlp.down_proj.weight[0, 0] = float("nan")
    return model


def run(model):
    with torch.no_grad():
        model(torch.arange(1, 9).unsqueeze(0))


def test_nan_weight(spectrace):
    model = tiny_llama(nan_in_layer=1)
    with spectrace.trace(model):
        run(model)


def test_nan_through_a_plain_trace():
    model = tiny_llama(nan_in_layer=1)
    with st.trace(model):
        run(model)


def test_healthy(spectrace):
    model = tiny_llama()
    with spectrace.trace(model):
        run(model)


def test_nan_claimed(spectrace):
    model = tiny_llama(nan_in_layer=1)
    with spectrace.trace(model) as t:
        run(model)
    assert t.assert_finding("nonfinite").module == "model.layers.1"  # claims every nonfinite finding


@pytest.mark.no_spectrace
def test_nan_opted_out(spectrace):
    model = tiny_llama(nan_in_layer=1)
    with spectrace.trace(model):
        run(model)
"""


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_nan=NAN_TESTS)
    return pytester.runpytest("-p", "spectrace.pytest_plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_spectrace_flag_fails_a_test_whose_model_made_nan(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, "--spectrace")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "FAILED test_nan.py::test_nan_weight" in out
    assert "FAILED test_nan.py::test_nan_through_a_plain_trace" in out
    result.stdout.fnmatch_lines(
        [
            # layers.1 made them; the norm and lm_head after it received them
            "*spectrace: the trace made during this test holds 3 error findings (nonfinite)*",
            "*ERROR nonfinite at model.layers.1: model.layers.1 output holds 8 NaN*",
        ]
    )


def test_without_the_flag_nan_does_not_fail(pytester: pytest.Pytester) -> None:
    run_inner(pytester).assert_outcomes(passed=5)

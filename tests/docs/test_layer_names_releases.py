"""``layers.0.*`` decoder-layer names are dropped only by SGLang releases before 0.5.14.

The audit is the ground truth (its loader models come from each release's own
``load_weights``): the speculators fixture, whose decoder layer is ``layers.0.*``, loses it
on a release before 0.5.14 and keeps it on 0.5.14 and 0.5.23. The demo's fix and every page
that calls the name mismatch a bug say which releases it is a bug on.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectrace.checks.weights import check_weights
from spectrace.cli.audit import run_audit
from spectrace.records import Finding, Weights
from spectrace.rules.engines import SGLANG_READS_BOTH_LAYER_NAMES
from tests.helpers import paths

SPECULATORS = paths.FIXTURES / "speculators_tiny"
TARGET = str(paths.FIXTURES / "target_llama_config.json")


def _dropped(version: str) -> list[Finding]:
    _ckpt, _target, result = run_audit(SPECULATORS, "sglang", version, TARGET)
    return [f for f in result.findings if f.code == "weights_dropped" and any(n.startswith("layers.0.") for n in f.evidence["tensors"])]


def test_only_releases_before_the_first_that_reads_both_names_drop_layers0() -> None:
    assert SGLANG_READS_BOTH_LAYER_NAMES == "0.5.14"
    (found,) = _dropped("0.5.13")
    assert found.fix and found.fix.endswith("; or serve on SGLang 0.5.14 or later, which reads both names")  # the other fix
    for version in (SGLANG_READS_BOTH_LAYER_NAMES, "0.5.23"):
        assert not _dropped(version), version


def test_the_rename_fix_says_which_releases_drop_the_names() -> None:
    names = ["self_attn.q_proj.weight", "mlp.up_proj.weight"]
    weights = Weights(module="draft", ignored=[f"layers.0.{n}" for n in names], missing=[f"midlayer.{n}" for n in names])
    fix = check_weights(weights)[0].fix
    assert fix == "rename the checkpoint keys layers.0.* -> midlayer.*, or serve on SGLang 0.5.14 or later, which reads both names"
    # Another rename is no statement about SGLang releases.
    other = Weights(module="draft", ignored=["old.fc.weight"], missing=["fc.weight"])
    assert "0.5.14" not in (check_weights(other)[0].fix or "")


@pytest.mark.parametrize("page", ["README.md", "docs/walkthrough.md"])
def test_pages_that_call_the_names_a_bug_say_which_releases(page: str) -> None:
    text = (paths.ROOT / page).read_text()
    # Every paragraph (or table row, or heading) that says layers.0.* weights are dropped.
    blocks = [
        b for b in re.split(r"\n\s*\n|\n(?=\||#)", text) if re.search(r"layers\.0\.\*.{0,80}dropped|dropped.{0,80}layers\.0\.\*", b, re.S)
    ]
    assert blocks, page
    for block in blocks:
        assert f"before {SGLANG_READS_BOTH_LAYER_NAMES}" in block, block


def test_the_demo_scenario_says_its_engine_is_a_release_before_0_5_14() -> None:
    from spectrace.eagle3.bugs import BUGS

    assert f"SGLang before {SGLANG_READS_BOTH_LAYER_NAMES}" in BUGS["layers0_names"].description
    assert Path(paths.ROOT / "docs" / "walkthrough.md").exists()

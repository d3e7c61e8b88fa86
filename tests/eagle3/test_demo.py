"""Issue-level contract of the demo: every bug switch yields its finding, healthy yields none."""

from __future__ import annotations

import os

import pytest

from spectrace.eagle3.bugs import BUGS
from spectrace.records import RECORD_ADAPTER, Acceptance, Call, Capture, Finding, Weights

EXPECTED = {
    "fc_bypass": {"fc_bypass", "aux_capture_disabled"},
    "eagle_algorithm": {"algorithm_mismatch", "aux_capture_disabled", "fc_bypass"},
    "layers0_names": {"weights_dropped", "weights_missing"},
    "lm_head_missing": {"weights_missing"},
    "d2t_missing": {"weights_missing"},
    "off_by_one": {"aux_layers_mismatch"},
    "embedding_vs_layer": {"feature_skew", "aux_layers_mismatch"},
    "norm_before_residual": {"unsupported_config_flag"},
    "capture_id_past_end": {"short_capture", "fc_bypass"},
}
# Accept-length ranges measured on the shipped pair (k=4, demo prompts).
ACCEPT = {
    "healthy": (4.0, 5.0),
    "fc_bypass": (1.0, 1.5),
    "eagle_algorithm": (1.0, 1.5),
    "layers0_names": (1.0, 1.5),
    "lm_head_missing": (1.0, 1.6),
    "d2t_missing": (1.0, 1.5),
    "embedding_vs_layer": (1.0, 1.6),
    "capture_id_past_end": (1.0, 1.5),
    "norm_before_residual": (2.5, 4.3),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory, demo_cache):
    out = tmp_path_factory.mktemp("demo")
    return {name: demo_cache.run(name, out) for name in BUGS}


def test_collapse_is_reported_as_a_symptom(results):
    collapse = [f for f in results["fc_bypass"].findings if f.code == "acceptance_collapse"]
    assert collapse and collapse[0].severity == "warning"
    assert not [f for f in results["healthy"].findings if f.code == "acceptance_collapse"]


def test_every_scenario_is_covered():
    assert set(EXPECTED) | {"healthy"} == set(BUGS)


def test_healthy_has_no_error_finding(results):
    healthy = results["healthy"]
    assert [f.code for f in healthy.findings if f.severity == "error"] == []
    assert healthy.accept_length >= 2.0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bug_switch_yields_its_findings(results, name):
    codes = {f.code for f in results[name].findings if f.severity == "error"}
    assert EXPECTED[name] <= codes, (name, codes)
    for f in results[name].findings:
        assert f.fix and f.message and f.evidence is not None


@pytest.mark.parametrize("name", sorted(ACCEPT))
def test_accept_length_ranges(results, name):
    low, high = ACCEPT[name]
    assert low <= results[name].accept_length <= high


def test_findings_name_the_tensor_or_layers(results):
    lm = next(f for f in results["lm_head_missing"].findings if f.code == "weights_missing")
    assert "lm_head.weight" in lm.evidence["missing"]
    dropped = next(f for f in results["layers0_names"].findings if f.code == "weights_dropped")
    assert all(n.startswith("layers.0.") for n in dropped.evidence["dropped"])
    assert dropped.evidence["rename_map"] == {"layers.0": "midlayer"}
    skew = next(f for f in results["embedding_vs_layer"].findings if f.code == "feature_skew")
    assert "0" in skew.evidence["chunks"]  # the embedding chunk
    mismatch = next(f for f in results["off_by_one"].findings if f.code == "aux_layers_mismatch")
    assert mismatch.evidence["captured_boundaries"] == [1, 3, 5]


def test_trace_files_hold_the_whole_story(results):
    trace_dir = results["fc_bypass"].trace_dir
    (path,) = [os.path.join(trace_dir, n) for n in os.listdir(trace_dir)]
    with open(path) as handle:
        records = [RECORD_ADAPTER.validate_json(line) for line in handle]
    kinds = {type(r) for r in records}
    assert {Call, Finding, Acceptance, Capture, Weights} <= kinds
    fc_calls = [r for r in records if isinstance(r, Call) and r.module == "draft.model.fc"]
    assert fc_calls == []  # fc never ran: the bypass is visible in the calls too
    layer = [r for r in records if isinstance(r, Call) and r.module == "draft.model.layers.0"]
    assert layer and all(m.shape[-1] == 64 for m in layer[0].inputs[1:])


def _screen(results, details: bool) -> list[str]:
    from dataclasses import replace

    from spectrace.demo import report_lines

    # The folders as `spectrace demo` names them by default (the fixture's are temporary ones).
    ordered = [replace(results[name], trace_dir=f"spectrace-demo/{name}") for name in BUGS]
    return [line.plain for line in report_lines(ordered, 80, details=details)]


def test_every_row_names_its_root_cause_fix_and_trace_within_80_columns(results):
    from spectrace.demo import root_causes

    lines = _screen(results, details=False)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert len(lines) <= 38  # with the two footer lines, one 80x40 screen
    for name, r in results.items():
        head = next(i for i, line in enumerate(lines) if line.startswith(f"{name} "))
        assert lines[head].endswith((f"spectrace-demo/{name}", f"spectrace-demo/{name}  no findings"))
        if name == "healthy":
            assert lines[head].endswith("no findings")
            continue
        root = root_causes(r.findings)[0]
        assert lines[head + 1].startswith(f"  {root.code}")
        block = " ".join(line.strip() for line in lines[head + 2 :] if line.startswith("  "))
        assert block.startswith(f"fix: {root.fix}")  # whole, words never broken: it can be copied


def test_details_show_what_was_seen_the_cause_and_the_fix_of_every_code(results):
    from spectrace.rules.catalogue import CATALOGUE

    lines = _screen(results, details=True)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    for r in results.values():
        for code in {f.code for f in r.findings}:
            assert f" {code} (" in text  # "(root cause)" or "(follows from ...)"
    flat = " ".join(line.strip() for line in lines)
    assert f"cause: {CATALOGUE['weights_dropped'].meaning}" in flat
    dropped = next(f for f in results["layers0_names"].findings if f.code == "weights_dropped")
    assert f"fix: {dropped.fix}" in flat
    assert "ERROR fc_bypass (follows from aux_capture_disabled)" in text


def test_details_cut_no_seen_text(results):
    # --details is where the user reads a finding whole: no "…", every seen text in full.
    from spectrace.present.findings import heads

    lines = _screen(results, details=True)
    assert not any("…" in line for line in lines), "\n".join(line for line in lines if "…" in line)
    flat = " ".join(line.strip() for line in lines)
    longest = max((f for r in results.values() for f in heads(r.findings)), key=lambda f: len(f.message))
    assert f"seen: {' '.join(longest.message.split())}" in flat


def test_the_legend_says_an_accept_length_can_pass_k(results):
    # Healthy serves above k (the target's bonus token): the screen says why before anyone asks.
    from spectrace.demo import K

    assert results["healthy"].accept_length > K
    legend = _screen(results, details=False)[:2]
    assert f"k={K}" in legend[0] and f"up to k+1 = {K + 1}" in legend[1] and "bonus" in legend[1]

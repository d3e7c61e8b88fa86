"""Findings grouped by root cause, over traces the demo pipeline really wrote.

One wiring bug is seen as several findings; the view shows one headline per root cause,
its consequences beneath it and one fix. The runtime fixes give the values to write
(the audit's ids for the same checkpoint), and the evidence fits the console's width.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.checks.capture import check_algorithm, check_capture
from spectrace.checks.root_causes import RULES, root_causes
from spectrace.eagle3.bugs import BUGS, build_scenario
from spectrace.records import Capture
from spectrace.rules.catalogue import CATALOGUE
from spectrace.rules.conventions import engine_boundaries
from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import FindingGroup, ViewFilter, build_view
from spectrace.viewers.render import FindingsView, iter_lines
from tests.helpers import paths

ROOT = paths.ROOT
SHIPPED = ROOT / "spectrace" / "eagle3" / "data"


# Every bug with findings but d2t_missing (lm_head_missing is the same story, one weight).
SCENARIOS = tuple(n for n in BUGS if n not in ("healthy", "d2t_missing"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_cache) -> Path:
    out = tmp_path_factory.mktemp("demo")
    for name in SCENARIOS:
        demo_cache.run(name, out)
    return out


def _view(demo: Path, name: str, flt: ViewFilter | None = None):
    if flt is None:
        return _whole_view(str(demo / name))
    return build_view(load_traces(str(demo / name)), flt)


@functools.cache
def _whole_view(folder: str):
    # Read-only here, and a trace takes seconds to load: each scenario's view is built once.
    return build_view(load_traces(folder), None)


def _by_code(findings: list[FindingGroup]) -> dict[str, FindingGroup]:
    return {f.code: f for f in findings}


def _text(findings: list[FindingGroup], width: int = 80) -> str:
    return "\n".join(line.rstrip() for line in iter_lines(FindingsView(findings), width=width))


# ------------------------------------------------------------------------ grouping


def test_fc_bypass_trace_has_one_root_cause(demo):
    found = _view(demo, "fc_bypass").findings
    g = _by_code(found)
    assert [f.code for f in found if f.root is None] == ["aux_capture_disabled"]
    assert g["fc_bypass"].root == "aux_capture_disabled" and g["fc_bypass"].follows_from == "aux_capture_disabled"
    assert g["acceptance_collapse"].root == "aux_capture_disabled" and g["acceptance_collapse"].follows_from == "fc_bypass"
    assert g["aux_capture_disabled"].consequences == ["fc_bypass", "acceptance_collapse"]
    # The root first, its consequences right after it, nearest first.
    assert [f.code for f in found] == ["aux_capture_disabled", "fc_bypass", "acceptance_collapse"]


def test_eagle_algorithm_trace_roots_in_the_algorithm(demo):
    found = _view(demo, "eagle_algorithm").findings
    g = _by_code(found)
    assert [f.code for f in found if f.root is None] == ["algorithm_mismatch"]
    assert g["aux_capture_disabled"].follows_from == "algorithm_mismatch"
    assert {g[c].root for c in ("aux_capture_disabled", "fc_bypass", "acceptance_collapse")} == {"algorithm_mismatch"}
    assert g["algorithm_mismatch"].root_fix is None and g["fc_bypass"].root_fix == g["algorithm_mismatch"].fix


@pytest.mark.parametrize(
    "name, root, consequences",
    [
        ("capture_id_past_end", "aux_layers_mismatch", {"short_capture", "fc_bypass", "acceptance_collapse"}),
        ("embedding_vs_layer", "aux_layers_mismatch", {"feature_skew", "acceptance_collapse"}),
        ("layers0_names", "weights_dropped", {"weights_missing", "acceptance_collapse"}),
        ("lm_head_missing", "weights_missing", {"acceptance_collapse"}),
    ],
)
def test_other_demo_bugs_group_under_their_cause(demo, name, root, consequences):
    found = _view(demo, name).findings
    assert [f.code for f in found if f.root is None] == [root]
    assert {f.code for f in found if f.root == root} == consequences


def test_findings_that_follow_from_nothing_stand_alone(demo):
    for name in ("off_by_one", "norm_before_residual"):
        found = _view(demo, name).findings
        assert all(f.root is None and f.consequences == [] for f in found), name
        text = _text(found)
        assert "root cause" not in text and "consequence" not in text


def test_capture_off_for_two_reasons_keeps_its_own_root():
    """EAGLE algorithm and use_aux_hidden_state=false: switching the algorithm alone leaves capture off."""
    config = json.loads((SHIPPED / "draft_config.json").read_text())
    config["eagle_config"]["use_aux_hidden_state"] = False
    capture = Capture(
        module="target", requested_ids=[-1, 1, 3], boundaries=[], num_layers=6, hidden_size=64, rule="sglang_llama", enabled=False
    )
    found = check_algorithm("EAGLE", config) + check_capture(capture, config, "EAGLE")
    judged = {j.code: j for j in root_causes(found)}
    assert judged["aux_capture_disabled"].root is None
    disabled = next(f for f in found if f.code == "aux_capture_disabled")
    assert "--speculative-algorithm EAGLE3" in disabled.fix and "use_aux_hidden_state=true" in disabled.fix
    # With the flag on, the algorithm is the whole cause.
    config["eagle_config"]["use_aux_hidden_state"] = True
    found = check_algorithm("EAGLE", config) + check_capture(capture, config, "EAGLE")
    assert {j.code: j.root for j in root_causes(found)}["aux_capture_disabled"] == "algorithm_mismatch"


def test_a_collapse_with_two_causes_names_both():
    """A bypassed fc and a missing d2t at once: the collapse follows from the first, and says the second."""
    from spectrace.checks.calls import check_acceptance
    from spectrace.checks.weights import check_hot_token_map
    from spectrace.checks.widths import check_target_handoff_width
    from spectrace.records import Acceptance

    found = [
        *check_target_handoff_width(64, 192, 64, 3, aux_enabled=False, module="draft.model.fc", step=0),
        *check_hot_token_map(64, 128, False, module="draft.hot_token_id"),
        *check_acceptance([Acceptance(step=i, accept_lengths=[1, 1], draft_tokens=4) for i in range(8)]),
    ]
    judged = {j.code: j for j in root_causes(found)}
    assert judged["acceptance_collapse"].root == "fc_bypass" and judged["acceptance_collapse"].also == ("weights_missing",)
    assert judged["fc_bypass"].root is None and judged["weights_missing"].root is None
    groups = [
        FindingGroup(code=f.code, severity=f.severity, count=1, message=f.message, cause="", fix=f.fix, evidence=f.evidence) for f in found
    ]
    from spectrace.viewers.grouping import by_root_cause

    text = _text(by_root_cause(groups), width=120)
    assert "Findings: 2 root causes, 1 consequence" in text and "(also from weights_missing)" in text
    assert "cleared by this fix" not in text  # the d2t is still missing after the fc fix


def test_a_warning_is_no_root():
    found = [
        FindingGroup(code="aux_layers_mismatch", severity="warning", count=1, message="ambiguous", cause="", fix="x"),
        FindingGroup(code="acceptance_collapse", severity="warning", count=1, message="1.00", cause="", fix="y"),
    ]
    assert [j.root for j in root_causes(found)] == [None, None]


def test_every_error_explains_a_collapse():
    """Each error finding is a draft fed, weighted or built otherwise than trained: a collapse beside it follows from it."""
    from spectrace.checks.root_causes import DRAFT_INPUT_OR_WEIGHTS

    errors = {c.code for c in CATALOGUE.values() if c.severity == "error"}
    assert errors - set(DRAFT_INPUT_OR_WEIGHTS) == set()


def test_a_replaced_head_replayed_and_collapsed_is_one_cause():
    """The replay saw the head diverge, the weights check saw it replaced, acceptance collapsed: one root."""
    from spectrace.checks.calls import check_acceptance
    from spectrace.checks.replay import replay_divergence
    from spectrace.records import Acceptance
    from spectrace.rules.catalogue import finding

    replaced = finding("weights_replaced_after_load", "lm_head.weight replaced", evidence={"parameters": ["lm_head.weight"]})
    head = replay_divergence("lm_head", "[0.1]", "[0.3]", ["the trained lm_head was replaced"], 0.5, 2e-3, "t.replay")
    collapse = check_acceptance([Acceptance(step=i, accept_lengths=[1, 1], draft_tokens=4) for i in range(8)])
    judged = {j.code: j for j in root_causes([replaced, head, *collapse])}
    assert judged["replay_divergence"].root == "weights_replaced_after_load"
    assert (judged["acceptance_collapse"].follows_from, judged["acceptance_collapse"].root) == (
        "replay_divergence",
        "weights_replaced_after_load",
    )
    # A divergence at a stage the cause does not touch stands on its own (and roots the collapse).
    layer = replay_divergence("decoder layer", "[0.1]", "[0.3]", ["the rotary embedding differs"], 0.5, 2e-3, "t.replay")
    judged = {j.code: j for j in root_causes([replaced, layer, *collapse])}
    assert judged["replay_divergence"].root is None and judged["acceptance_collapse"].root == "replay_divergence"
    assert judged["acceptance_collapse"].also == ("weights_replaced_after_load",)


def test_a_draft_built_as_another_class_roots_the_collapse():
    from spectrace.checks.calls import check_acceptance
    from spectrace.records import Acceptance
    from spectrace.rules.catalogue import finding

    found = [
        finding("draft_class_mismatch", "built DeepseekV32ForCausalLM"),
        *check_acceptance([Acceptance(step=i, accept_lengths=[1], draft_tokens=3) for i in range(8)]),
    ]
    assert [j.root for j in root_causes(found)] == [None, "draft_class_mismatch"]


def test_rules_name_catalogued_codes_only():
    for rule in RULES:
        assert rule.consequence in CATALOGUE and all(r in CATALOGUE for r in rule.roots), rule


# ------------------------------------------------------------------------ the view


def test_view_shows_one_headline_and_one_fix_per_root(demo):
    found = _view(demo, "eagle_algorithm").findings
    text = _text(found)
    assert text.splitlines()[0] == "Findings: 1 root cause, 3 consequences (4 codes, 3 errors)"
    assert len([line for line in text.splitlines() if line.startswith("   fix ")]) == 1
    assert "3 consequences, cleared by this fix" in text
    for code in ("aux_capture_disabled", "fc_bypass", "acceptance_collapse"):
        (line,) = [line for line in text.splitlines() if f" {code} " in line or line.endswith(f" {code}")]
        assert line.lstrip().startswith("↳"), line


def _rows(text: str, label: str) -> list[str]:
    """Each ``label`` row of the findings block, its wrapped lines joined."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith(f"   {label} ".ljust(12)):
            parts = [line[12:]]
            for more in lines[i + 1 :]:
                if not more.startswith(" " * 12):
                    break
                parts.append(more.strip())
            out.append(" ".join(" ".join(parts).split()))
    return out


@pytest.mark.parametrize("name", ["fc_bypass", "eagle_algorithm", "capture_id_past_end", "layers0_names"])
def test_a_consequence_is_never_shown_with_its_own_fix(demo, name):
    found = _view(demo, name).findings
    text = _text(found, width=200)
    roots = [f for f in found if f.root is None]
    # One fix row per root cause, each the root's own; no consequence has a row at all.
    assert _rows(text, "fix") == [" ".join(f.fix.split()) for f in roots]
    assert len(_rows(text, "seen")) == len(roots)
    flat = " ".join(text.split())
    for f in found:
        if f.root is not None and not any(f.fix in r.fix for r in roots):
            assert " ".join(f.fix.split()) not in flat, (f.code, f.fix)


def test_a_consequence_alone_under_finding_filter_gives_its_roots_fix(demo):
    found = _view(demo, "fc_bypass", ViewFilter(finding="fc_bypass")).findings
    assert [f.code for f in found] == ["fc_bypass"] and found[0].root == "aux_capture_disabled"
    flat = " ".join(_text(found, width=200).split())
    assert "follows from aux_capture_disabled" in flat
    assert "set eagle_config.use_aux_hidden_state=true in the draft's config.json (the fix of aux_capture_disabled)" in flat
    assert " ".join(found[0].fix.split()) not in flat


# ------------------------------------------------------------------ seen versus cause


def _content_words(text: str) -> set[str]:
    return set(re.findall(r"[a-z_][a-z0-9_.]{3,}", text.lower()))


def test_seen_and_cause_say_different_things(demo):
    """seen is the observation with its values; cause is why it happens. Half or more of the
    cause's words in the seen line is the same sentence twice."""
    for name in SCENARIOS:
        for f in _view(demo, name).findings:
            cause = _content_words(f.cause)
            shared = cause & _content_words(f.message)
            assert cause and len(shared) / len(cause) < 0.5, (name, f.code, sorted(shared))


# ------------------------------------------------------------------ concrete fixes


def _checkpoint(tmp_path: Path, name: str) -> Path:
    """The scenario's draft as a checkpoint directory: its config.json, the shipped weights."""
    scenario = build_scenario(name, load=False)
    dst = tmp_path / name
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(scenario.draft_config))
    shutil.copy(SHIPPED / "draft.safetensors", dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("name", ["off_by_one", "embedding_vs_layer", "capture_id_past_end"])
def test_runtime_aux_layers_fix_gives_the_audits_ids(demo, tmp_path, name):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spectrace",
            "audit",
            str(_checkpoint(tmp_path, name)),
            "--target-config",
            str(SHIPPED / "target_config.json"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    (offline,) = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "aux_layers_mismatch"]
    runtime = _by_code(_view(demo, name).findings)["aux_layers_mismatch"]
    ids = runtime.evidence["fix_ids"]
    assert ids == offline["evidence"]["fix_ids"] and ids is not None
    assert f"eagle_aux_hidden_state_layer_ids to {ids}" in runtime.fix and f"to {ids}" in offline["fix"]
    # The ids do what the fix says: the engine's rule captures the trained boundaries from them.
    trained = next(iter(runtime.evidence["readings"].values()))["boundaries"]
    assert engine_boundaries(ids, runtime.evidence["engine_rule"], 6).boundaries == trained


def test_runtime_fixes_name_values(demo):
    short = _by_code(_view(demo, "capture_id_past_end").findings)["short_capture"]
    assert "ids [5, 6] are past the target's 6 layers" in short.fix and "[-1, 1, 3]" in short.fix
    disabled = _by_code(_view(demo, "fc_bypass").findings)["aux_capture_disabled"]
    assert disabled.fix == "set eagle_config.use_aux_hidden_state=true in the draft's config.json"
    algo = _by_code(_view(demo, "eagle_algorithm").findings)["aux_capture_disabled"]
    assert algo.fix == "launch with --speculative-algorithm EAGLE3 (not EAGLE)"
    bypass = _by_code(_view(demo, "fc_bypass").findings)["fc_bypass"]
    assert "3 aux layers (3 x 64 = 192, fc.in_features)" in bypass.fix
    renamed = _by_code(_view(demo, "layers0_names").findings)
    assert "layers.0.* -> midlayer.*" in renamed["weights_dropped"].fix
    head = _by_code(_view(demo, "lm_head_missing").findings)["weights_missing"]
    assert "lm_head.weight" in head.fix and head.fix != CATALOGUE["weights_missing"].fix
    skew = _by_code(_view(demo, "embedding_vs_layer").findings)["feature_skew"]
    assert "captures boundaries [2, 4, 5]" in skew.fix and "[0, 2, 4]" in skew.fix


# ------------------------------------------------------------------ evidence width


def _evidence_rows(text: str) -> str:
    """The evidence row's text, its wrapped lines joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("   evidence "))
    rows = [lines[start][len("   evidence ") :]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 12) or line.strip().startswith("↳"):
            break
        rows.append(line.strip())
    return " ".join(" ".join(rows).split())


def test_evidence_fits_the_width(demo):
    found = [f for f in _view(demo, "off_by_one").findings if f.code == "aux_layers_mismatch"]
    readings = str(found[0].evidence["readings"])
    assert 70 < len(readings) < 100  # wider than an 80-column value, narrower than a 120-column one
    wide, narrow = _evidence_rows(_text(found, width=120)), _evidence_rows(_text(found, width=80))
    assert f"readings={readings}" in wide and "..." not in wide
    # Cut between items, never inside one: "+N more" says what was left out.
    assert readings not in narrow and "readings={'speculators'" in narrow and "more}" in narrow
    assert len(narrow.split(", ")) > 3  # cut values, not dropped items


def test_json_keeps_evidence_whole(demo):
    proc = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(demo / "layers0_names"), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    view = json.loads(proc.stdout)
    dropped = next(f for f in view["findings"] if f["code"] == "weights_dropped")
    assert len(dropped["evidence"]["dropped"]) == 10 and all(n.startswith("layers.0.") for n in dropped["evidence"]["dropped"])
    missing = next(f for f in view["findings"] if f["code"] == "weights_missing")
    assert missing["root"] == "weights_dropped" and missing["follows_from"] == "weights_dropped"
    assert next(f for f in view["findings"] if f["code"] == "weights_dropped")["consequences"] == ["weights_missing", "acceptance_collapse"]

"""`spectrace diff` on traces the hooks really wrote: the signal first, no token-length noise.

The demo's healthy and fc_bypass scenarios run through the reference pipeline with tracing
on. Their prompts give other sequence lengths in each run, so every module's shapes differ
in the token dimension; the diff sets that aside and leads with what explains the collapse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from spectrace.viewers import diff as diff_mod
from spectrace.viewers.diff import diff_traces, render_diff, set_aside_dims, shape_signatures
from spectrace.viewers.loader import load_traces
from spectrace.viewers.render import iter_lines
from tests.helpers import paths

REPO = paths.ROOT


@pytest.fixture(scope="module")
def traces(tmp_path_factory, demo_cache):
    out = tmp_path_factory.mktemp("diff-signal")
    for name in ("healthy", "fc_bypass"):
        demo_cache.run(name, out)
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    env.pop("SPECTRACE", None)
    return subprocess.run([sys.executable, "-m", "spectrace", "diff", *args], cwd=REPO, capture_output=True, text=True, env=env)


def _token_only(a: list[list[int]], b: list[list[int]]) -> bool:
    """Independent of the diff's rule: same numbers of dimensions and same last dimensions."""
    return {(len(s), s[-1]) for s in a} == {(len(s), s[-1]) for s in b}


def _index(lines: list[str], pattern: str) -> int:
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert hits, f"no line matches {pattern!r}:\n" + "\n".join(lines)
    return hits[0]


def test_healthy_vs_fc_bypass_leads_with_the_signal(traces):
    proc = _cli(str(traces / "healthy"), str(traces / "fc_bypass"))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 40, proc.stdout  # it printed 106 to 139 lines before shapes were compared by width

    # The first difference: the draft's fc ran in A only.
    first = next(i for i, line in enumerate(lines) if line.startswith("  "))
    assert re.search(r"\bfc\b.*draft\.model\.fc\s+called in A only", lines[first]), lines[first]
    fc = first
    enabled = _index(lines, r"^\s+target\s+enabled True -> False$")
    accept = _index(lines, r"mean accept length\s+4\.\d+ -> 1\.\d+$")
    findings = _index(lines, r"^\s+fc_bypass\s+error, in B only")
    assert fc < enabled < accept < findings
    # Nothing of the per-module detail comes before them, and no line is a shape list.
    modules = [i for i, line in enumerate(lines) if line == "modules"]
    assert not modules or modules[0] > findings
    assert not any(re.search(r"\[\d+(,\d+)*\] \[\d+(,\d+)*\]", line) for line in lines), proc.stdout
    assert re.search(r"^\d+ modules differ only in batch/token dimensions: set aside", lines[-2])
    assert lines[-1].endswith("1 acceptance, 3 finding") and lines[-1].startswith("9 differences")


def test_no_difference_is_a_token_length(traces):
    result = diff_traces(load_traces(traces / "healthy"), load_traces(traces / "fc_bypass"))
    shapes = [d for d in result.differences if d.kind == "shape"]
    assert not [d for d in shapes if _token_only(d.a, d.b)]
    # They are kept aside, whole: every module both runs called, each with all its shapes.
    assert len(result.set_aside) >= 10
    for d in result.set_aside:
        assert _token_only(d.a, d.b) and d.a != d.b and len(d.a) > 5
    kinds = [(d.section, d.kind, d.where) for d in result.differences]
    assert kinds[0] == ("data path", "module", "draft.model.fc")
    assert ("capture", "capture", "target") in kinds and ("acceptance", "acceptance", "mean accept length") in kinds
    sections = [d.section for d in result.differences]
    assert sections == sorted(sections, key=["data path", "capture", "acceptance", "findings", "modules"].index)


def test_json_is_complete(traces):
    proc = _cli(str(traces / "healthy"), str(traces / "fc_bypass"), "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    direct = diff_traces(load_traces(traces / "healthy"), load_traces(traces / "fc_bypass"))
    assert len(data["differences"]) == len(direct.differences) and len(data["set_aside"]) == len(direct.set_aside)
    lm_head = next(d for d in data["set_aside"] if d["where"] == "target.model.lm_head")
    assert lm_head["a"] == direct.set_aside[[d.where for d in direct.set_aside].index("target.model.lm_head")].a
    # A finding's message is whole in the JSON (the text cuts it to the width).
    written = {f.code: f.message for f in load_traces(traces / "fc_bypass").all("findings")}
    bypass = next(d for d in data["differences"] if d["kind"] == "finding" and d["where"] == "fc_bypass")
    assert bypass["a"] is None and bypass["b"] == written["fc_bypass"] and len(bypass["b"]) > 80


def test_exit_codes(traces):
    same = _cli(str(traces / "healthy"), str(traces / "healthy"))
    assert same.returncode == 0 and same.stdout.splitlines()[-1] == "traces agree"
    assert _cli(str(traces / "healthy"), str(traces / "fc_bypass")).returncode == 1
    missing = _cli(str(traces / "healthy"), str(traces / "nope"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_per_module_detail_is_capped_on_screen_not_in_json(traces, monkeypatch):
    # rtol 0: every statistic that moved at all is a difference, most of them per module.
    result = diff_traces(load_traces(traces / "healthy"), load_traces(traces / "fc_bypass"), rtol=0.0)
    per_module = {d.where for d in result.differences if d.section == "modules"}
    stats = [d for d in result.differences if d.where == "draft.model.layers.0" and d.kind == "stats"]
    assert len(per_module) > 4 and len(stats) >= 2
    lines = list(iter_lines(render_diff(result), width=120))
    assert len(lines) <= 40
    # A module's statistics share one line; each is its own difference in the JSON.
    (layer,) = [line for line in lines if "draft.model.layers.0 " in line]
    assert all(d.detail in layer for d in stats)
    monkeypatch.setattr(diff_mod, "MAX_MODULE_LINES", 4)
    lines = list(iter_lines(render_diff(result), width=120))
    shown = [line for line in lines[lines.index("modules") + 1 :] if line.startswith("  ") and "more modules" not in line]
    assert len(shown) == 4
    assert f"  ... {len(per_module) - 4} more modules differ (--json lists them all)" in lines


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ([[1, 24, 64], [1, 29, 64]], [[1, 30, 64]], True),  # [B, T, H]: other prompt lengths
        ([[1, 24, 64]], [[4, 24, 64]], True),  # another batch
        ([[24, 128], [29, 128]], [[31, 128]], True),  # flattened tokens [T, V]
        ([[24, 64]], [[24, 192]], False),  # the width: what the fc-bypass bug changes
        ([[1, 24, 64]], [[24, 64]], False),  # another number of dimensions
        ([[1, 8, 24, 16], [1, 8, 30, 16]], [[1, 4, 31, 16]], False),  # [B, heads, T, d]: heads halved
        ([[1, 8, 24, 16], [1, 8, 30, 16]], [[1, 8, 31, 16]], True),  # ... only the tokens moved
        ([[24], [29]], [[31]], True),  # [T]: token ids
    ],
)
def test_shape_signatures(a, b, same):
    aside = set_aside_dims(a, b)
    assert (shape_signatures(a, aside) == shape_signatures(b, aside)) is same


def _doc_block(page: str, first_line: str) -> str:
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    return next(b for b in blocks if b.startswith(first_line))


def test_the_documented_diff_is_what_diff_prints(traces):
    result = diff_traces(load_traces(traces / "healthy"), load_traces(traces / "fc_bypass"))
    result.a, result.b = "spectrace-demo/healthy", "spectrace-demo/fc_bypass"
    shown = "\n".join(iter_lines(render_diff(result), width=100)) + "\n"
    assert shown == _doc_block("diff.md", "A spectrace-demo/healthy")

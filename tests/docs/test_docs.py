"""The generated reference pages match the code, and every page links to files that exist."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from spectrace import docs_gen
from spectrace.records import RECORD_TYPES
from spectrace.rules.catalogue import CATALOGUE
from tests.helpers import paths
from tests.helpers.scripts import load_script

ROOT = paths.ROOT


def test_generated_pages_are_current():
    stale = docs_gen.stale(ROOT)
    assert stale == [], f"{', '.join(stale)} differ from the code: run `python -m spectrace.docs_gen` and commit the result"


def test_every_evidence_key_and_record_field_is_described():
    assert docs_gen.undescribed() == [], "describe them in spectrace/docs_gen.py (EVIDENCE_KEYS, FIELD_NOTES) or on the field"


def test_pages_cover_every_code_and_record_type():
    findings = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    for code in CATALOGUE:
        assert f"\n## {code}\n" in findings, code
    fmt = (ROOT / "docs" / "trace-format.md").read_text(encoding="utf-8")
    for kind in RECORD_TYPES:
        assert f"## `{kind}` (" in fmt, kind


def test_scan_pairs_each_loop_code_with_its_own_keys():
    # checks.weights builds both weight findings in one loop, each with its own key.
    found, _ = docs_gen._scan()
    assert "dropped" in found["weights_dropped"] and "dropped" not in found["weights_missing"]
    assert "missing" in found["weights_missing"] and "missing" not in found["weights_dropped"]
    assert {"kind", "supported_since"} <= found["capture_unsupported"]  # evidence.update(...) is read too


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("")
    assert docs_gen.main(["--root", str(tmp_path), "--check"]) == 1
    assert "stale: docs/findings.md" in capsys.readouterr().out
    assert docs_gen.main(["--root", str(tmp_path)]) == 0
    assert docs_gen.main(["--root", str(tmp_path), "--check"]) == 0
    assert docs_gen.main(["--root", str(tmp_path / "nowhere")]) == 2


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _doc_pages() -> list[Path]:
    pages = [ROOT / name for name in ("README.md", "CHANGELOG.md", "BENCHMARKS.md", "RELIABILITY.md")]
    pages += sorted((ROOT / "docs").glob("*.md")) + [ROOT / "bench" / "results" / "README.md"]
    pages += [ROOT / "examples" / "README.md", ROOT / "examples" / "sglang" / "README.md"]
    return [p for p in pages if p.is_file()]


def test_relative_links_in_the_docs_resolve():
    broken = []
    for page in _doc_pages():
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_docs_name_no_path_outside_the_repository():
    outside = re.compile(r"/work/|\.\./shared|shared/gpu")
    hits = []
    for page in _doc_pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if outside.search(line):
                hits.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert hits == []


def test_bench_results_readme_names_every_file():
    folder = ROOT / "bench" / "results"
    readme = (folder / "README.md").read_text(encoding="utf-8")
    files = sorted(name for name in os.listdir(folder) if name != "README.md")
    assert files and [name for name in files if f"`{name}`" not in readme] == []


def test_benchmarks_current_table_is_the_one_runs_table():
    """BENCHMARKS.md's current table is bench/current_table.py's rendering of the results
    file its markers name: every figure, goal, control and anchor from that one run."""
    current_table = load_script(ROOT / "bench" / "current_table.py")
    name, body = current_table.table_block((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    data = json.loads((ROOT / name).read_text(encoding="utf-8"))
    assert data["file"] == name
    assert body == current_table.table(data), "run `python bench/current_table.py FILE --into BENCHMARKS.md`"

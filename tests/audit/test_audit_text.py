"""``spectrace audit``'s text report at 80 columns: stacked seen / cause / fix / applies-to
lines, identifiers never cut, notes only where they apply (the real CLI, in a subprocess)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import paths

FIXTURES = paths.FIXTURES
TARGET = FIXTURES / "target_llama_config.json"
SPECULATORS = FIXTURES / "speculators_tiny"


def cli(*args: object, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "spectrace", "audit", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def _draft(tmp_path: Path, **changes: object) -> Path:
    folder = tmp_path / "draft"
    folder.mkdir()
    for f in SPECULATORS.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_stacked_blocks_fit_80_columns_and_keep_identifiers_whole() -> None:
    proc = cli(SPECULATORS, "--target-config", TARGET)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert not any(ch in proc.stdout for ch in "│┃┏━"), "no table"
    for label in ("seen", "cause", "fix", "applies"):
        assert any(re.match(rf"  {label}\s", line) for line in lines), label
    # Every word the fix prints is whole: the identifier appears intact on one line.
    assert any("eagle_config.eagle_aux_hidden_state_layer_ids" in line for line in lines)
    assert "the capture rule used holds for SGLang >= 0.5.22" in " ".join(line.strip() for line in lines)


def test_long_identifier_stands_on_its_own_line_at_40_columns() -> None:
    proc = cli(SPECULATORS, "--target-config", TARGET, columns=40)
    for line in proc.stdout.splitlines():
        if len(line) > 40:  # only a single word too long for any line may pass the width
            assert len(line.split()) == 1, line


def test_default_capture_note_only_without_ids(tmp_path: Path) -> None:
    with_ids = cli(_draft(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}), "--target-config", TARGET)
    assert "captures its defaults" not in with_ids.stdout
    without = cli(SPECULATORS, "--target-config", TARGET)  # top-level ids only: SGLang reads eagle_config
    assert "captures its defaults" in without.stdout


def test_json_adds_cause_and_applies_to_only() -> None:
    report = json.loads(cli(SPECULATORS, "--target-config", TARGET, "--json").stdout)
    first = report["findings"][0]
    assert {"code", "severity", "message", "evidence", "fix", "module"} <= set(first)
    assert first["cause"] and first["applies_to"].startswith("SGLang 0.5.23")

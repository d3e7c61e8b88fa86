"""The repository's folders as the tests see them, whatever folder a test file sits in."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"  # trainer-written checkpoints (tests/fixtures/README.md)
GOLDEN = TESTS / "golden"  # the plain viewer's snapshots
SCREENS = TESTS / "screens"  # the terminal screens driven in tmux
SCRIPTS = TESTS / "scripts"  # programs a test runs as a separate process

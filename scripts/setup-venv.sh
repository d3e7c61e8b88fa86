#!/usr/bin/env bash
# Create (or update) ./.venv with spectrace installed as users get it: a regular,
# non-editable install, so the .pth bootstrap lands in site-packages.
# torch is pinned to the CPU wheel here only; the package itself asks for a range.
#
# pip byte-compiles what it installs, and that stays: where PYTHONDONTWRITEBYTECODE is set
# (as in some CI shells), nothing else writes the .pyc files, and every child process of
# the tests would compile torch and transformers again (measured: 3-4x slower children).
# spectrace's wheel is built once and installed from the file (a plain `.` is built again
# by every pip call that names it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPECTRACE_VENV:-.venv}"
PY="${PYTHON:-python3}"
PIP=(-q --disable-pip-version-check)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install "${PIP[@]}" --upgrade pip >/dev/null
# CPU torch first, so nothing below can pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install "${PIP[@]}" "torch==2.13.0"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" . >/dev/null
wheel=("$wheels"/spectrace-*.whl)
"$VENV/bin/python" -m pip install "${PIP[@]}" --force-reinstall --no-deps "${wheel[0]}"
"$VENV/bin/python" -m pip install "${PIP[@]}" "transformers==5.19.0" "${wheel[0]}[test]"
if [ "${1:-}" = "--with-sglang" ] && [ -x scripts/install-sglang-cpu.sh ]; then
  bash scripts/install-sglang-cpu.sh "$VENV"
fi

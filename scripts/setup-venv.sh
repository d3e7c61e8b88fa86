#!/usr/bin/env bash
# Create (or update) ./.venv with spectrace installed as users get it: a regular,
# non-editable install, so the .pth bootstrap lands in site-packages.
# torch is pinned to the CPU wheel here only; the package itself asks for a range.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPECTRACE_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
# CPU torch first, so nothing below can pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "transformers==5.19.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps . 
"$VENV/bin/python" -m pip install -q --disable-pip-version-check ".[test]"
if [ "${1:-}" = "--with-sglang" ] && [ -x scripts/install-sglang-cpu.sh ]; then
  bash scripts/install-sglang-cpu.sh "$VENV"
fi

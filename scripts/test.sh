#!/usr/bin/env bash
# The test suite, set-up included: real tiny models, the real SGLang source on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh --with-sglang
# --dist loadfile: a module-scoped fixture (the demo runs) is built once, on one worker.
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"

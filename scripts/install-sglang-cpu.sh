#!/usr/bin/env bash
# Install the real SGLang 0.5.23 Python source into an EXISTING venv on a CPU-only
# machine, for spectrace's `@pytest.mark.sglang` tests (no server, no CUDA kernels).
#
#   scripts/install-sglang-cpu.sh VENV_DIR
#
# The venv must already hold a CPU build of torch 2.13.0 (and, ideally,
# transformers 5.19.0). sglang itself goes in with --no-deps (its own pins ask for
# torch 2.14.1 and ~10 GB of CUDA kernels); then only the light dependencies its
# import chain needs, with torch/transformers/torchvision held by
# scripts/sglang-cpu-constraints.txt. Idempotent: a second run is a no-op check.
set -euo pipefail

SGLANG_VERSION="0.5.23"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONSTRAINTS="$HERE/sglang-cpu-constraints.txt"

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
VENV="$1"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
    echo "error: $PY not found; create the venv first (python3 -m venv $VENV)" >&2
    exit 2
fi

# --- torch must already be the CPU build: never let pip choose one -------------
TORCH_INFO="$("$PY" - <<'PY' 2>/dev/null || true
import torch
print(torch.__version__, torch.version.cuda)
PY
)"
if [[ -z "$TORCH_INFO" ]]; then
    echo "error: torch is not installed in $VENV; install the CPU build first:" >&2
    echo "  $PY -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" >&2
    exit 2
fi
read -r TORCH_VER TORCH_CUDA <<<"$TORCH_INFO"
if [[ "${TORCH_VER%%+*}" != "2.13.0" || "$TORCH_CUDA" != "None" ]]; then
    echo "error: $VENV has torch $TORCH_VER (cuda=$TORCH_CUDA); need the CPU build of 2.13.0" >&2
    exit 2
fi

# --- fast path: already installed and importable ---------------------------------
check_installed() {
    "$PY" - "$SGLANG_VERSION" <<'PY'
import sys, importlib.metadata as md
want = sys.argv[1]
try:
    have = md.version("sglang")
except md.PackageNotFoundError:
    sys.exit(1)
if have != want:
    sys.exit(1)
try:
    if md.version("transformers") != "5.19.0" or md.version("specforge") != "0.2.0":
        sys.exit(1)
except md.PackageNotFoundError:
    sys.exit(1)
import importlib.util
# find_spec, not import: torchvision / compressed_tensors do not import bare on CPU.
for mod in ("orjson", "pybase64", "zmq", "msgspec", "triton", "torchvision", "einops",
            "gguf", "compressed_tensors", "tvm_ffi", "sentencepiece", "openai",
            "partial_json_parser", "dill", "IPython", "aiohttp", "starlette"):
    if importlib.util.find_spec(mod) is None:
        sys.exit(1)
PY
}
SITE_NOW="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if check_installed && [[ -f "$SITE_NOW/_sglang_cpu_torchvision_stub.pth" ]]; then
    echo "sglang==$SGLANG_VERSION and its light deps already in $VENV (nothing to do)"
    exit 0
fi

PIP=("$PY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS")

# 1. torchvision 0.28.0 from the index is a CUDA build: its ops library does not load
#    beside a CPU torch and `import torchvision` then raises
#    `operator torchvision::nms does not exist` -- which breaks `from transformers
#    import LlamaConfig` for EVERY test in the venv, not only the SGLang ones.
#    A one-line .pth registers an empty `torchvision._meta_registrations` at start-up
#    (no heavy import; transforms still work, torchvision.ops do not). Written first,
#    so an interrupted install never leaves the venv's transformers unimportable.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat >"$SITE/_sglang_cpu_torchvision_stub.pth" <<'PTH'
import sys, types; sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
PTH

# 2. SGLang's Python source only.
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
# pip will then list sglang's unmet pins (torch==2.14.1, uvicorn, xgrammar, ...):
# expected, those parts of SGLang (server, grammar, CUDA kernels) are not used here.

echo "install-sglang-cpu: pip's resolver may now list 'sglang 0.5.23 requires ...' lines: expected, SGLang is installed" \
     "without its dependencies on purpose (its CUDA pins cannot sit beside the CPU torch); the tests use its Python source only"

# 3. The light deps its import chain needs (models, layers, logits processor,
#    speculative workers). Versions held by the constraints file.
"${PIP[@]}" \
    numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec \
    pydantic pyzmq tqdm ipython aiohttp "transformers==5.19.0" "torchvision==0.28.0" dill \
    "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" gguf \
    einops "openai==2.8.0" partial-json-parser

# 4. SpecForge (the trainer of SGLang's flat draft format), for `spectrace replay
#    --reference specforge`: with --no-deps, since it pins torch 2.11 and sglang 0.5.14;
#    its draft model imports with what is already here.
"${PIP[@]}" --no-deps "specforge==0.2.0"

# --- verify: torch unchanged and still CPU; the modules spectrace hooks import ----
"$PY" - <<'PY'
import sys, types
import torch
assert torch.__version__.split("+")[0] == "2.13.0" and torch.version.cuda is None, (
    f"torch changed to {torch.__version__} (cuda={torch.version.cuda})")
assert "torchvision._meta_registrations" in sys.modules, "stub .pth did not run"
from transformers import LlamaConfig  # noqa: F401  (imports torchvision)
import sglang.srt.models.llama_eagle3  # noqa: F401
import sglang.srt.models.deepseek_v2  # noqa: F401
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import specforge.modeling.draft.llama3_eagle  # noqa: F401
import importlib.metadata as md
print(f"ok: sglang {md.version('sglang')}, torch {torch.__version__}, "
      f"transformers {md.version('transformers')}")
PY

#!/usr/bin/env bash
# Builds sglang-0.5.17-site.tar.xz (about 53 MiB): a pre-extracted site-packages folder holding what
# a real SGLang 0.5.17 EAGLE-3 server needs beyond what the GPU machine's image already has (Python
# 3.12, torch 2.11.0+cu130, triton 3.6.0, numpy, safetensors, requests, aiohttp, uvloop, rich, ...).
# SGLang 0.5.11-0.5.17 pin torch==2.11.0, the image's own. scripts/live/run_live_all.sh extracts it
# on the GPU machine, which needs no package registry.
# Usage, from the repository root, on a machine with pip and a registry:
#   bash scripts/live/build_sglang_carry.sh .carry/sgl    # writes .carry/sgl/sglang-0.5.17-site.tar.xz
set -euo pipefail
out=${1:?usage: bash scripts/live/build_sglang_carry.sh OUT_DIR}
mkdir -p "$out"; work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plats=""
for n in 39 38 35 34 31 28 27 24 17; do plats="$plats --platform manylinux_2_${n}_x86_64"; done
plats="$plats --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 --platform any"
pkgs=(sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11 xgrammar==0.2.1
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34 pyzmq==27.3.0 openai==2.6.1
  orjson==3.13.0 msgspec==0.23.0 pybase64==1.5.1 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7
  compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 dill==0.4.1 ipython==9.18.1 traitlets==5.16.1
  jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 opentelemetry-api==1.45.2 distro==1.9.0 sniffio==1.3.1
  transformers==5.12.1 tokenizers==0.22.2)
PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none $plats -d "$work/wheels" "${pkgs[@]}"
site=$work/site; mkdir -p "$site"
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
# Parts of sglang-kernel that only the fa3 / FlashMLA / InfLLM / Blackwell paths load (~330 MiB).
rm -rf "$site"/sgl_kernel/flash_ops*.so "$site"/sgl_kernel/sm100 "$site"/sgl_kernel/infllm_ops* "$site"/sgl_kernel/flashmla_ops*
rm -f "$site"/xgrammar/lib/libxgrammar.a
tar -C "$site" -cJf "$out/sglang-0.5.17-site.tar.xz" .
ls -l "$out/sglang-0.5.17-site.tar.xz"

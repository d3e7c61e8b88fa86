#!/usr/bin/env bash
# Pure-Python (and pydantic-core) dependencies spectrace needs on the GPU machine, which has
# no package registry. Run on the CPU machine; unpacks them into .carry/site (git-ignored),
# which the device run names in its carry list and puts on PYTHONPATH:
#   PYTHONPATH=.:.carry/site python bench/overhead.py --device cuda
# The H200 image runs Python 3.12; PYVER overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
abi=cp${PYVER/./}
dest=.carry/site
wheels=.carry/wheels
rm -rf "$dest" "$wheels"; mkdir -p "$dest" "$wheels"
pkgs=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
)
PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --abi "$abi" --abi abi3 --abi none \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d "$wheels" "${pkgs[@]}"
for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$dest"; done
du -sh "$dest" "$wheels"
ls "$dest"

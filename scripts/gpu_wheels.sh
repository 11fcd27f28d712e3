#!/usr/bin/env bash
# The wheels that travel to a bare GPU machine (Python 3.12, torch, transformers, peft, no network) for
# benchmarks/gpu_learners.py: downloaded here into the git-ignored wheels/ folder, which the device tool
# carries with the tree (`carry: ["wheels"]`). There:
#   pip install --no-index --no-deps --target /tmp/site wheels/*.whl && PYTHONPATH=/tmp/site:. python benchmarks/gpu_learners.py
# Each is a cp312 (or pure-Python) manylinux wheel; about 6 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-wheels}
mkdir -p "$OUT"
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 megatron-core==0.16.1 liger-kernel==0.8.5 pytest-asyncio==1.5.0
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-timeout==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2  # scripts/gpu_checks.sh
)
# pydantic-core is tagged manylinux_2_17 (manylinux2014), megatron-core manylinux_2_28: name every tag a
# glibc-2.28 machine accepts, as pip would on that machine.
pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$OUT" "${WHEELS[@]}"
ls -l "$OUT"
du -sh "$OUT"

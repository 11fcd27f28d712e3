#!/usr/bin/env bash
# The device checks no CPU test can show, as one run on a bare GPU machine (no network; wheels/ filled by
# scripts/gpu_wheels.sh and carried with the tree: the device tool's `carry: ["wheels"]`):
#
#   bash scripts/gpu_checks.sh [OUTDIR]          # OUTDIR: default $OUT (the device tool's), else gpu_checks_out
#
# 1. the learners' tests with CUDA available (tests/learners, tests/megatron, tests/vcpo, 8 pytest workers):
#    OUTDIR/pytest_cuda.txt; 2. benchmarks/gpu_profile.py (where the torch learner's step goes against the
#    anchor's): OUTDIR/gpu_profile.{json,md}. Each part has its own time limit (PYTEST_S, PROFILE_S), so
#    one that hangs does not cost the other; pytest gets SIGINT at its limit and still prints its summary.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu_checks_out}}
mkdir -p "$OUTDIR"
PYTEST_S=${PYTEST_S:-300}
PROFILE_S=${PROFILE_S:-150}
pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl >"$OUTDIR/install.txt" 2>&1 || {
  echo "installing wheels/ failed (run scripts/gpu_wheels.sh first): $OUTDIR/install.txt"; exit 2; }
export PYTHONPATH=/tmp/site:. OMP_NUM_THREADS=2
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUTDIR/device.txt" 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >>"$OUTDIR/device.txt" 2>&1
echo "[$(date +%T)] pytest (limit ${PYTEST_S} s)"
timeout -s INT "$PYTEST_S" python -m pytest -n 8 tests/learners tests/megatron tests/vcpo \
  -m "not slow and not vllm and not bench and not heavy" --timeout 150 --tb=short -rfE -q \
  -p no:cacheprovider >"$OUTDIR/pytest_cuda.txt" 2>&1
echo "[$(date +%T)] pytest rc=$? $(tail -1 "$OUTDIR/pytest_cuda.txt")"
echo "[$(date +%T)] gpu_profile (limit ${PROFILE_S} s)"
timeout "$PROFILE_S" python benchmarks/gpu_profile.py --commit "$COMMIT" --out "$OUTDIR" >"$OUTDIR/gpu_profile.log" 2>&1
echo "[$(date +%T)] gpu_profile rc=$?"
tail -3 "$OUTDIR/gpu_profile.log"

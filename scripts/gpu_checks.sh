#!/usr/bin/env bash
# The device checks no CPU test can show, as one run on a bare GPU machine (no network; wheels/ filled by
# scripts/gpu_wheels.sh and carried with the tree: the device tool's `carry: ["wheels"]`):
#
#   bash scripts/gpu_checks.sh [OUTDIR]          # OUTDIR: default $OUT (the device tool's), else gpu_checks_out
#
# 1. the learners' tests with CUDA available (tests/learners, tests/megatron, tests/vcpo, 8 pytest workers):
#    OUTDIR/pytest_cuda.txt; 2. benchmarks/gpu_profile.py (where the torch learner's step goes against the
#    anchor's): OUTDIR/gpu_profile.{json,md}; 3. benchmarks/proxy_hold.py (proxy OPOB under recompute, a group's
#    graphs held vs a forward without gradients first, 0.5B shape, 2 x 32768, bf16): OUTDIR/proxy_hold.{json,md}.
#    Each part has its own time limit (PYTEST_S, PROFILE_S, HOLD_S), so
#    one that hangs does not cost the other. pytest runs verbose: every result is in the file as it lands, so
#    a run cut at its limit (xdist may lose the summary then) still says which tests failed.
#    PARTS="pytest profile hold" (default all three) picks the parts; WORKERS (default 12) the pytest workers. Each file
#    stays on one worker (--dist loadfile): a module fixture (the MoE records: 7 spawned rank groups) is built once,
#    not once per worker (on 2026-11-27 that ran past the per-test limit on 14 workers).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu_checks_out}}
mkdir -p "$OUTDIR"
PYTEST_S=${PYTEST_S:-300}
PROFILE_S=${PROFILE_S:-150}
HOLD_S=${HOLD_S:-150}
PARTS=${PARTS:-pytest profile hold}
WORKERS=${WORKERS:-12}
pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl >"$OUTDIR/install.txt" 2>&1 || {
  echo "installing wheels/ failed (run scripts/gpu_wheels.sh first): $OUTDIR/install.txt"; exit 2; }
export PYTHONPATH=/tmp/site:. OMP_NUM_THREADS=2
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUTDIR/device.txt" 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >>"$OUTDIR/device.txt" 2>&1
if [[ " $PARTS " == *" pytest "* ]]; then
  echo "[$(date +%T)] pytest, $WORKERS workers (limit ${PYTEST_S} s)"
  timeout -s INT "$PYTEST_S" python -m pytest -n "$WORKERS" tests/learners tests/megatron tests/vcpo \
    -m "not slow and not vllm and not bench and not heavy" --dist loadfile --timeout 240 --tb=short -rfE -v \
    -p no:cacheprovider -p no:benchmark >"$OUTDIR/pytest_cuda.txt" 2>&1
  echo "[$(date +%T)] pytest rc=$? $(tail -1 "$OUTDIR/pytest_cuda.txt")"
  grep -E "(FAILED|ERROR) tests/" "$OUTDIR/pytest_cuda.txt" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u | head -40
fi
if [[ " $PARTS " == *" profile "* ]]; then
  echo "[$(date +%T)] gpu_profile (limit ${PROFILE_S} s)"
  timeout "$PROFILE_S" python benchmarks/gpu_profile.py --commit "$COMMIT" --out "$OUTDIR" >"$OUTDIR/gpu_profile.log" 2>&1
  echo "[$(date +%T)] gpu_profile rc=$?"
  tail -3 "$OUTDIR/gpu_profile.log"
fi
if [[ " $PARTS " == *" hold "* ]]; then
  echo "[$(date +%T)] proxy_hold (limit ${HOLD_S} s)"
  timeout "$HOLD_S" python benchmarks/proxy_hold.py --shape qwen2.5-0.5b --device cuda --dtype bfloat16 \
    --length 32768 --rounds 2 --repeats 2 --commit "$COMMIT" --out "$OUTDIR/proxy_hold" >"$OUTDIR/proxy_hold.log" 2>&1
  echo "[$(date +%T)] proxy_hold rc=$?"
  tail -3 "$OUTDIR/proxy_hold.log"
fi

#!/usr/bin/env bash
# The device checks no CPU test can show, as one run on a bare GPU machine (no network; wheels/ filled by
# scripts/gpu_wheels.sh and carried with the tree: the device tool's `carry: ["wheels"]`):
#
#   bash scripts/gpu_checks.sh [OUTDIR]          # OUTDIR: default $OUT (the device tool's), else gpu_checks_out
#
# Parts, run in the order PARTS names them (default "learners reads": issue 63's cells, exact OPOB from ghost
# norms against the tuned anchor, then the ghost path's syncs; about 510 s; "pytest profile hold" when asked):
#   pytest    the learners' tests with CUDA available (PYTEST_PATHS, default tests/learners tests/megatron
#             tests/vcpo; WORKERS pytest workers, default 12, but a file runs whole on one worker, so no more
#             workers work than there are files): pytest_cuda.txt in OUTDIR/logs.tar.gz
#   profile   benchmarks/host_reads.py --device cuda (the torch learner's reads of the device per step, counted
#             and, with torch's sync debug mode, the real syncs; seconds, into logs.tar.gz as host_reads_cuda.*),
#             then benchmarks/gpu_profile.py (where each learner's step goes against the anchor's, and its host
#             syncs): OUTDIR/gpu_profile.{json,md}, written after each cell (a run cut at PROFILE_S keeps the cells
#             it profiled); its first five cells took 93 s on 2026-11-28, the two Megatron cells come last
#   reads     benchmarks/host_reads.py --device cuda alone (its ghost-norm cell too): host_reads_cuda.* in logs.tar.gz
#   hold      benchmarks/proxy_hold.py (proxy OPOB under recompute, a group's graphs held vs a forward without
#             gradients first, 0.5B shape, 2 x 32768, bf16; HOLD_ROUNDS rounds, default 2):
#             OUTDIR/proxy_hold.{json,md}
#   learners  benchmarks/gpu_learners.py inside LEARNERS_S seconds (its own budget; the cells it has no time
#             for are recorded as not run): OUTDIR/gpu_learners.{json,md}
#   mainjob   benchmarks/main_job_seeds.py --devices cuda --bare over MAIN_SEEDS (default "0 1 2"): the main job with
#             its learner on the GPU, one run per seed from the CPU's SFT warm start, which travels with the tree
#             (`carry: ["wheels", "runs/tiny_tir/sft"]`: 8 MB; without it the first run makes its own, 2-3 min);
#             starts no run after MAIN_S - 90 s: OUTDIR/main_job_seeds.{json,md} and OUTDIR/main_job_runs.jsonl
#             (put it in runs/bench/main_job_seeds/runs.jsonl here and run the CPU seeds: the report sets both)
# Each part has its own time limit (PYTEST_S, PROFILE_S, HOLD_S, LEARNERS_S), so one that hangs does not cost
# the others; the device tool's limit is 600 s a command, so pick limits that sum below it. pytest runs
# verbose: every result is in the file as it lands, so a run cut at its limit (xdist may lose the summary then)
# still says which tests failed; put it last when its limit may cut it. Each test file stays on one worker
# (--dist loadfile): a module fixture (the MoE records: 7 spawned rank groups) is built once, not once per
# worker (on 2026-11-27 that ran past the per-test limit on 14 workers).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu_checks_out}}
mkdir -p "$OUTDIR"
# The logs (install, device, pytest, each benchmark's output) go to one tarball, OUTDIR/logs.tar.gz, packed
# again after every part: the device tool brings back at most 8 files, and a run cut at its limit keeps the
# logs of the parts that ended.
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
pack() { tar -czf "$OUTDIR/logs.tar.gz" -C "$LOGS" .; }
PYTEST_S=${PYTEST_S:-300}
PROFILE_S=${PROFILE_S:-150}
HOLD_S=${HOLD_S:-150}
LEARNERS_S=${LEARNERS_S:-330}
MAIN_S=${MAIN_S:-300}
MAIN_SEEDS=${MAIN_SEEDS:-0 1 2}
HOLD_ROUNDS=${HOLD_ROUNDS:-2}
PARTS=${PARTS:-learners reads}
WORKERS=${WORKERS:-12}
PYTEST_PATHS=${PYTEST_PATHS:-tests/learners tests/megatron tests/vcpo}
for part in $PARTS; do  # a misspelt part is refused before anything is installed or run
  case $part in pytest | profile | reads | hold | learners | mainjob) ;; *)
    echo "PARTS: unknown part '$part' (pytest, profile, reads, hold, learners, mainjob)"; exit 2 ;; esac
done
pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl >"$LOGS/install.txt" 2>&1 || {
  pack; echo "installing wheels/ failed (run scripts/gpu_wheels.sh first): install.txt in $OUTDIR/logs.tar.gz"; exit 2; }
export PYTHONPATH=/tmp/site:. OMP_NUM_THREADS=2
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$LOGS/device.txt" 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >>"$LOGS/device.txt" 2>&1
# limited NAME SECONDS SIGNAL LOG CMD...: one part under its time limit (SIGNAL sent at it), its output in
# $LOGS/LOG; then its exit status and the log's last lines
limited() {
  local name=$1 limit=$2 sig=$3 log=$4
  shift 4
  timeout -s "$sig" "$limit" "$@" >"$LOGS/$log" 2>&1
  local rc=$?
  echo "[$(date +%T)] $name rc=$rc"
  tail -3 "$LOGS/$log"
}
run_pytest() {
  echo "[$(date +%T)] pytest, $WORKERS workers (limit ${PYTEST_S} s): $PYTEST_PATHS"
  # shellcheck disable=SC2086  # PYTEST_PATHS is a list of paths
  limited pytest "$PYTEST_S" INT pytest_cuda.txt python -m pytest -n "$WORKERS" $PYTEST_PATHS \
    -m "not slow and not vllm and not bench and not heavy" --dist loadfile --timeout 240 --tb=short -rfE -v \
    -p no:cacheprovider -p no:benchmark
  grep -E "(FAILED|ERROR) tests/" "$LOGS/pytest_cuda.txt" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u | head -40
}
run_reads() {
  echo "[$(date +%T)] host_reads (limit 120 s)"
  limited host_reads 120 TERM host_reads.log python benchmarks/host_reads.py --device cuda --commit "$COMMIT" \
    --out "$LOGS/host_reads_cuda"
}
run_profile() {
  run_reads
  echo "[$(date +%T)] gpu_profile (limit ${PROFILE_S} s)"
  limited gpu_profile "$PROFILE_S" TERM gpu_profile.log python benchmarks/gpu_profile.py --commit "$COMMIT" --out "$OUTDIR"
}
run_hold() {
  echo "[$(date +%T)] proxy_hold, $HOLD_ROUNDS rounds (limit ${HOLD_S} s)"
  limited proxy_hold "$HOLD_S" TERM proxy_hold.log python benchmarks/proxy_hold.py --shape qwen2.5-0.5b --device cuda \
    --dtype bfloat16 --length 32768 --rounds "$HOLD_ROUNDS" --repeats 2 --commit "$COMMIT" --out "$OUTDIR/proxy_hold"
}
run_learners() {
  # the benchmark's own budget ends it inside the limit; the limit's 60 s more are for its model build and
  # report, and the kill only for a hang (its partial file keeps the cells measured)
  echo "[$(date +%T)] gpu_learners (budget ${LEARNERS_S} s)"
  limited gpu_learners "$((LEARNERS_S + 60))" TERM gpu_learners.log python benchmarks/gpu_learners.py \
    --budget-s "$LEARNERS_S" --commit "$COMMIT" --out "$OUTDIR"
}
run_mainjob() {
  # the benchmark drains (no run started past MAIN_S - 90 s, one run takes about a minute); each run's output
  # and metrics go into logs.tar.gz
  echo "[$(date +%T)] main job, learner on cuda, seeds $MAIN_SEEDS (limit ${MAIN_S} s)"
  # shellcheck disable=SC2086  # MAIN_SEEDS is a list of seeds
  limited main_job "$MAIN_S" TERM main_job.log python benchmarks/main_job_seeds.py --devices cuda --seeds $MAIN_SEEDS \
    --bare --time-limit-s "$((MAIN_S - 90))" --work "$LOGS/main_job" --out "$OUTDIR"
  cp "$LOGS/main_job/runs.jsonl" "$OUTDIR/main_job_runs.jsonl" 2>/dev/null
  for run in runs/main_job_cuda_s*; do
    [ -d "$run" ] && mkdir -p "$LOGS/$run" && cp "$run/report.txt" "$run/rl/metrics.jsonl" "$LOGS/$run/" 2>/dev/null
  done
}
pack
for part in $PARTS; do "run_$part"; pack; done

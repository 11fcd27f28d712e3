#!/usr/bin/env bash
# Staleness study, level (b): the full stack (embedded engine, local sandbox, buffer, torch learner) on
# tiny_arith, every batch exactly k versions stale (rollout.fixed_lag), from the tiny_tir warm start (run
# `make run` first). The stabiliser comparison: plain REINFORCE, sequence TIS, masking (mis), M2PO and VCPO
# with void-turn masking off (`_nomaskvoid`), and VCPO with it on. k = 0 runs only plain and VCPO: with
# behaviour = current every IS weight is 1, so tis/mis/m2po make plain's update.
# Usage: benchmarks/stress/level_b.sh [SEEDS...]   (default 0 1 2 3 4)
#   LAGS="0 4 8 16" METHODS="plain tis mis m2po vcpo vcpo_maskvoid" JOBS=2 STEPS=40 EVAL_EVERY=5   (defaults)
# Each run's metrics.jsonl (every step's ESS, grad norm, IS weights, KL; held-out accuracy every 5 steps)
# is packed by level_b_report into benchmarks/results/stress/runs_b.jsonl.gz; finished runs are skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${*:-0 1 2 3 4}
LAGS=${LAGS:-0 4 8 16}
METHODS=${METHODS:-plain tis mis m2po vcpo vcpo_maskvoid}
JOBS=${JOBS:-2}
STEPS=${STEPS:-40}
WARM=${WARM:-runs/tiny_tir/sft}  # the warm start (a copy keeps a grid steady while `make run` rebuilds it)
EVAL_EVERY=${EVAL_EVERY:-5}
export WARM STEPS EVAL_EVERY
overrides() {  # method -> recipe overrides
  local base="--set algorithm.advantage=grpo --set algorithm.ess_lr_rule=none --set buffer.mask_void=false"
  case "$1" in
    plain) echo "--set algorithm.loss=reinforce $base" ;;
    tis) echo "--set algorithm.loss=tis_seq $base" ;;
    mis) echo "--set algorithm.loss=mis $base" ;;
    m2po) echo "--set algorithm.loss=m2po $base" ;;
    vcpo) echo "--set buffer.mask_void=false" ;;  # the recipe's VCPO (proxy OPOB, sqrt ESS lr)
    vcpo_maskvoid) echo "--set buffer.mask_void=true" ;;
    *) echo "unknown method $1" >&2; exit 2 ;;
  esac
}
run() {  # name lag seed [overrides...]
  local name=$1 lag=$2 seed=$3
  shift 3
  [ -f "runs/$name/metrics.jsonl" ] && [ "$(wc -l < "runs/$name/metrics.jsonl")" -ge "$STEPS" ] && return 0
  rm -rf "runs/$name"
  OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m agent_rl.cli train recipes/tiny_tir.yaml --set model.path="$WARM" --set rollout.fixed_lag="$lag" \
    --set train.seed="$seed" --set train.steps="$STEPS" --set name="$name" --set logging.tensorboard=false \
    --set checkpoint.every=0 --set eval.every="$EVAL_EVERY" "$@" > "runs/$name.log" 2>&1 || echo "FAILED $name (runs/$name.log)"
  echo "done $name"
}
export -f run
mkdir -p runs
for s in $SEEDS; do
  for k in $LAGS; do
    for m in $METHODS; do
      case "$m" in tis|mis|m2po) [ "$k" = 0 ] && continue ;; esac
      suffix=$([ "$m" = vcpo_maskvoid ] && echo "vcpo" || echo "${m}_nomaskvoid")
      echo "stress_b_${suffix}_k${k}_s${s} $k $s $(overrides "$m")"
    done
  done
done | xargs -P "$JOBS" -L 1 bash -c 'run "$@"' _
.venv/bin/python -m benchmarks.stress.level_b_report runs benchmarks/results/stress/level_b_stabilisers.md

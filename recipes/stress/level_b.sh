#!/usr/bin/env bash
# Staleness study, level (b): the full stack (embedded engine, local sandbox, buffer, torch learner) on
# tiny_arith with deterministic lag injection (rollout.fixed_lag), VCPO vs plain REINFORCE, from the
# tiny_tir warm start (run `make run` first); each also with void-turn masking off (`_nomaskvoid`). Usage: recipes/stress/level_b.sh [SEEDS...]  (default: 0 1 2 3 4)
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${*:-0 1 2 3 4}
PLAIN="--set algorithm.loss=reinforce --set algorithm.advantage=grpo --set algorithm.ess_lr_rule=none"
run() {  # method lag seed [overrides...]
  local name="stress_b_$1_k$2_s$3"
  [ -f "runs/$name/metrics.jsonl" ] && [ "$(wc -l < "runs/$name/metrics.jsonl")" -ge 40 ] && return
  rm -rf "runs/$name"
  OMP_NUM_THREADS=1 .venv/bin/agent-rl train recipes/tiny_tir.yaml --set rollout.fixed_lag="$2" \
    --set train.seed="$3" --set name="$name" --set logging.tensorboard=false "${@:4}" > "runs/$name.log" 2>&1
  echo "done $name"
}
mkdir -p runs
NV="--set buffer.mask_void=false"  # void-turn trajectories keep their loss (SimpleTIR masks them)
for s in $SEEDS; do
  run vcpo 0 "$s" & run vcpo 4 "$s" & wait
  run plain 4 "$s" $PLAIN & run vcpo 8 "$s" & wait
  run plain 8 "$s" $PLAIN & run vcpo_nomaskvoid 0 "$s" $NV & wait
  run vcpo_nomaskvoid 4 "$s" $NV & run vcpo_nomaskvoid 8 "$s" $NV & wait
  run plain_nomaskvoid 4 "$s" $PLAIN $NV & run plain_nomaskvoid 8 "$s" $PLAIN $NV & wait
done
.venv/bin/python -m recipes.stress.level_b_report runs benchmarks/results/stress/level_b.md

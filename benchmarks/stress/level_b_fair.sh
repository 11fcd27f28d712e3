#!/usr/bin/env bash
# Staleness study, level (b), lr-matched (issue 28): every baseline at its best lr vs VCPO, VCPO's parts ablated.
# Usage: benchmarks/stress/level_b_fair.sh PART    (run the parts in this order; each resumes where it stopped)
#   select   plain/tis/mis/m2po x lr {5e-5, 1.5e-4, 5e-4} at k=4, seeds 0-2 (36 runs): picks each method's lr
#   heldout  each baseline at its chosen lr and VCPO at the recipe's 5e-4, k in {0,4,8}, seeds 3-7
#   fill     the verdict table's cells (issue 39): VCPO at the best baseline's lr, ESS lr alone and OPOB alone at 5e-4
#   ablate   VCPO, ESS lr alone and OPOB alone at every lr, k in {0,4,8}, seeds 3-7 (the baselines' chosen lrs first)
#   report   benchmarks/results/stress/level_b_fair.{json,md,png} from the finished runs (each part ends with it)
# JOBS=1 (runs at a time; the machine is shared), WARM=runs/tiny_tir/sft (the warm start; a copy keeps it steady), STEPS=40, EVAL_EVERY=0 (no periodic eval: the final checkpoint is what is scored).
# Every run is trained under nice -n $NICE (default 15), then its final checkpoint is evaluated (final_eval.json: the run counts
# from then on) and the checkpoint is deleted. Run dirs: runs/stress_f_<method>_lr<lr>_k<k>_s<seed>.
set -euo pipefail
{  # braces: bash reads the whole script before running it, so editing the file mid-study is safe
cd "$(dirname "$0")/../.."
PART=${1:?usage: benchmarks/stress/level_b_fair.sh select|heldout|fill|ablate|report}
JOBS=${JOBS:-1}
STEPS=${STEPS:-40}
WARM=${WARM:-runs/tiny_tir/sft}
EVAL_EVERY=${EVAL_EVERY:-0}
PY=.venv/bin/python
NICE=${NICE:-15}
export WARM STEPS EVAL_EVERY PY NICE
[ -f "$WARM/model.safetensors" ] || { echo "no warm start at $WARM: run 'make run' first (or set WARM=DIR)" >&2; exit 2; }
run() {  # name lag seed [--set ...]
  local name=$1 lag=$2 seed=$3
  shift 3
  [ -f "runs/$name/final_eval.json" ] && return 0
  if ! { [ -f "runs/$name/metrics.jsonl" ] && [ "$(wc -l < "runs/$name/metrics.jsonl")" -ge "$STEPS" ] \
         && [ -e "runs/$name/checkpoints/latest" ]; }; then
    rm -rf "runs/$name"
    OMP_NUM_THREADS=1 nice -n "$NICE" $PY -m agent_rl.cli train recipes/tiny_tir.yaml --set model.path="$WARM" \
      --set rollout.fixed_lag="$lag" --set train.seed="$seed" --set train.steps="$STEPS" --set name="$name" \
      --set logging.tensorboard=false --set checkpoint.every=0 --set eval.every="$EVAL_EVERY" "$@" \
      > "runs/$name.log" 2>&1 || { echo "FAILED $name (runs/$name.log)"; return 0; }
  fi
  nice -n "$NICE" $PY -m benchmarks.stress.final_eval runs --jobs 1 --glob "$name" | tail -1
  [ -f "runs/$name/final_eval.json" ] && rm -rf "runs/$name/checkpoints"
  return 0
}
export -f run
mkdir -p runs
if [ "$PART" != report ]; then
  $PY -m benchmarks.stress.level_b_fair plan "$PART" > "runs/level_b_fair_$PART.plan"
  total=$(wc -l < "runs/level_b_fair_$PART.plan")
  i=0
  # one report every JOBS runs, so the tables fill in as the runs finish
  xargs -P "$JOBS" -L 1 bash -c 'run "$@"' _ < "runs/level_b_fair_$PART.plan" | while read -r msg; do
        i=$((i + 1)); echo "[$i/$total] $msg"
        if [ $((i % JOBS)) -eq 0 ]; then
          $PY -m benchmarks.stress.level_b_fair report > /dev/null || echo "report failed (the runs go on)"
        fi
      done
fi
$PY -m benchmarks.stress.level_b_fair report
exit
}

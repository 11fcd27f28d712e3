#!/usr/bin/env bash
# Evidence for the collapse monitor's responses (monitor.on_warning), full stack on tiny_arith from the
# tiny_tir warm start (run `make run` first), plain REINFORCE with void masking off (the method that
# collapses under a fixed lag, docs/studies/staleness.md):
#   rollback: every batch exactly k stale (rollout.fixed_lag=k), on_warning=rollback (checkpoint every 5
#             steps); the no-response runs are the `none` part (plain, the same seeds and k, eval every 5
#             steps; named stress_b_plain_nomaskvoid_* as the retired level_b.sh named them, so its runs count).
#   adapt:    ordinary async runs (buffer.max_staleness=k, no fixed lag) with on_warning=adapt_staleness,
#             against the same with no response (fixed k) and against k=0 (synchronous).
# Usage: benchmarks/stress/responses.sh [SEEDS...]   (default 0 1 2 3 4)
#   LAGS="8 16" PARTS="none rollback adapt" SYNC=1 JOBS=2 STEPS=40   (the defaults; SYNC=0 skips the k=0 runs,
#   e.g. when a second pass adds a lag and the report already holds them)
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${*:-0 1 2 3 4}
LAGS=${LAGS:-8 16}
PARTS=${PARTS:-none rollback adapt}
JOBS=${JOBS:-2}
STEPS=${STEPS:-40}
SYNC=${SYNC:-1}
WARM=${WARM:-runs/tiny_tir/sft}  # the warm start (a copy keeps a grid steady while `make run` rebuilds it)
export WARM STEPS
PLAIN="--set algorithm.loss=reinforce --set algorithm.advantage=grpo --set algorithm.ess_lr_rule=none --set buffer.mask_void=false"
run() {  # name [overrides...]
  local name=$1
  shift
  [ -f "runs/$name/metrics.jsonl" ] && [ "$(wc -l < "runs/$name/metrics.jsonl")" -ge "$STEPS" ] && return 0
  rm -rf "runs/$name"
  OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m agent_rl.cli train recipes/tiny_tir.yaml --set model.path="$WARM" --set train.seed="${name##*_s}" \
    --set train.steps="$STEPS" --set name="$name" --set logging.tensorboard=false --set monitor.on_warning=log "$@" > "runs/$name.log" 2>&1 \
    || echo "FAILED $name (runs/$name.log)"
  echo "done $name"
}
export -f run
mkdir -p runs
for s in $SEEDS; do
  for k in $LAGS; do
    for part in $PARTS; do
      case "$part" in
        none)
          echo "stress_b_plain_nomaskvoid_k${k}_s${s} --set rollout.fixed_lag=$k --set checkpoint.every=0 --set eval.every=5 $PLAIN" ;;
        rollback)
          echo "stress_r_rollback_k${k}_s${s} --set rollout.fixed_lag=$k --set monitor.on_warning=rollback --set checkpoint.every=5 --set checkpoint.keep=4 $PLAIN" ;;
        adapt)
          echo "stress_r_adapt_k${k}_s${s} --set buffer.max_staleness=$k --set monitor.on_warning=adapt_staleness --set checkpoint.every=0 $PLAIN"
          echo "stress_r_fixed_k${k}_s${s} --set buffer.max_staleness=$k --set checkpoint.every=0 $PLAIN" ;;
      esac
    done
  done
  if [ "$SYNC" = 1 ]; then
    case " $PARTS " in *" adapt "*) echo "stress_r_fixed_k0_s${s} --set buffer.max_staleness=0 --set checkpoint.every=0 $PLAIN" ;; esac
  fi
done | xargs -P "$JOBS" -L 1 bash -c 'run "$@"' _
.venv/bin/python -m benchmarks.stress.responses_report runs benchmarks/results/stress/responses.md

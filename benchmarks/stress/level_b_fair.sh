#!/usr/bin/env bash
# Staleness study, level (b), lr-matched (issue 28): every baseline at its best lr vs VCPO, VCPO's parts ablated.
# Usage: benchmarks/stress/level_b_fair.sh PART    (run the parts in this order; each resumes where it stopped)
#   select   plain/tis/mis/m2po x lr {5e-5, 1.5e-4, 5e-4} at k=4, seeds 0-2 (36 runs): picks each method's lr
#   heldout  each baseline at its chosen lr and VCPO at the recipe's 5e-4, k in {0,4,8}, seeds 3-7
#   fill     the verdict table's cells (issue 39): VCPO at the best baseline's lr, ESS lr alone and OPOB alone at 5e-4
#   ablate   VCPO, ESS lr alone and OPOB alone at every lr, k in {0,4,8}, seeds 3-7 (the baselines' chosen lrs first)
#   report   benchmarks/results/stress/level_b_fair.{json,md,png} from the finished runs (each part ends with it)
# JOBS=1 (runs at a time; the machine is shared), WARM=runs/tiny_tir/sft (the warm start). The runner is
# `python -m benchmarks.stress.level_b_fair run PART` (benchmarks/harness/pool.py: SIGUSR1 drains, SIGTERM stops);
# every run is trained under nice -n 15, its final checkpoint evaluated (final_eval.json: the run counts from then
# on) and its checkpoints deleted. Run dirs: runs/stress_f_<method>_lr<lr>_k<k>_s<seed>.
set -euo pipefail
cd "$(dirname "$0")/../.."
PART=${1:?usage: benchmarks/stress/level_b_fair.sh select|heldout|fill|ablate|report}
if [ "$PART" = report ]; then exec .venv/bin/python -m benchmarks.stress.level_b_fair report; fi
exec .venv/bin/python -m benchmarks.stress.level_b_fair run "$PART" --jobs "${JOBS:-1}" --warm "${WARM:-runs/tiny_tir/sft}"

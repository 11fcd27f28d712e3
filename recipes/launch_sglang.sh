#!/usr/bin/env bash
# Start one SGLang server per engine url of the recipe (one GPU each, on this node), then the trainer.
# Usage: recipes/launch_sglang.sh RECIPE.yaml   (on the engine node; `ray start --head` done for multi-node)
set -euo pipefail
RECIPE=${1:?usage: recipes/launch_sglang.sh RECIPE.yaml}
read -r MODEL N CTX < <(python - "$RECIPE" <<'PY'
import sys, yaml
r = yaml.safe_load(open(sys.argv[1]))
print(r["model"]["path"], len(r["engines"]["urls"]), r["engines"].get("max_seq_len", 2048))
PY
)
for gpu in $(seq 0 $((N - 1))); do
  CUDA_VISIBLE_DEVICES=$gpu python -m sglang.launch_server --model-path "$MODEL" --port $((30000 + gpu)) \
    --host 0.0.0.0 --mem-fraction-static 0.8 --context-length "$CTX" > "sglang_$gpu.log" 2>&1 &
done
trap 'kill $(jobs -p) 2>/dev/null' EXIT
agent-rl train "$RECIPE"

#!/usr/bin/env bash
# Start the Ray cluster a GPU recipe's `placement.nodes` describes, then train on it (README: "Two nodes,
# step by step"). Every node needs the same agent-rl install, model.path and the run dir on a filesystem every
# node sees (the learner's rank 0 writes checkpoints, the driver writes metrics, both under RUN_DIR).
#
#   on the first node, of the kind placement.rollout names (the driver runs there):
#       recipes/launch_cluster.sh head engines
#   on every other node, with the kind it plays:
#       recipes/launch_cluster.sh join HEAD_IP trainer
#   then on the first node:
#       recipes/launch_cluster.sh train recipes/dapo_aime/vcpo_k2.yaml [--set key=value ...]
#
# `head`/`join` start Ray here with the node-kind resource the recipe's roles ask for (GPUs are detected by
# Ray). `train` prints the plan node by node, then runs `agent-rl train RECIPE --address auto` on this node:
# Ray starts one SGLang server per engine replica on the engines node(s) (its GPUs, --tp = placement.engine.gpus),
# the learner ranks on the trainer node(s) (each Megatron TP group on one node) and, when set, the sandbox
# service; no role lands on GPUs another role holds. `stop` stops Ray on this node.
# Multi-homed nodes: export AGENT_RL_NODE_IP (the address servers listen on) and NCCL_SOCKET_IFNAME first.
set -euo pipefail
usage="usage: $0 head KIND | join HEAD_IP KIND | train RECIPE [agent-rl train args] | stop"
cmd=${1:?$usage}
shift
# Ray starts its workers at nice 15; on these nodes the workers are the job (engine servers, learner ranks), so
# they run at the priority of everything else. Export RAY_worker_niceness yourself to choose otherwise.
export RAY_worker_niceness=${RAY_worker_niceness:-0}
case "$cmd" in
  head) ray start --head --port 6379 --resources "{\"${1:?$usage}\": 1}" ;;
  join) ray start --address "${1:?$usage}:6379" --resources "{\"${2:?$usage}\": 1}" ;;
  train)
    recipe=${1:?$usage}
    shift
    agent-rl train "$recipe" --address auto --dry-run "$@"
    exec agent-rl train "$recipe" --address auto "$@"
    ;;
  stop) ray stop ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

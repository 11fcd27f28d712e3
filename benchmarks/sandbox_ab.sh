#!/bin/bash
# print(1+1) sandbox throughput of this tree against another commit (default: main), alternated in one window
# (this, other, this, other) so machine load hits both alike: benchmarks/sandbox_bench.py in each tree,
# under nice -n 15. Usage: bash benchmarks/sandbox_ab.sh [REF] [OUT_DIR]; the JSONs land in OUT_DIR.
set -e
root=$(cd "$(dirname "$0")/.." && pwd); ref=${1:-main}; out=${2:-$root/runs/sandbox_ab}
other=$(mktemp -d); mkdir -p "$out"
git -C "$root" archive "$ref" | tar -x -C "$other"
for i in 1 2; do
  for side in new old; do
    dir=$root; [ $side = old ] && dir=$other
    echo "=== $side $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH=$dir nice -n 15 "$root/.venv/bin/python" benchmarks/sandbox_bench.py \
      --calls 1000 --mix-calls 20 --rounds 3 > "$out/$side-$i.txt" 2>&1)
    cp "$dir/benchmarks/results/sandbox_bench.json" "$out/$side-$i.json"
  done
done
git -C "$root" checkout -- benchmarks/results/sandbox_bench.json benchmarks/results/sandbox_bench.md
rm -rf "$other"

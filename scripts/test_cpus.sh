#!/usr/bin/env bash
# `make test-cpus`: the test suite under other torch thread counts and other CPU kernel sets, so that a
# tolerance tuned on one machine shows up here and not on a user's AMD EPYC, Intel or ARM machine.
#
#   bash scripts/test_cpus.sh [pytest args]       # default: the whole default suite (~10-25 min a pass)
#   bash scripts/test_cpus.sh tests/vcpo tests/loop/test_sync_parity.py
#
# Passes (one pytest run each, in this order):
#   2 threads, ATEN_CPU_CAPABILITY=default   (no vector kernels: other reduction orders everywhere)
#   2 threads, ATEN_CPU_CAPABILITY=avx2      (x86-64 with AVX2 only)
#   2 threads, ATEN_CPU_CAPABILITY=avx512    (x86-64 whose /proc/cpuinfo lists avx512f, avx512bw, avx512vl, avx512dq)
#   1 thread,  the CPU's best kernels (torch's own choice)
# OMP_NUM_THREADS sets torch's intra-op threads in the test process and everything it starts (code that sets
# its own count, such as pinned learner ranks, keeps it). Logs and a summary table go to runs/test-cpus/.
# Exits non-zero if any pass failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT="${TEST_CPUS_OUT:-runs/test-cpus}"
mkdir -p "$OUT"
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }

passes=("2 default")
if [ "$(uname -m)" = x86_64 ]; then
    has avx2 fma && passes+=("2 avx2")
    has avx512f avx512bw avx512vl avx512dq && passes+=("2 avx512")
fi
passes+=("1 native")

summary="$OUT/summary.md"
{
    echo "# make test-cpus, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; pytest ${*:-(default suite)}"
    echo
    echo "| threads | ATEN_CPU_CAPABILITY | torch picked | result | minutes |"
    echo "|---|---|---|---|---|"
} > "$summary"

status=0
for p in "${passes[@]}"; do
    read -r threads cap <<<"$p"
    vars=("OMP_NUM_THREADS=$threads")
    [ "$cap" != native ] && vars+=("ATEN_CPU_CAPABILITY=$cap")
    picked=$(env "${vars[@]}" "$PY" -c 'import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())')
    log="$OUT/threads${threads}-${cap}.log"
    echo "== test-cpus: ${vars[*]} (torch: $picked) -> $log"
    start=$(date +%s)
    env "${vars[@]}" "$PY" -m pytest -q "$@" >"$log" 2>&1
    rc=$?
    mins=$(awk "BEGIN { printf \"%.1f\", ($(date +%s) - $start) / 60 }")
    result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
    echo "   ${result:-rc $rc} in $mins min"
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/   /'
    echo "| $threads | $cap | ${picked% *} | ${result:-rc $rc} | $mins |" >> "$summary"
    [ $rc -eq 0 ] || status=1
done
echo
cat "$summary"
exit $status

#!/usr/bin/env bash
# scripts/bench-plan.sh: wall time of `tensorpool plan` on one core, median of N runs
# (docs/benchmarks.md, "plan on one core"). Usage: scripts/bench-plan.sh [TENSORPOOL] [N] [-- PLAN ARGS]
# Default: build-release/tools/tensorpool, 3 runs, Llama-2-7B in the PyTorch loop on 80 GiB.
set -euo pipefail
bin=${1:-build-release/tools/tensorpool}
runs=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--model llama2-7b --capacity 80GiB --global-batch 64)
[ -x "$bin" ] || { echo "bench-plan: no executable '$bin' (make build-release first)" >&2; exit 2; }
times=()
for _ in $(seq "$runs"); do
  start=$(date +%s.%N)
  taskset -c 0 "$bin" plan "${args[@]}" --quiet >/dev/null
  end=$(date +%s.%N)
  times+=("$(echo "$end - $start" | bc -l)")
done
printf '%s\n' "${times[@]}" | sort -n | awk -v args="${args[*]}" '{ t[NR] = $1 } END {
  printf "plan %s on one core: median %.2f s over %d runs (min %.2f, max %.2f)\n", args, t[int((NR + 1) / 2)], NR, t[1], t[NR] }'

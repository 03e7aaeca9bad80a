#!/usr/bin/env bash
# Runs two builds of a Google Benchmark program in turn, pinned to one core, and prints each
# benchmark's median, minimum and maximum per build: a comparison on a shared machine, where
# alternating the two spreads the load over both.
# Usage: bench-side-by-side.sh BASE_BINARY NEW_BINARY FILTER [ROUNDS] [REPETITIONS]
set -euo pipefail
base=$1 new=$2 filter=$3 rounds=${4:-6} reps=${5:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
  for who in base new; do
    bin=$base; [ "$who" = new ] && bin=$new
    taskset -c 1 "$bin" --benchmark_filter="$filter" --benchmark_repetitions="$reps" \
      --benchmark_format=json >"$work/$who-$round.json" 2>/dev/null
  done
done
python3 - "$work" <<'PY'
import collections, glob, json, statistics, sys
times = collections.defaultdict(lambda: collections.defaultdict(list))
for path in glob.glob(sys.argv[1] + "/*.json"):
    who = path.rsplit("/", 1)[1].split("-")[0]
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "iteration":
            times[b["run_name"]][who].append(b["real_time"])
for name, t in sorted(times.items()):
    b, n = t["base"], t["new"]
    print(f"{name}: base median {statistics.median(b):.1f} ns ({min(b):.1f}-{max(b):.1f}), "
          f"new median {statistics.median(n):.1f} ns ({min(n):.1f}-{max(n):.1f}), "
          f"ratio {statistics.median(n) / statistics.median(b):.3f}")
PY

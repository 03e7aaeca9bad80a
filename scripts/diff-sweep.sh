#!/usr/bin/env bash
# Runs the differential test's virtual-memory cases on extra seeds, one run per seed and case
# (TENSORPOOL_DIFF_SEED; docs/reliability.md, "Differential testing"), at TENSORPOOL_DIFF_SCALE
# (default 2) times the operations per run. Copy the test binary first when a build may replace
# it meanwhile. Prints each failure's seed, case and report (the shrunk operations); exit 1 if
# any failed, 2 on a usage error.
# Usage: scripts/diff-sweep.sh BINARY FIRST_SEED LAST_SEED
#   e.g. cp build/tests/reliability/tensorpool_test_differential /tmp/difftest
#        scripts/diff-sweep.sh /tmp/difftest 70001 70030
set -u
if [ $# -ne 3 ] || ! [[ $2 =~ ^[0-9]+$ && $3 =~ ^[0-9]+$ ]] || [ "$2" -gt "$3" ]; then
  echo "usage: scripts/diff-sweep.sh BINARY FIRST_SEED LAST_SEED (seeds: integers, first <= last)" >&2
  exit 2
fi
binary=$1
if ! [ -x "$binary" ]; then
  echo "diff-sweep: $binary: not an executable (build tensorpool_test_differential first)" >&2
  exit 2
fi
cases=(
  "differential: vmm mode, defaults"
  "differential: the default mode (vmm on the simulated device), 1 GiB limit"
  "differential: vmm mode, repeated steps (plans followed, holes mapped, pages given back), 1 GiB limit"
  "differential: vmm mode, repeated steps, growth steps of the whole pool and no idle memory kept (small holes under a step's base traded for the pages above its plan), 1 GiB limit"
  "differential: vmm mode, repeated steps that never call step(), found (vmm_find_steps), 1 GiB limit"
  "differential: vmm mode, the background planner, 1 GiB limit"
  "differential: vmm mode, small growth steps, 1 GiB limit"
  "differential: vmm mode, chunks of vmm_max_chunk (no divisor), 1 GiB limit"
)
failed=0
for seed in $(seq "$2" "$3"); do
  for name in "${cases[@]}"; do
    # Catch's test spec splits names at commas: escape them. A name that matches no case runs
    # nothing and exits 0, so the count of test cases run is checked too.
    out=$(TENSORPOOL_DIFF_SCALE=${TENSORPOOL_DIFF_SCALE:-2} TENSORPOOL_DIFF_SEED=$seed "$binary" "${name//,/\\,}" 2>&1)
    status=$?
    if [ $status -ne 0 ] || ! grep -qE "in 1 test case|test cases: 1 \| 1 passed" <<<"$out"; then
      echo "diff-sweep: FAILED seed $seed, case \"$name\" (exit $status)"
      tail -n 40 <<<"$out"
      failed=$((failed + 1))
    fi
  done
done
echo "diff-sweep: seeds $2-$3, ${#cases[@]} cases each: $failed failed"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# Runs one libFuzzer target of build-asan/fuzz for SECONDS from its seed corpus (make fuzz runs
# several at once): new inputs to fuzz-corpus-TARGET/, a crash to fuzz-corpus-crashes/, the log to
# fuzz-corpus-logs/TARGET.log. Exit 1 on a crash, after its log's tail.
# Usage: scripts/fuzz-one.sh TARGET SECONDS
set -u
t=$1
seconds=$2
mkdir -p "fuzz-corpus-$t" fuzz-corpus-crashes fuzz-corpus-logs
if ! "build-asan/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="fuzz-corpus-crashes/$t-" "fuzz-corpus-$t" "fuzz/corpus/$t" >"fuzz-corpus-logs/$t.log" 2>&1; then
  tail -n 60 "fuzz-corpus-logs/$t.log"
  echo "fuzz_$t: CRASH (input in fuzz-corpus-crashes/)"
  exit 1
fi
runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "fuzz-corpus-logs/$t.log" | grep -o '[0-9]*$')
echo "fuzz_$t: $seconds s, $runs executions, no crash"

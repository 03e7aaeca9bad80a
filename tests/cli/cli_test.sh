#!/usr/bin/env bash
# End-to-end tests of the tensorpool CLI: every subcommand, JSON keys, exit codes and messages.
# Usage: cli_test.sh TENSORPOOL_BINARY SHARED_TRACES_DIR
set -u
bin=$1
shared=$2
source "$(dirname "$0")/check.sh"

check "demo runs" 0 "tensorpool-vmm" -- "$bin" demo
check "demo --json" 0 '"peak_reserved_bytes"' -- "$bin" demo --json
check "generate" 0 "wrote" -- "$bin" generate "$work/g.tptrace" --options layers:2,hidden:256,vocab:1000,iterations:3
check "info" 0 "allocation sizes" -- "$bin" info "$work/g.tptrace"
check "info --json" 0 '"lifetime_histogram"' -- "$bin" info "$work/g.tptrace" --json
check "replay" 0 "tensorpool" -- "$bin" replay "$work/g.tptrace"
check "replay --json keys" 0 '"upstream_after_first_iteration"' -- "$bin" replay "$work/g.tptrace" --json
for key in peak_requested_bytes peak_reserved_bytes utilization upstream_allocs upstream_frees upstream_ops seeding_upstream_ops upstream_ops_with_seeding syncs ooms host_ns_per_op; do
  check "compare --json has $key" 0 "\"$key\"" -- "$bin" compare "$work/g.tptrace" --json
done
check "compare --warmup" 0 '"warmup": 1' -- "$bin" compare "$work/g.tptrace" --warmup 1 --json
check "bad --warmup" 2 "warmup" -- "$bin" replay "$work/g.tptrace" --warmup -3
check "replay explains its first OOM" 0 "first OOM of tensorpool" -- "$bin" replay "$work/g.tptrace" --capacity 64MiB
check "compare explains the first OOMs" 0 "cached free per stream" -- "$bin" compare "$work/g.tptrace" --allocators tensorpool,cub --capacity 64MiB
check "replay --json first_oom" 0 '"largest_free_block_bytes"' -- "$bin" replay "$work/g.tptrace" --capacity 64MiB --json
check "compare subset" 0 "cub" -- "$bin" compare "$work/g.tptrace" --allocators tensorpool,cub --capacity 1GiB
check "convert to jsonl" 0 "wrote" -- "$bin" convert "$work/g.tptrace" "$work/g.jsonl"
check "jsonl replays the same" 0 "tensorpool" -- "$bin" replay "$work/g.jsonl"
a=$("$bin" replay "$work/g.tptrace" --json | grep peak_reserved_bytes)
b=$("$bin" replay "$work/g.jsonl" --json | grep peak_reserved_bytes)
if [ "$a" = "$b" ] && [ -n "$a" ]; then passes=$((passes + 1)); else echo "FAIL: jsonl and tptrace replays differ: $a vs $b"; failures=$((failures + 1)); fi

# Bad files: exit 1, the file named, where, and what was expected.
printf 'not a trace at all' >"$work/junk.bin"
check "junk file" 1 "junk.bin" -- "$bin" info "$work/junk.bin"
head -c 40 "$work/g.tptrace" >"$work/cut.tptrace"
check "truncated trace names the offset" 1 "cut.tptrace: byte" -- "$bin" replay "$work/cut.tptrace"
printf '\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94(' >"$work/cut.pickle"
check "truncated pickle names the offset" 1 "offset" -- "$bin" info "$work/cut.pickle"
printf '\x80\x02cos\nsystem\n.' >"$work/evil.pickle"
check "pickle with a global is refused" 1 "GLOBAL" -- "$bin" info "$work/evil.pickle"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00:000001,allocate,0x1000,12x,0x0\n' >"$work/bad.csv"
check "bad RMM log names the line" 1 "bad.csv:2" -- "$bin" info "$work/bad.csv"
check "missing file" 1 "nope.pickle" -- "$bin" info "$work/nope.pickle"
check "convert refuses an unknown extension" 1 ".tptrace" -- "$bin" convert "$work/g.tptrace" "$work/out.txt"
test ! -e "$work/out.txt" && passes=$((passes + 1)) || { echo "FAIL: a failed convert left a file"; failures=$((failures + 1)); }

# Bad arguments: exit 2.
check "unknown allocator" 2 "unknown allocator 'nope'" -- "$bin" replay "$work/g.tptrace" --allocator nope
check "bad capacity" 2 "--capacity" -- "$bin" compare "$work/g.tptrace" --capacity lots
check "bad --conf" 2 "max_split_size" -- "$bin" replay "$work/g.tptrace" --conf max_split_size:huge
check "unknown --conf key" 2 "unknown key" -- "$bin" replay "$work/g.tptrace" --conf bogus:1
check "bad generator option" 2 "--options: unknown key 'layerz'" -- "$bin" generate "$work/x.tptrace" --options layerz:3
test ! -e "$work/x.tptrace" && passes=$((passes + 1)) || { echo "FAIL: a refused generate wrote a file"; failures=$((failures + 1)); }
check "--conf names the allocator that refuses a value" 2 "--conf for tensorpool: bad value 'huge' for key 'max_split_size'" -- "$bin" replay "$work/g.tptrace" --conf max_split_size:huge
check "--conf no selected allocator takes" 2 "unknown key 'mode' for raw" -- "$bin" replay "$work/g.tptrace" --allocator raw --conf mode:vmm
check "malformed --conf" 2 "--conf: item 'mode' at character 1" -- "$bin" replay "$work/g.tptrace" --conf mode
check "no subcommand" 2 "" -- "$bin"
check "unknown subcommand" 2 "" -- "$bin" frobnicate
check "--help" 0 "compare" -- "$bin" --help
check "replay --help lists the allocators" 0 "pytorch-expandable" -- "$bin" replay --help

# The allocators and their settings; --conf reaches each allocator that takes all its keys.
check "allocators" 0 "max_cached_bytes" -- "$bin" allocators
check "allocators --json" 0 '"settings"' -- "$bin" allocators --json
check "allocators --json says which hold their memory" 0 '"holds_memory_until_destroyed": true' -- "$bin" allocators --json
check "--conf reaches a model that takes it" 0 '"allocator": "cub"' -- "$bin" replay "$work/g.tptrace" --allocator cub --conf max_cached_bytes:none --json
a=$("$bin" replay "$work/g.tptrace" --allocator pytorch --json | grep peak_reserved_bytes | head -1)
b=$("$bin" replay "$work/g.tptrace" --allocator pytorch --conf roundup_power2_divisions:2 --json | grep peak_reserved_bytes | head -1)
if [ -n "$a" ] && [ "$a" != "$b" ]; then passes=$((passes + 1)); else echo "FAIL: --conf did not reach the pytorch model: $a vs $b"; failures=$((failures + 1)); fi
a=$("$bin" compare "$work/g.tptrace" --allocators tensorpool,raw --json | grep -c '"maps": 0')
b=$("$bin" compare "$work/g.tptrace" --allocators tensorpool,raw --conf mode:vmm --json | grep -c '"maps": 0')
if [ "$b" -lt "$a" ]; then passes=$((passes + 1)); else echo "FAIL: compare --conf mode:vmm did not reach tensorpool ($a vs $b runs without maps)"; failures=$((failures + 1)); fi

# --cost-model: a file of (call, bytes, ns) points replaces the flat per-call cost.
printf '# free calls\nsegment_alloc 0 0\nsegment_free 0 0 # none\n' >"$work/cost.txt"
check "--cost-model is charged" 0 '"modelled_upstream_ns": 0,' -- "$bin" replay "$work/g.tptrace" --allocator raw --json --cost-model "$work/cost.txt"
printf 'segment_alloc two 3\n' >"$work/badcost.txt"
check "bad --cost-model names file and line" 1 "badcost.txt: line 1: expected 'CALL BYTES NANOSECONDS'" -- "$bin" replay "$work/g.tptrace" --cost-model "$work/badcost.txt"
check "missing --cost-model file" 1 "cannot open the cost-model file" -- "$bin" replay "$work/g.tptrace" --cost-model "$work/none.txt"
# --allocator-conf NAME=SETTINGS reaches that allocator only, after --conf's settings, and is
# checked first; NAME must be one of the allocators run.
check "--allocator-conf" 0 "cub" -- "$bin" compare "$work/g.tptrace" --allocators cub,raw --allocator-conf cub=max_cached_bytes:none
check "bad --allocator-conf value" 2 "--allocator-conf cub: bin_growth must be at least 2" -- "$bin" replay "$work/g.tptrace" --allocator cub --allocator-conf cub=bin_growth:1
check "--allocator-conf without =" 2 "NAME=key:value" -- "$bin" replay "$work/g.tptrace" --allocator-conf cub
check "--allocator-conf unknown allocator" 2 "unknown allocator" -- "$bin" replay "$work/g.tptrace" --allocator-conf nope=a:1
check "--allocator-conf for an allocator not run" 2 "'cub' is not one of the allocators run (tensorpool)" -- "$bin" replay "$work/g.tptrace" --allocator-conf cub=max_cached_bytes:none
check "--conf and --allocator-conf are checked together" 2 "--conf and --allocator-conf for cub: min_bin must not exceed max_bin" -- "$bin" replay "$work/g.tptrace" --allocator cub --conf min_bin:5 --allocator-conf cub=max_bin:4
check "a setting the device cannot hold" 2 "arena_size must be" -- "$bin" replay "$work/g.tptrace" --allocator rmm-arena --capacity 1GiB --allocator-conf rmm-arena=arena_size:2GiB
a=$("$bin" replay "$work/g.tptrace" --allocator cub --conf max_cached_bytes:none --json | grep '"upstream_frees"' | head -1)
b=$("$bin" replay "$work/g.tptrace" --allocator cub --conf max_cached_bytes:0 --json | grep '"upstream_frees"' | head -1)
c=$("$bin" replay "$work/g.tptrace" --allocator cub --conf max_cached_bytes:0 --allocator-conf cub=max_cached_bytes:none --json | grep '"upstream_frees"' | head -1)
if [ -n "$a" ] && [ "$a" != "$b" ] && [ "$a" = "$c" ]; then passes=$((passes + 1)); else echo "FAIL: --allocator-conf did not win over --conf: $a / $b / $c"; failures=$((failures + 1)); fi

# A real PyTorch snapshot, when the shared traces are here.
if [ -f "$shared/small-from-empty.pickle" ]; then
  check "info on a PyTorch snapshot" 0 "recorded allocator" -- "$bin" info "$shared/small-from-empty.pickle"
  check "compare shows PyTorch's actual" 0 "pytorch-actual" -- "$bin" compare "$shared/small-from-empty.pickle"
  check "convert a snapshot" 0 "wrote" -- "$bin" convert "$shared/small-from-empty.pickle" "$work/s.tptrace"
  check "the converted snapshot keeps PyTorch's figures" 0 "pytorch-actual" -- "$bin" compare "$work/s.tptrace"
else
  echo "shared traces not found at $shared: snapshot checks skipped"
fi

finish

#!/usr/bin/env bash
# End-to-end tests of the tensorpool CLI: every subcommand, JSON keys, exit codes and messages.
# Usage: cli_test.sh TENSORPOOL_BINARY (the shared PyTorch snapshots: cli_snapshot_test.sh)
set -u
bin=$1
source "$(dirname "$0")/check.sh"

check "demo runs" 0 "tensorpool-vmm" -- "$bin" demo
check "demo --json" 0 '"peak_reserved_bytes"' -- "$bin" demo --json
check "demo fits the trace" 0 "Does it fit?" -- "$bin" demo
check "demo plans a micro-batch where pytorch fits less" 0 "PyTorch's allocator (the pytorch model) fits micro-batch" -- "$bin" demo
check "demo --json has the plan" 0 '"plan_command"' -- "$bin" demo --json
check "generate" 0 "wrote" -- "$bin" generate "$work/g.tptrace" --options framework:megatron,layers:2,hidden:256,ffn:1024,vocab:1000,micro_batch:4,seq:2048,seq_dist:uniform,steps:3
check "info" 0 "allocation sizes" -- "$bin" info "$work/g.tptrace"
check "info --json" 0 '"lifetime_histogram"' -- "$bin" info "$work/g.tptrace" --json
check "replay" 0 "tensorpool" -- "$bin" replay "$work/g.tptrace"
check "replay --json keys" 0 '"upstream_after_first_iteration"' -- "$bin" replay "$work/g.tptrace" --json
for key in peak_requested_bytes peak_reserved_bytes utilization upstream_allocs upstream_frees upstream_ops seeding_upstream_ops upstream_ops_with_seeding syncs ooms host_ns_per_op; do
  check "compare --json has $key" 0 "\"$key\"" -- "$bin" compare "$work/g.tptrace" --json
done
check "replay --attempt-ooms" 0 "tensorpool" -- "$bin" replay "$work/g.tptrace" --attempt-ooms
check "compare --warmup" 0 '"warmup": 1' -- "$bin" compare "$work/g.tptrace" --warmup 1 --json
check "bad --warmup" 2 "warmup" -- "$bin" replay "$work/g.tptrace" --warmup -3
check "replay explains its first OOM" 0 "first OOM of tensorpool" -- "$bin" replay "$work/g.tptrace" --capacity 64MiB
check "replay goes on past its first OOM and counts what it refused" 0 " refused): " -- "$bin" replay "$work/g.tptrace" --capacity 64MiB
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
head -c 3000 "$work/g.tptrace" >"$work/killed.tptrace"  # as a killed recording leaves it
check "convert --allow-truncated salvages a cut trace" 0 "cut short: kept the" -- "$bin" convert "$work/killed.tptrace" "$work/salvaged.tptrace" --allow-truncated
check "the salvaged trace replays" 0 "tensorpool" -- "$bin" replay "$work/salvaged.tptrace"
check "--allow-truncated still refuses a cut header" 1 "truncated header" -- "$bin" convert "$work/cut.tptrace" "$work/x.tptrace" --allow-truncated
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x1000,4096,0x0\n' >"$work/ok.csv"
check "--allow-truncated is refused for an RMM log" 1 "applies to tensorpool traces" -- "$bin" convert "$work/ok.csv" "$work/x.tptrace" --allow-truncated
printf '\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94(' >"$work/cut.pickle"
check "truncated pickle names the offset" 1 "offset" -- "$bin" info "$work/cut.pickle"
printf '\x80\x02cos\nsystem\n.' >"$work/evil.pickle"
check "pickle with a global is refused" 1 "GLOBAL" -- "$bin" info "$work/evil.pickle"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00:000001,allocate,0x1000,12x,0x0\n' >"$work/bad.csv"
check "bad RMM log names the line" 1 "bad.csv:2" -- "$bin" info "$work/bad.csv"
check "--allow-truncated is for tensorpool traces" 1 "applies to tensorpool traces" -- "$bin" convert "$work/bad.csv" "$work/x.tptrace" --allow-truncated
check "missing file" 1 "nope.pickle" -- "$bin" info "$work/nope.pickle"
check "convert refuses an unknown extension" 1 ".tptrace" -- "$bin" convert "$work/g.tptrace" "$work/out.txt"
test ! -e "$work/out.txt" && passes=$((passes + 1)) || { echo "FAIL: a failed convert left a file"; failures=$((failures + 1)); }

# Bad arguments: exit 2.
check "unknown allocator" 2 "unknown allocator 'nope'" -- "$bin" replay "$work/g.tptrace" --allocator nope
check "bad capacity" 2 "--capacity" -- "$bin" compare "$work/g.tptrace" --capacity lots
check "bad --conf" 2 "max_split_size" -- "$bin" replay "$work/g.tptrace" --conf max_split_size:huge
check "unknown --conf key" 2 "unknown key" -- "$bin" replay "$work/g.tptrace" --conf bogus:1
check "bad generator option" 2 "--options: unknown key 'layerz'" -- "$bin" generate "$work/x.tptrace" --options layerz:3
check "the old generator's keys name the new ones" 2 "'iterations' was a key of the old generator; use steps" -- "$bin" generate "$work/x.tptrace" --options layers:2,iterations:3
check "the old generator's batch" 2 "use micro_batch" -- "$bin" generate "$work/x.tptrace" --options batch:4
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
b=$("$bin" replay "$work/g.tptrace" --allocator pytorch --conf roundup_power2_divisions:16 --json | grep peak_reserved_bytes | head -1)
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

# fit: the smallest capacity per allocator, checked 1% below; per device; JSON keys.
check "fit" 0 "1% less" -- "$bin" fit "$work/g.tptrace" --allocators tensorpool,pytorch --threads 2
check "fit explains the OOM just below" 0 "just below the fit" -- "$bin" fit "$work/g.tptrace" --allocators cub
check "fit's replays that run out stop at their first OOM" 0 "(just below the fit) (the replay stopped there)" -- "$bin" fit "$work/g.tptrace" --allocators cub
for key in capacity_bytes ratio_to_peak_requested verified monotone oom_above_bytes first_oom_below largest_free_block_bytes at_capacity; do
  check "fit --json has $key" 0 "\"$key\"" -- "$bin" fit "$work/g.tptrace" --allocators raw --json
done
check "fit --json: the answer is verified" 0 '"verified": true' -- "$bin" fit "$work/g.tptrace" --allocators tensorpool --json
# fit and plan run the program as replay does (test_fit.cpp checks that the replays follow it).
check "fit --step-at-iterations" 0 '"step_at_iterations": true' -- "$bin" fit "$work/g.tptrace" --allocators tensorpool-vmm --step-at-iterations --json
check "fit --device-lag" 0 '"device_lag": 16' -- "$bin" fit "$work/g.tptrace" --allocators tensorpool-vmm --device-lag 16 --json
check "bad fit --device-lag" 2 "device-lag" -- "$bin" fit "$work/g.tptrace" --device-lag -3
check "fit --precision-pct" 0 "0.1% or 0 B, whichever is larger" -- "$bin" fit "$work/g.tptrace" --allocators raw --precision-pct 0.1 --precision-bytes 0
check "fit --json states the precision" 0 '"relative_tolerance": 0.001' -- "$bin" fit "$work/g.tptrace" --allocators raw --precision-pct 0.1 --json
check "bad --precision-pct" 2 "precision-pct" -- "$bin" fit "$work/g.tptrace" --precision-pct 0
check "bad --precision-bytes" 2 "--precision-bytes" -- "$bin" fit "$work/g.tptrace" --precision-bytes lots
check "bad fit --warmup" 2 "warmup" -- "$bin" fit "$work/g.tptrace" --warmup -1
check "fit: unknown allocator" 2 "unknown allocator 'nope'" -- "$bin" fit "$work/g.tptrace" --allocators nope
check "fit: a device the trace lacks" 1 "device 9 has no events" -- "$bin" fit "$work/g.tptrace" --device 9

# generate --model: workload traces of presets; bad setups refused naming the option.
small="hidden:1024,heads:16,kv_heads:16,ffn:4096,vocab:8000,layers:4,seq:1024"
check "generate --model" 0 "wrote" -- "$bin" generate "$work/w.tptrace" --model custom --options "$small" --global-batch 8 --micro-batch 2
check "a workload trace records its setup" 0 "metadata: workload=model:custom,layers:4" -- "$bin" info "$work/w.tptrace"
check "generate pipeline stages as devices" 0 "wrote" -- "$bin" generate "$work/pp.tptrace" --model custom --options "framework:megatron,$small" --pp 2 --global-batch 4
check "a loop's option names the values it has" 2 "one of foreach, fused, for-loop, handwritten" -- "$bin" generate "$work/x.tptrace" --model gpt2 --options optimizer_impl:fast
check "the Megatron loop names what it has" 2 "option 'attention' (sdpa) is the PyTorch loop's (framework:pytorch); framework:megatron has precision fp32|bf16|fp16, attention flash|eager" -- "$bin" generate "$work/x.tptrace" --model gpt2 --options framework:megatron,attention:sdpa
check "generate forward passes" 0 "under no_grad" -- "$bin" generate "$work/fwd.tptrace" --model gpt2 --mode forward --options layers:2,seq:256
check "the PyTorch loop names the framework that has pipelines" 2 "option 'pp' (2) is modelled in the Megatron-LM/DeepSpeed loop: add framework:megatron" -- "$bin" generate "$work/x.tptrace" --model custom --options "$small" --pp 2 --global-batch 4
check "fit per device" 0 "tensorpool              1" -- "$bin" fit "$work/pp.tptrace" --allocators tensorpool
check "generate inference" 0 "inference" -- "$bin" generate "$work/inf.tptrace" --model llama2-7b --mode inference --options layers:2,requests:8
check "unknown model lists the presets" 2 "known models: gpt2, gpt2-xl, gpt2-1.5b, llama2-7b, llama2-13b, llama2-70b, llama3-8b, mixtral-8x7b" -- "$bin" generate "$work/x.tptrace" --model llama9
check "tp must divide the heads" 2 "option 'tp' (3) does not divide heads (32 in llama2-7b)" -- "$bin" generate "$work/x.tptrace" --model llama2-7b --tp 3
check "micro-batch above the global batch" 2 "option 'micro_batch' (128) x dp (1) is above global_batch (64)" -- "$bin" generate "$work/x.tptrace" --model llama2-7b --micro-batch 128 --global-batch 64
check "pp must divide the layers" 2 "option 'pp' (3) does not divide layers" -- "$bin" plan --model llama2-7b --pp 3 --global-batch 8
check "a flag takes one value" 2 "--seq: bad value '4,zero:3'" -- "$bin" generate "$work/x.tptrace" --model gpt2 --seq 4,zero:3
check "bad workload option" 2 "--options: unknown key 'layerz'" -- "$bin" generate "$work/x.tptrace" --model gpt2 --options layerz:2
test ! -e "$work/x.tptrace" && passes=$((passes + 1)) || { echo "FAIL: a refused generate --model wrote a file"; failures=$((failures + 1)); }

# plan: the largest micro-batch per allocator, accumulation, headroom, the changes that help.
check "plan needs a global batch" 2 "--global-batch" -- "$bin" plan --model gpt2
check "plan is for training" 2 "must be training" -- "$bin" plan --model gpt2 --global-batch 8 --options mode:inference
check "plan" 0 "accumulation" -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool,pytorch
check "plan --step-at-iterations --device-lag" 0 '"device_lag": 8' -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool-vmm --step-at-iterations --device-lag 8 --json
check "plan lists the changes that help" 0 "full activation checkpointing (checkpointing:full)" -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool
"$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --json >"$work/plan.json" 2>&1
for key in micro_batch accumulation peak_reserved_bytes headroom_bytes next_first_oom changes saves_bytes trace_options step_at_iterations device_lag; do
  if grep -q "\"$key\"" "$work/plan.json"; then passes=$((passes + 1)); else echo "FAIL: plan --json lacks $key"; failures=$((failures + 1)); fi
done
# The plan's micro-batch fits and the next one does not, replayed here from generated traces.
python3 - "$work/plan.json" >"$work/plan.tsv" <<'PY'
import json, sys
for a in json.load(open(sys.argv[1]))["allocators"]:
    print(a["allocator"], a["micro_batch"], a["trace_options"], a["next_trace_options"], sep="\t")
PY
while IFS=$'\t' read -r alloc mb opts next_opts; do
  [ "$mb" == None ] && opts=$next_opts
  "$bin" generate "$work/best.tptrace" --model custom --options "$opts" 2>/dev/null
  "$bin" generate "$work/next.tptrace" --model custom --options "$next_opts" 2>/dev/null
  best=$("$bin" replay "$work/best.tptrace" --allocator "$alloc" --capacity 3GiB --json | grep -m1 '"ooms"')
  next=$("$bin" replay "$work/next.tptrace" --allocator "$alloc" --capacity 3GiB --json | grep -m1 '"ooms"')
  # None: not even the smallest micro-batch fits (rmm-arena holds half of the 3 GiB device).
  if [[ ( "$mb" == None || "$best" == *'"ooms": 0,'* ) && "$next" != *'"ooms": 0,'* ]]; then passes=$((passes + 1));
  else echo "FAIL: plan's micro-batch $mb for $alloc: $best; the next: $next"; failures=$((failures + 1)); fi
done <"$work/plan.tsv"
# The answer in words, first: what fits, or why nothing can; where the bytes go at the peak.
check "plan answers first" 0 "Answer: micro-batch" -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool,pytorch
check "plan says why nothing fits" 0 "The model states alone (weights, gradients and optimizer states: 16.0 bytes per parameter" -- "$bin" plan --model gpt2 --global-batch 8 --capacity 2GiB --allocators tensorpool
python3 - "$work/plan.json" <<'PY' && passes=$((passes + 1)) || { echo "FAIL: plan --json's answer"; failures=$((failures + 1)); }
import json, sys
plan = json.load(open(sys.argv[1]))
answer = plan["answer"]
fitting = [a["micro_batch"] for a in plan["allocators"] if a["micro_batch"] is not None]
assert answer["text"].startswith("Answer: "), answer["text"]
assert answer["micro_batch"] == max(fitting), (answer["micro_batch"], fitting)
for key in ("breakdown", "next_breakdown"):
    b = answer[key]
    assert sum(b["bytes"].values()) == b["peak_requested_bytes"], b
    assert b["model_states_bytes"] == b["bytes"]["weights"] + b["bytes"]["gradients"] + b["bytes"]["optimizer states"], b
# The peak of the answer's micro-batch is the peak requested its fitting allocators replayed.
assert all(a["peak_requested_bytes"] == answer["breakdown"]["peak_requested_bytes"]
           for a in plan["allocators"] if a["micro_batch"] == answer["micro_batch"]), plan["allocators"]
assert answer["next_micro_batch"] > answer["micro_batch"]
assert answer["next_breakdown"]["peak_requested_bytes"] > answer["breakdown"]["peak_requested_bytes"]
PY
# plan --report: one self-contained page, its bars adding up to the answer's breakdowns.
check "plan --report" 0 "Answer: micro-batch" -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool,pytorch --report "$work/plan.html"
"$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --allocators tensorpool,pytorch --json --report "$work/plan2.html" >"$work/plan2.json" 2>/dev/null
python3 - "$work/plan2.json" "$work/plan2.html" <<'PY' && passes=$((passes + 1)) || { echo "FAIL: plan --report's page"; failures=$((failures + 1)); }
import json, re, sys
plan = json.load(open(sys.argv[1]))
page = open(sys.argv[2]).read()
assert plan["report"]["output"] == sys.argv[2] and plan["report"]["bytes"] == len(page.encode())
assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
bars = re.findall(r'<rect class="part" data-kind="([^"]+)" data-bytes="(\d+)"', page)
answer = plan["answer"]
fitting = [a for a in plan["allocators"] if a["micro_batch"] == answer["micro_batch"]]
requested = answer["breakdown"]["peak_requested_bytes"]
# Each fitting allocator's bar: the breakdown, then its reserved bytes above the requested ones;
# the last bar: the next micro-batch's breakdown alone.
expected = sum(a["peak_reserved_bytes"] for a in fitting) + answer["next_breakdown"]["peak_requested_bytes"]
assert sum(int(b) for _, b in bars) == expected, (sum(int(b) for _, b in bars), expected)
assert 'class="capacity"' in page
PY
check "plan --report: an unwritable page is refused first" 2 "cannot write plan report '$work/no/such/dir/p.html'" -- "$bin" plan --model custom --options "$small" --global-batch 64 --capacity 3GiB --report "$work/no/such/dir/p.html"
n_allocators=$("$bin" allocators --json | grep -c '"name"')
[ "$(wc -l <"$work/plan.tsv")" -eq "$n_allocators" ] && passes=$((passes + 1)) || { echo "FAIL: plan --json lists $(wc -l <"$work/plan.tsv") allocators, not $n_allocators"; failures=$((failures + 1)); }
# fit and plan take the allocators' settings and the cost model as replay does: an rmm-arena of a
# fixed 1 GiB does not fit a smaller device, whatever the trace needs.
check "fit --allocator-conf: a fixed arena sets the fit" 0 "not built there" -- "$bin" fit "$work/g.tptrace" --allocators rmm-arena --allocator-conf rmm-arena=arena_size:1GiB
"$bin" fit "$work/g.tptrace" --allocators rmm-arena --allocator-conf rmm-arena=arena_size:1GiB --json >"$work/arena.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["allocators"][0]["devices"][0]; sys.exit(0 if d["capacity_bytes"] >= 2**30 and d["capacity_bytes"] <= 2**30 + 8*2**20 and d["refused_below"] else 1)' "$work/arena.json" \
  && passes=$((passes + 1)) || { echo "FAIL: fit of a 1 GiB arena is not just above 1 GiB: $(grep -m1 capacity_bytes "$work/arena.json")"; failures=$((failures + 1)); }
check "fit --allocator-conf is checked" 2 "--allocator-conf cub: bin_growth must be at least 2" -- "$bin" fit "$work/g.tptrace" --allocators cub --allocator-conf cub=bin_growth:1
check "fit --cost-model" 0 '"modelled_upstream_ns": 0,' -- "$bin" fit "$work/g.tptrace" --allocators raw --cost-model "$work/cost.txt" --json
check "plan --allocator-conf: an arena above the device" 2 "arena_size must be" -- "$bin" plan --model custom --options "$small" --global-batch 8 --capacity 3GiB --allocators rmm-arena --allocator-conf rmm-arena=arena_size:4GiB
check "plan --allocator-conf" 0 "rmm-pool" -- "$bin" plan --model custom --options "$small" --global-batch 8 --capacity 3GiB --allocators rmm-pool --allocator-conf rmm-pool=initial_pool_size:0

finish

#!/usr/bin/env bash
# scripts/gpu/run.sh: the measurements of the real-GPU run (issue: benchmarks against the real
# anchors), called by scripts/gpu-check.sh after its build. Every part runs under its own hard
# timeout and writes what it has under OUT/gpu/, so a part that runs out of time leaves the
# others' results:
#   a. call costs: cudaMalloc, cudaFree, cudaMallocAsync/FreeAsync, cuMemCreate, cuMemMap,
#      cuMemSetAccess, cuMemUnmap, cuMemRelease at 2 MiB..1 GiB (medians) ->
#      cost-model.txt (the simulated device's cost model: tensorpool replay --cost-model),
#      call-costs.json, and malloc-footprint.json (what cudaMalloc of each size holds, against
#      the replay models' rule);
#   b. replay of the traces on the GPU (raw, cudaMallocAsync, tensorpool on each backend, CUB,
#      RMM's pool when built with it) -> replay-TRACE.jsonl, and the simulated figures for the
#      same traces with the measured cost model -> simulated-TRACE.json;
#   c. pinned staging: CudaPinnedHostBackend through the allocator vs cudaHostAlloc vs pageable ->
#      pinned.json;
#   d. sleep and wake of 1 and 4 GiB in 64 MiB blocks, contents kept and discarded, per GiB, with
#      the checks of issue 28 (free memory back, addresses and contents kept) -> sleep.json; run
#      right after a (it takes seconds), so that the replays' time cannot leave it out.
#
#   scripts/gpu/run.sh OUT_DIR BUILD_DIR [SECONDS]
# BUILD_DIR has the cuda/gpu programs (-DTENSORPOOL_GPU_BENCH=ON) and tools/tensorpool. Traces:
# every *.pickle in TP_GPU_TRACES (default ../shared/traces next to the repository), else a
# generated one. Without a GPU it says so and exits 0 after checking the programs exist.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT_DIR BUILD_DIR [SECONDS]" >&2
  exit 64
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$1/gpu
BUILD=$2
DEADLINE=$((SECONDS + ${3:-300}))
mkdir -p "$OUT"
LOG=$OUT/run.txt
: >"$LOG"
say() { echo "gpu-run: $*" | tee -a "$LOG"; }
part() {  # part NAME MAX_SECONDS OUTFILE CMD...
  local name=$1 max=$2 outfile=$3
  shift 3
  local budget=$((DEADLINE - SECONDS))
  [ "$budget" -gt "$max" ] && budget=$max
  if [ "$budget" -le 5 ]; then say "$name: SKIPPED (time spent)"; return 124; fi
  local rc=0 start=$SECONDS
  timeout --kill-after=5 "$budget" "$@" >"$outfile" 2>>"$OUT/$name.err" || rc=$?
  say "$name: exit $rc in $((SECONDS - start))s -> $(basename "$outfile")"
  return $rc
}

BIN=$BUILD/cuda/gpu
for p in tensorpool_gpu_call_costs tensorpool_gpu_replay tensorpool_gpu_pinned tensorpool_gpu_sleep; do
  [ -x "$BIN/$p" ] || { say "missing $BIN/$p (configure with -DTENSORPOOL_GPU_BENCH=ON)"; exit 2; }
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  say "no GPU (nvidia-smi -L failed): the programs are built; nothing measured"
  exit 0
fi

# a. call costs -> the cost model
part call-costs 120 "$OUT/call-costs.log" "$BIN/tensorpool_gpu_call_costs" "$OUT" 11

# d. sleep and wake per GiB, before the replays take the time left (exit 1: a check failed; the
# JSON says which row)
part sleep 60 "$OUT/sleep.json" "$BIN/tensorpool_gpu_sleep" 1024,4096 3

# b. replays on the GPU, and the simulator's figures for the same traces
TRACES=()
for t in "${TP_GPU_TRACES:-$ROOT/../shared/traces}"/*.pickle; do [ -f "$t" ] && TRACES+=("$t"); done
CLI=$BUILD/tools/tensorpool
if [ "${#TRACES[@]}" -eq 0 ] && [ -x "$CLI" ]; then
  "$CLI" generate "$OUT/generated.tptrace" --options layers:8,hidden:2048,micro_batch:4,seq:2048,steps:3 >/dev/null 2>&1 &&
    TRACES=("$OUT/generated.tptrace")
fi
COST=()
[ -s "$OUT/cost-model.txt" ] && COST=(--cost-model "$OUT/cost-model.txt")
for t in "${TRACES[@]}"; do
  name=$(basename "$t" | sed 's/\.[a-z]*$//')
  part "replay-$name" 60 "$OUT/replay-$name.jsonl" "$BIN/tensorpool_gpu_replay" "$t"
  if [ -x "$CLI" ]; then
    part "simulated-$name" 30 "$OUT/simulated-$name.json" "$CLI" compare "$t" --device 0 --json \
      --allocators raw,tensorpool,tensorpool-vmm,cub,rmm-pool "${COST[@]}"
  fi
done

# c. pinned staging
part pinned 60 "$OUT/pinned.json" "$BIN/tensorpool_gpu_pinned" 9
say "done; results in $OUT"
exit 0

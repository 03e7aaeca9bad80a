#!/usr/bin/env bash
# scripts/gpu-check.sh: validates tensorpool's CUDA backends on a machine with a real NVIDIA GPU
# (written for an H200, sm_90; no network needed) and records what it found.
#
#   scripts/gpu-check.sh OUT_DIR
# On a lent machine without network or the C++ libraries, run scripts/gpu/device-run.sh instead
# (after scripts/gpu/prepare-carry.sh here): it calls this script with what .gpu-carry/ holds.
#
# Steps, all within an 8-minute budget (every step runs under `timeout` with what is left):
#   1. record the machine: date, git commit, nvidia-smi, driver/runtime versions, GPU name;
#   2. configure a fresh Release build with nvcc (-DTENSORPOOL_CUDA=ON
#      -DTENSORPOOL_CUDA_REAL_TESTS=ON, CMAKE_CUDA_ARCHITECTURES=90) and build the CUDA tests
#      (tensorpool_cuda_tests: every program of tests/cuda);
#   3. run `ctest -L cuda`: the backends on the test double and on the real runtime; then
#      scripts/gpu/torch_check.py: PyTorch with its allocator and with tensorpool (losses agree);
#      scripts/gpu/loop_check.py: the generator's PyTorch loop against the same loop's measured
#      peak (within 3%);
#   4. the GPU measurements of scripts/gpu/run.sh (call costs -> OUT_DIR/gpu/cost-model.txt,
#      trace replays on the GPU, pinned staging, sleep and wake per GiB -> OUT_DIR/gpu/sleep.json),
#      each part under its own timeout; RMM's pool
#      too when the librmm-cu13 and rapids-logger wheels are in .gpu-carry/whl/ or .whl/ (carried
#      to the GPU host);
#   5. build every program under bench/ and run the Google Benchmark ones among them (or, failing
#      that, those already in build-release/bench/), each with --benchmark_out=OUT_DIR/bench-NAME.json.
# Exit status: 0 when the build and every cuda test passed; 1 when a test failed; 2 when the
# configure or build failed. Benchmark failures are reported in summary.txt only.
#
# Environment: TP_GPU_CHECK_BUDGET (seconds, default 480), TP_CUDA_ARCHS (default 90),
# TP_GPU_BUILD_DIR (default build-gpu-check), JOBS (default nproc), NVCC (default: found),
# TP_BENCH_MIN_TIME (seconds per benchmark, default 0.05), TP_GPU_COMMIT (the commit to record
# where the tree has no .git: device-run.sh sets it from .gpu-carry/commit).
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 64
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 64
OUT=$(cd "$1" && pwd)
BUILD=${TP_GPU_BUILD_DIR:-$ROOT/build-gpu-check}
ARCHS=${TP_CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
MIN_TIME=${TP_BENCH_MIN_TIME:-0.05}
DEADLINE=$((SECONDS + ${TP_GPU_CHECK_BUDGET:-480}))
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

log() { echo "gpu-check: $*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - SECONDS)); }

# step NAME MAX_SECONDS CMD...: runs CMD under timeout (at most what the budget has left),
# output in OUT/NAME.log, a status line in summary.txt; returns CMD's status (124: timed out).
step() {
  local name=$1 max=$2
  shift 2
  local budget
  budget=$(left)
  [ "$budget" -gt "$max" ] && budget=$max
  if [ "$budget" -le 5 ]; then
    log "$name: SKIPPED (time budget spent)"
    return 124
  fi
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$budget" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local status=ok
  [ "$rc" -ne 0 ] && status="FAILED (exit $rc)"
  [ "$rc" -eq 124 ] && status="TIMED OUT after ${budget}s"
  log "$name: $status in $((SECONDS - start))s (log: $name.log)"
  return "$rc"
}

# --- 1. the machine -------------------------------------------------------------------------
record_environment() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "${TP_GPU_COMMIT:-unknown}")"
  echo "worktree: $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed or untracked paths (git-status.txt)"
  echo "host: $(uname -srm)"
  echo "gpu: $(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>&1)"
  echo "cuda (nvidia-smi): $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' || echo unknown)"
  echo "nvcc: $("$NVCC" --version 2>&1 | tail -n 2 | head -n 1)"
  echo "cmake: $(cmake --version | head -n 1)"
  echo "c++: $(c++ --version | head -n 1)"
}

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
record_environment >"$OUT/environment.txt" 2>&1
git -C "$ROOT" status --porcelain --untracked-files=all >"$OUT/git-status.txt" 2>&1
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed: no usable GPU or driver?"
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1 || true
log "$(grep -E '^(commit|gpu):' "$OUT/environment.txt" | tr '\n' ' ')"

# --- 2. configure and build -----------------------------------------------------------------
CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
  -DTENSORPOOL_CUDA=ON -DTENSORPOOL_CUDA_REAL_TESTS=ON -DTENSORPOOL_BUILD_TESTS=ON
  -DTENSORPOOL_BUILD_TOOLS=ON -DTENSORPOOL_GPU_BENCH=ON
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCHS")
rm -rf "$BUILD"
# RMM's pool for the GPU replay: the wheels in .gpu-carry/whl/ (scripts/gpu/prepare-carry.sh) or
# .whl/ (pip download librmm-cu13 rapids-logger).
WHEELS=
for d in "$ROOT/.gpu-carry/whl" "$ROOT/.whl"; do
  if [ -z "$WHEELS" ] && ls "$d"/librmm_cu13-*.whl "$d"/rapids_logger-*.whl >/dev/null 2>&1; then WHEELS=$d; fi
done
if [ -n "$WHEELS" ]; then
  mkdir -p "$BUILD-rmm"
  for w in "$WHEELS"/librmm_cu13-*.whl "$WHEELS"/rapids_logger-*.whl; do python3 -m zipfile -e "$w" "$BUILD-rmm"; done
  CMAKE_ARGS+=(-DTENSORPOOL_RMM_ROOT="$BUILD-rmm")
  export LD_LIBRARY_PATH="$BUILD-rmm/librmm/lib64:$BUILD-rmm/rapids_logger/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# Benchmarks need Google Benchmark; without it, configure again without them.
if ! step configure 90 cmake "${CMAKE_ARGS[@]}" -DTENSORPOOL_BUILD_BENCH=ON; then
  rm -rf "$BUILD"
  step configure-without-bench 90 cmake "${CMAKE_ARGS[@]}" -DTENSORPOOL_BUILD_BENCH=OFF ||
    { log "RESULT: configure failed"; exit 2; }
fi
# tensorpool_cuda_tests: every program of tests/cuda, which `ctest -L cuda` runs (one not built
# fails as Not Run); then the GPU measurements' programs, the CLI and PyTorch's library.
CUDA_TARGETS=(tensorpool_cuda_tests tensorpool_gpu_call_costs tensorpool_gpu_replay tensorpool_gpu_pinned
  tensorpool_gpu_sleep tensorpool_cli tensorpool_torch)
step build 300 cmake --build "$BUILD" -j "$JOBS" --target "${CUDA_TARGETS[@]}" ||
  { log "RESULT: build failed"; exit 2; }

# --- 3. the tests ---------------------------------------------------------------------------
step cuda-info 30 "$BUILD/tests/cuda/tensorpool_cuda_info"
cp "$OUT/cuda-info.log" "$OUT/cuda-info.json" 2>/dev/null
test_rc=0
step ctest 240 ctest --test-dir "$BUILD" -L cuda --output-on-failure --timeout 300 \
  --output-junit "$OUT/ctest-junit.xml" || test_rc=$?
grep -E "tests passed|tests failed" "$OUT/ctest.log" | tee -a "$SUMMARY"
# Which ones failed or did not run, by name (summary.txt is what a reader sees first).
sed -n '/^The following tests/,/^Errors while running CTest/p' "$OUT/ctest.log" |
  grep -E '^\s+[0-9]+ - ' | sed 's/^\s*/ctest: /' | tee -a "$SUMMARY"
# PyTorch trained with its allocator and with tensorpool on each backend (exit 3: no torch/GPU).
torch_rc=0; step torch 200 python3 "$ROOT/scripts/gpu/torch_check.py" --out "$OUT" --library "$BUILD/cuda/libtensorpool_torch.so" || torch_rc=$?
grep -E "^(variant|pytorch|tensorpool-|  tensorpool-|torch_check)" "$OUT/torch.log" | tee -a "$SUMMARY"; [ "$torch_rc" -eq 1 ] && test_rc=1
# The generator's PyTorch loop against the same loop measured here (exit 3: no torch/GPU).
loop_rc=0; step loop 150 python3 "$ROOT/scripts/gpu/loop_check.py" --out "$OUT" --cli "$BUILD/tools/tensorpool" || loop_rc=$?
grep -E "^loop_check" "$OUT/loop.log" | tee -a "$SUMMARY"; [ "$loop_rc" -eq 1 ] && test_rc=1

# --- 4. the GPU measurements (scripts/gpu/run.sh; at most 300 s, a minute kept for step 5) ----
gpu_budget=$(( $(left) - 60 ))
[ "$gpu_budget" -gt 300 ] && gpu_budget=300
step gpu-run $((gpu_budget + 10)) bash "$ROOT/scripts/gpu/run.sh" "$OUT" "$BUILD" "$gpu_budget" ||
  log "gpu-run: failed or timed out (partial results in $OUT/gpu)"

# --- 5. the benchmarks ----------------------------------------------------------------------
# Every executable the build generates under bench/, as paths relative to the build directory.
bench_outputs() {
  [ -f "$BUILD/build.ninja" ] || return
  ninja -C "$BUILD" -t targets all 2>/dev/null |
    sed -n 's|^\(bench/[A-Za-z0-9_/.-]*\): CXX_EXECUTABLE_LINKER.*|\1|p'
}
mapfile -t BENCH_OUTPUTS < <(bench_outputs)
BENCH_BINS=()
if [ "${#BENCH_OUTPUTS[@]}" -gt 0 ]; then
  if step build-bench 150 ninja -C "$BUILD" -j "$JOBS" "${BENCH_OUTPUTS[@]}"; then
    for o in "${BENCH_OUTPUTS[@]}"; do BENCH_BINS+=("$BUILD/$o"); done
  fi
else
  log "no benchmark targets in this build; using the binaries in build-release/bench"
  for b in "$ROOT"/build-release/bench/*; do [ -f "$b" ] && [ -x "$b" ] && BENCH_BINS+=("$b"); done
fi
ran=0
for bin in "${BENCH_BINS[@]}"; do
  name=$(basename "$bin")
  # Google Benchmark programs only: the callgrind drivers and the latency replay take arguments
  # of their own (docs/benchmarks.md) and refuse these.
  if ! timeout 20 "$bin" --benchmark_list_tests=true >/dev/null 2>&1; then
    log "bench-$name: not a Google Benchmark program: not run"
    continue
  fi
  ran=1
  step "bench-$name" 120 "$bin" --benchmark_out="$OUT/bench-$name.json" \
    --benchmark_out_format=json --benchmark_min_time="$MIN_TIME" ||
    log "bench-$name: failed or timed out (not counted as a test failure)"
done
[ "$ran" -eq 0 ] && log "no benchmark binaries found"

# --- result ---------------------------------------------------------------------------------
if [ "$test_rc" -ne 0 ]; then
  log "RESULT: FAILED (ctest exit $test_rc); details in ctest.log"
  exit 1
fi
log "RESULT: passed; everything is in $OUT"
exit 0

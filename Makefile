# tensorpool: the two commands of the README (`make demo`, `make test`) and a few helpers.
# Each target installs missing Debian packages first (scripts/install-deps.sh; idempotent).
BUILD_DIR ?= build
PRESET    ?= default
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps configure build demo test bench clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	@$(BUILD_DIR)/tools/tensorpool demo

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Each benchmark also writes Google Benchmark JSON to build-release/bench-NAME.json, which
# scripts/bench-tables.py turns into the tables of docs/benchmarks.md. tensorpool_bench_cub
# (side by side with CUB) exists when the CUDA Toolkit's headers were found.
BENCH_ARGS := --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_out_format=json
bench: deps
	@cmake --preset release >/dev/null
	@cmake --build build-release -j $(JOBS) --target tensorpool_bench tensorpool_bench_replay tensorpool_bench_annotations \
	  tensorpool_bench_latency
	@if grep -q 'build bench/tensorpool_bench_cub:' build-release/build.ninja; then \
	  cmake --build build-release -j $(JOBS) --target tensorpool_bench_cub; fi
	@build-release/bench/tensorpool_bench $(BENCH_ARGS) --benchmark_out=build-release/bench-tensorpool_bench.json
	@build-release/bench/tensorpool_bench_replay $(BENCH_ARGS) --benchmark_out=build-release/bench-tensorpool_bench_replay.json
	@build-release/bench/tensorpool_bench_annotations $(BENCH_ARGS) --benchmark_out=build-release/bench-tensorpool_bench_annotations.json
	@build-release/bench/tensorpool_bench_latency --json build-release/bench-tensorpool_bench_latency.json
	@if [ -x build-release/bench/tensorpool_bench_cub ]; then \
	  build-release/bench/tensorpool_bench_cub $(BENCH_ARGS) --benchmark_out=build-release/bench-tensorpool_bench_cub.json; fi

clean:
	@rm -rf build build-*

# --- reliability (docs/reliability.md): sanitizers and fuzzing ------------------------------
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= $(JOBS)
FUZZ_TARGETS := pickle pytorch_snapshot trace recording rmm_log config

.PHONY: test-asan test-tsan fuzz

# One sanitizer build (preset asan, build-asan: clang, ASan + UBSan, coverage for libFuzzer) serves
# both: every test runs under the sanitizers, and the fuzz targets are linked in the same build.
# test-asan builds everything and runs every test.
test-asan:
	@bash scripts/install-deps.sh clang
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan -j $(JOBS)

# The multi-threaded stress test under ThreadSanitizer (preset tsan, build-tsan). Without
# address randomization where allowed (setarch -R): the TSan runtime of gcc 12 / clang 14 cannot
# map its shadow memory on kernels with vm.mmap_rnd_bits above 28.
test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)
	@if setarch "$$(uname -m)" -R true 2>/dev/null; then setarch "$$(uname -m)" -R ctest --preset tsan; \
	 else ctest --preset tsan; fi

# Builds the libFuzzer targets (only those, in build-asan: after test-asan, nothing to do) and
# runs each for FUZZ_SECONDS from its seed corpus (fuzz/corpus/TARGET), FUZZ_JOBS at once (one per
# core: each target gets a core for its FUZZ_SECONDS); new inputs go to fuzz-corpus-TARGET/,
# crashes to fuzz-corpus-crashes/, logs to fuzz-corpus-logs/ (scripts/fuzz-one.sh). Fails if one
# crashed.
fuzz:
	@bash scripts/install-deps.sh clang
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P $(FUZZ_JOBS) -I{} bash scripts/fuzz-one.sh {} $(FUZZ_SECONDS)

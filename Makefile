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

bench: deps
	@cmake --preset release >/dev/null
	@cmake --build build-release -j $(JOBS) --target tensorpool_bench
	@build-release/bench/tensorpool_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

clean:
	@rm -rf build build-*

// Cached allocate+free pairs on the simulated device, with 1k and 100k other live blocks:
// BM_AllocFreePair and BM_AllocFreeMixed with fixed segments (mode:fixed), BM_AllocFreePairVmm in
// the virtual-memory mode (the default on a device with virtual memory, as the simulated one).
//
// Each benchmark first fills the allocator with `live` blocks of mixed sizes (512 B .. 64 KiB,
// and every third one freed again so the free index holds thousands of fragments), then times
// allocate(size) immediately followed by deallocate() of the same block. Target: <= 50 ns per
// pair, and at most 2x slower with 100k live blocks than with 1k.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "mixed_fill.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

Config with_mode(Mode mode) {
  Config c;
  c.mode = mode;
  return c;
}

struct Populated {
  explicit Populated(std::size_t live, Mode mode = Mode::fixed)
      : device(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * TiB})),
        alloc(device, with_mode(mode)),
        held(bench::fill_mixed(
            live, [this](std::size_t bytes) { return alloc.allocate(bytes); },
            [this](void* p) { alloc.deallocate(p); })) {}
  ~Populated() {
    for (void* p : held) alloc.deallocate(p);
  }
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
  std::vector<void*> held;
};

void alloc_free_pair(benchmark::State& state, Mode mode) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const auto live = static_cast<std::size_t>(state.range(1));
  Populated pop(live, mode);
  pop.alloc.deallocate(pop.alloc.allocate(size));  // warm: the block is cached from here on
  for (auto _ : state) {
    void* p = pop.alloc.allocate(size);
    benchmark::DoNotOptimize(p);
    pop.alloc.deallocate(p);
  }
  state.counters["live_blocks"] = static_cast<double>(pop.held.size());
  state.counters["segment_allocs"] = static_cast<double>(pop.alloc.stats().upstream_allocs);
}

void BM_AllocFreePair(benchmark::State& state) { alloc_free_pair(state, Mode::fixed); }
void BM_AllocFreePairVmm(benchmark::State& state) { alloc_free_pair(state, Mode::vmm); }

// A rotating window of different sizes: the block found is rarely the one just freed.
void BM_AllocFreeMixed(benchmark::State& state) {
  const auto live = static_cast<std::size_t>(state.range(0));
  Populated pop(live);
  std::mt19937_64 rng(2);
  std::vector<std::size_t> sizes(4096);
  for (auto& s : sizes) s = 512 + rng() % (8 * MiB);
  std::vector<void*> ring(64, nullptr);
  std::size_t i = 0;
  for (auto _ : state) {
    void*& slot = ring[i % ring.size()];
    if (slot != nullptr) pop.alloc.deallocate(slot);
    slot = pop.alloc.allocate(sizes[i % sizes.size()]);
    ++i;
  }
  for (void* p : ring)
    if (p != nullptr) pop.alloc.deallocate(p);
}

}  // namespace

BENCHMARK(BM_AllocFreePair)
    ->ArgNames({"size", "live"})
    ->ArgsProduct({{4096, 1 << 20, 64 << 20}, {1000, 100000}});
BENCHMARK(BM_AllocFreePairVmm)
    ->ArgNames({"size", "live"})
    ->ArgsProduct({{4096, 1 << 20, 64 << 20}, {1000, 100000}});
BENCHMARK(BM_AllocFreeMixed)->ArgNames({"live"})->Arg(1000)->Arg(100000);

BENCHMARK_MAIN();

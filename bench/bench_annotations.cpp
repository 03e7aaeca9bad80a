// The cost of the optional layers on the cached allocate+free pair (1 MiB, 1000 other live
// blocks, as BM_AllocFreePair): none, a no-op observer (the floor of any observer: the allocator
// then time-stamps every event), a live recording (to /dev/null: the ring and the writer thread,
// no disk), and NVTX (tensorpool/cuda/nvtx.hpp; no tool attached, so every NVTX call is a no-op,
// as in a process that is not being profiled). docs/benchmarks.md quotes the figures.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensorpool/record.hpp"
#include "tensorpool/tensorpool.hpp"
#if TP_BENCH_NVTX
#include "tensorpool/cuda/nvtx.hpp"
#endif

using namespace tensorpool;

namespace {

constexpr std::size_t kSize = MiB;
constexpr std::size_t kLive = 1000;

struct NoOp final : Observer {
  void on_event(const AllocatorEvent& e) noexcept override { benchmark::DoNotOptimize(e.address); }
};

/// An allocator on a 4 TiB simulated device (through `wrap`), holding kLive mixed blocks with
/// fragments between them, its kSize block cached.
struct Populated {
  explicit Populated(const std::string& conf, bool nvtx = false) {
    Config c = Config::parse(conf);
    if (c.mode == Mode::automatic) c.mode = Mode::fixed;  // as when docs/benchmarks.md measured it
    std::shared_ptr<DeviceBackend> device =
        std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * TiB});
#if TP_BENCH_NVTX
    if (nvtx) device = with_nvtx(device, c);
#else
    (void)nvtx;
#endif
    alloc = std::make_unique<Allocator>(device, c);
    std::mt19937_64 rng(1);
    for (std::size_t i = 0; i < kLive + kLive / 2; ++i) {
      held.push_back(alloc->allocate(512 + rng() % (64 * KiB)));
      if (i % 3 == 2) {
        alloc->deallocate(held[held.size() - 2]);
        held.erase(held.end() - 2);
      }
    }
    alloc->deallocate(alloc->allocate(kSize));
  }
  ~Populated() {
    for (void* p : held) alloc->deallocate(p);
  }
  std::unique_ptr<Allocator> alloc;
  std::vector<void*> held;
};

void pairs(benchmark::State& state, Allocator& alloc) {
  for (auto _ : state) {
    void* p = alloc.allocate(kSize);
    benchmark::DoNotOptimize(p);
    alloc.deallocate(p);
  }
}

void BM_Pair_Plain(benchmark::State& state) {
  Populated pop("");
  pairs(state, *pop.alloc);
}

void BM_Pair_NoOpObserver(benchmark::State& state) {
  Populated pop("");
  pop.alloc->add_observer(std::make_shared<NoOp>());
  pairs(state, *pop.alloc);
}

void BM_Pair_Recording(benchmark::State& state) {
  Populated pop("");
  Recording rec = start_recording(*pop.alloc, "/dev/null");
  pairs(state, *pop.alloc);
  rec.stop();
  state.counters["events_written"] = static_cast<double>(rec.status().events_written);
}

#if TP_BENCH_NVTX
void nvtx_pairs(benchmark::State& state, const std::string& conf) {
  Populated pop(conf, true);
  attach_nvtx(*pop.alloc);
  pairs(state, *pop.alloc);
}
void BM_Pair_NvtxOffThroughWithNvtx(benchmark::State& state) { nvtx_pairs(state, ""); }
void BM_Pair_Nvtx(benchmark::State& state) { nvtx_pairs(state, "nvtx:on"); }
void BM_Pair_NvtxMem(benchmark::State& state) { nvtx_pairs(state, "nvtx_mem:on"); }
void BM_Pair_NvtxAndMem(benchmark::State& state) { nvtx_pairs(state, "nvtx:on,nvtx_mem:on"); }
#endif

}  // namespace

BENCHMARK(BM_Pair_Plain);
BENCHMARK(BM_Pair_NoOpObserver);
BENCHMARK(BM_Pair_Recording);
#if TP_BENCH_NVTX
BENCHMARK(BM_Pair_NvtxOffThroughWithNvtx);
BENCHMARK(BM_Pair_Nvtx);
BENCHMARK(BM_Pair_NvtxMem);
BENCHMARK(BM_Pair_NvtxAndMem);
#endif

BENCHMARK_MAIN();

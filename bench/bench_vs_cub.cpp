// bench_vs_cub.cpp: the cached allocate + free pair of tensorpool side by side with the real CUB
// CachingDeviceAllocator (the header from the CUDA Toolkit's CCCL), in one binary, same fill,
// same sizes, 1 and 2 threads on one allocator.
//
// CUB runs over cub_runtime_standin.cpp, a host-only stand-in for the nine runtime calls it
// makes, each as cheap as a call can be: the CUB figures are CUB's own bookkeeping (a std::mutex,
// a multiset of live blocks by address, a multiset of cached blocks by size). tensorpool runs on
// its simulated device, whose events complete as they are recorded (the pairs queue no work, so
// a GPU would have finished it; with events that never complete, a give-back above a plan would
// wait forever). Both are first filled with `live` blocks of mixed sizes (512 B .. 64 KiB, every
// third freed again, so the caches hold fragments), then one block of the benchmark's size per
// thread is allocated and freed once (cached from then on), then each iteration allocates and
// frees that size.
//
// Allocators compared:
//   tensorpool-fixed  mode:fixed, the other settings at their defaults (fixed segments, as CUB's
//                     are cudaMalloc blocks);
//   tensorpool-vmm    the default mode on a device with virtual memory (vmm heaps, planned
//                     layouts, the background planner);
//   cub               CachingDeviceAllocator(bin_growth 8, min_bin 3, max_bin 9, no cache limit):
//                     every size here is cached (bins up to 8^9 = 128 MiB; 100 MiB takes the
//                     128 MiB bin);
//   cub-default       the default-constructed allocator (max_bin 7 = 2 MiB, 6 MiB - 1 cache
//                     limit): 64 MiB and 100 MiB are not binned, so each pair is a cudaMalloc and
//                     a cudaFree of the stand-in (1 thread only).
// Threads: 1, and 2 on one allocator, either on the same stream (/same_stream: the default
// stream, which holds the fill) or each on its own (/own_streams: streams that hold nothing but
// the pair; CUB is given distinct stream handles, which its stand-in ignores). One thread on its
// own stream is the baseline of two: in the vmm mode a pair on an otherwise empty heap is an
// epoch (held pages, a plan), a different path from a pair beside the fill. /shared_segment
// (tensorpool only, 64 and 100 MiB, live 1000): the same stream, with one block of twice the size
// cached instead of one per thread, so that one thread and two run on the same layout (each pair
// splits that block and its free merges it back: the cost a heap shared by two threads' blocks
// pays even when one thread runs alone).
// Counters: live_blocks, upstream_in_loop (cudaMalloc / segment allocations made inside the timed
// loop: 0 when the pair is served from the cache).
#include <benchmark/benchmark.h>
#include <cub/util_allocator.cuh>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cub_runtime_standin.hpp"
#include "mixed_fill.hpp"
#include "tensorpool/tensorpool.hpp"

namespace {

using namespace tensorpool;

enum class CubConfig { all_cached, defaults };

class TensorpoolSide {
 public:
  explicit TensorpoolSide(Mode mode)
      : device_(std::make_shared<SimulatedDevice>(
            SimulatedDeviceOptions{.capacity = 4 * TiB, .event_mode = EventMode::immediate})),
        alloc_(device_, config(mode)) {
    for (int i = 0; i < 2; ++i) streams_.push_back(device_->create_stream());
  }
  void* allocate(std::size_t bytes, int lane = -1) { return alloc_.allocate(bytes, stream(lane)); }
  void deallocate(void* p) { alloc_.deallocate(p); }
  std::uint64_t upstream_allocs() const { return alloc_.stats().upstream_allocs + device_->counters().maps; }

 private:
  static Config config(Mode mode) {
    Config c;
    c.mode = mode;
    return c;
  }
  Stream stream(int lane) const { return lane < 0 ? kDefaultStream : streams_[static_cast<std::size_t>(lane)]; }
  std::shared_ptr<SimulatedDevice> device_;
  Allocator alloc_;
  std::vector<Stream> streams_;
};

class CubSide {
 public:
  explicit CubSide(CubConfig config)
      : cub_(config == CubConfig::all_cached
                 ? std::make_unique<cub::CachingDeviceAllocator>(8U, 3U, 9U, cub::CachingDeviceAllocator::INVALID_SIZE)
                 : std::make_unique<cub::CachingDeviceAllocator>()) {}
  void* allocate(std::size_t bytes, int lane = -1) {
    void* p = nullptr;
    // Distinct handles per lane; the stand-in's runtime never dereferences them.
    cudaStream_t stream = lane < 0 ? nullptr : reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(0x100 + lane));
    if (cub_->DeviceAllocate(&p, bytes, stream) != cudaSuccess) std::abort();
    return p;
  }
  void deallocate(void* p) {
    if (cub_->DeviceFree(p) != cudaSuccess) std::abort();
  }
  std::uint64_t upstream_allocs() const { return cub_standin::mallocs(); }

 private:
  std::unique_ptr<cub::CachingDeviceAllocator> cub_;
};

// An allocator holding `live` blocks of mixed sizes, with freed fragments between them.
template <class Side>
struct Filled {
  template <class... Args>
  Filled(std::size_t live, Args&&... args)
      : side(std::forward<Args>(args)...),
        held(bench::fill_mixed(
            live, [this](std::size_t bytes) { return side.allocate(bytes); },
            [this](void* p) { side.deallocate(p); })) {}
  ~Filled() {
    for (void* p : held) side.deallocate(p);
  }
  Side side;
  std::vector<void*> held;
};

// shared_segment: the same stream, one block of twice the size cached (the file's banner).
enum class Lanes { same_stream, own_streams, shared_segment };
int lane_of(Lanes lanes, int thread) { return lanes == Lanes::own_streams ? thread : -1; }

template <class Side, class... Args>
void pair_benchmark(benchmark::State& state, Lanes lanes, Args... args) {
  static std::unique_ptr<Filled<Side>> shared;  // one allocator for every thread of the run
  static std::uint64_t upstream_before = 0;
  const auto size = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) {
    shared = std::make_unique<Filled<Side>>(static_cast<std::size_t>(state.range(1)), args...);
    std::vector<void*> warm;  // one cached block of `size` per thread, on its stream
    if (lanes == Lanes::shared_segment) {
      warm.push_back(shared->side.allocate(2 * size, -1));
    } else {
      for (int t = 0; t < state.threads(); ++t) warm.push_back(shared->side.allocate(size, lane_of(lanes, t)));
    }
    for (void* p : warm) shared->side.deallocate(p);
    upstream_before = shared->side.upstream_allocs();
  }
  const int lane = lane_of(lanes, state.thread_index());
  for (auto _ : state) {  // the loop starts and ends with a barrier of all threads
    void* p = shared->side.allocate(size, lane);
    benchmark::DoNotOptimize(p);
    shared->side.deallocate(p);
  }
  if (state.thread_index() == 0) {
    state.counters["live_blocks"] = static_cast<double>(shared->held.size());
    state.counters["upstream_in_loop"] =
        static_cast<double>(shared->side.upstream_allocs() - upstream_before);
    shared.reset();
  }
}

void shared_segment_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"size", "live"});
  for (std::int64_t size : {64 * MiB, 100 * MiB}) b->Args({size, 1000});
  b->UseRealTime();
}

void pair_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"size", "live"});
  for (std::int64_t size : {4 * KiB, MiB, 64 * MiB, 100 * MiB})
    for (std::int64_t live : {1000, 100000}) b->Args({size, live});
  b->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto add = [](const std::string& name, auto fn, int threads, auto args) {
    benchmark::RegisterBenchmark(name.c_str(), fn)->Apply(args)->Threads(threads);
  };
  for (int threads : {1, 2}) {
    for (const Lanes lanes : {Lanes::same_stream, Lanes::own_streams}) {
      const std::string suffix = lanes == Lanes::same_stream ? "/same_stream" : "/own_streams";
      add("pair/tensorpool-fixed" + suffix,
          [lanes](benchmark::State& st) { pair_benchmark<TensorpoolSide>(st, lanes, Mode::fixed); }, threads, pair_args);
      add("pair/tensorpool-vmm" + suffix,
          [lanes](benchmark::State& st) { pair_benchmark<TensorpoolSide>(st, lanes, Mode::vmm); }, threads, pair_args);
      add("pair/cub" + suffix,
          [lanes](benchmark::State& st) { pair_benchmark<CubSide>(st, lanes, CubConfig::all_cached); }, threads, pair_args);
    }
  }
  for (int threads : {1, 2}) {
    add("pair/tensorpool-fixed/shared_segment",
        [](benchmark::State& st) { pair_benchmark<TensorpoolSide>(st, Lanes::shared_segment, Mode::fixed); }, threads,
        shared_segment_args);
    add("pair/tensorpool-vmm/shared_segment",
        [](benchmark::State& st) { pair_benchmark<TensorpoolSide>(st, Lanes::shared_segment, Mode::vmm); }, threads,
        shared_segment_args);
  }
  add("pair/cub-default/same_stream",
      [](benchmark::State& st) { pair_benchmark<CubSide>(st, Lanes::same_stream, CubConfig::defaults); }, 1, pair_args);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

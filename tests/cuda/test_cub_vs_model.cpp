// The "cub" replay model against the real CUB CachingDeviceAllocator (the CCCL header) running on
// the CUDA-runtime test double: on fixture traces built here (every rule of the model: bins,
// unbinned requests, the cache limit, per-stream reuse and stream syncs, the OOM retry, an
// impossible request) and on every shared PyTorch snapshot, the two must agree on peak and final
// reserved bytes, cudaMalloc and cudaFree counts, synchronizations and OOMs, device by device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <cub/util_allocator.cuh>

#include "support/skip.hpp"
#include "cub_vs_model.hpp"
#include "support/workloads.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

using namespace tensorpool;
using tensorpool::trace::Op;

namespace {

struct Builder {
  trace::Trace t;
  std::uint64_t next = 0x10000;
  std::uint64_t alloc(std::uint64_t size, std::uint64_t stream = 0, std::uint16_t device = 0) {
    const std::uint64_t a = next;
    next += size + 4096;
    push(Op::alloc, a, size, stream, device);
    return a;
  }
  void free(std::uint64_t addr, std::uint64_t size, std::uint64_t stream = 0, std::uint16_t device = 0) {
    push(Op::free_requested, addr, size, stream, device);
  }
  void sync(std::uint64_t stream, std::uint16_t device = 0) { push(Op::stream_sync, 0, 0, stream, device); }
  void push(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream, std::uint16_t device) {
    t.events.push_back({.op = op, .device = device, .stream = stream, .addr = addr, .size = size});
  }
};

void require_same(const replay::ReplayResult& real, const replay::ReplayResult& model) {
  INFO("device " << real.device);
  CHECK(real.allocator == "cub-real");
  CHECK(model.allocator == "cub");
  CHECK(model.peak_reserved == real.peak_reserved);
  CHECK(model.final_reserved == real.final_reserved);
  CHECK(model.peak_allocated == real.peak_allocated);
  CHECK(model.upstream.allocs == real.upstream.allocs);
  CHECK(model.upstream.frees == real.upstream.frees);
  CHECK(model.upstream.syncs == real.upstream.syncs);
  CHECK(model.seeding.allocs == real.seeding.allocs);
  CHECK(model.seeding.frees == real.seeding.frees);
  CHECK(model.ooms == real.ooms);
}

void require_same(const cuda_replay::CubComparison& c) {
  REQUIRE(c.real.devices.size() == c.model.devices.size());
  for (std::size_t d = 0; d < c.real.devices.size(); ++d) require_same(c.real.devices[d], c.model.devices[d]);
  require_same(c.real.total, c.model.total);
}

// Deterministic pseudo-random traffic on three streams, sizes from 1 B to 40 MiB.
trace::Trace random_trace(std::uint64_t seed, int steps) {
  Builder b;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  std::uint64_t s = seed;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int i = 0; i < steps; ++i) {
    const std::uint64_t r = next();
    const std::uint64_t stream = r % 3;
    if (r % 100 < 52 || live.empty()) {
      const std::uint64_t kind = (r >> 8) % 100;
      const std::uint64_t size = kind < 70 ? (r >> 16) % (2 * MiB) + 1 : (r >> 16) % (40 * MiB) + 1;
      live.emplace_back(b.alloc(size, stream), size);
    } else if (r % 100 < 95) {
      const std::size_t k = (r >> 8) % live.size();
      b.free(live[k].first, live[k].second, stream);
      live[k] = live.back();
      live.pop_back();
    } else {
      b.sync(stream);
    }
  }
  return b.t;
}

}  // namespace

TEST_CASE("cub model = real CUB: bins, unbinned requests and the cache limit", "[cuda][cub]") {
  Builder b;
  const auto a = b.alloc(100);        // 512 B bin
  const auto c = b.alloc(5000);       // 32 KiB bin
  const auto d = b.alloc(3 * MiB);    // above 2 MiB: unbinned, exact
  b.free(a, 100);
  b.free(c, 5000);
  b.free(d, 3 * MiB);                 // cudaFree'd at once
  const auto e = b.alloc(200);        // reuses a's block
  const auto f = b.alloc(2 * MiB);    // the largest bin
  const auto g = b.alloc(2 * MiB);
  const auto h = b.alloc(2 * MiB);
  const auto i = b.alloc(2 * MiB);
  for (auto x : {f, g, h, i}) b.free(x, 2 * MiB);  // the fourth goes over 6 MiB - 1: cudaFree'd
  b.free(e, 200);
  const auto comparison = cuda_replay::compare_cub_with_model(b.t, 80 * GiB);
  require_same(comparison);
  CHECK(comparison.real.total.upstream.allocs == 7);
  CHECK(comparison.real.total.upstream.frees == 3);  // d, and two 2 MiB blocks over the limit
}

TEST_CASE("cub model = real CUB: per-stream reuse, stream syncs and cudaFree's device sync", "[cuda][cub]") {
  Builder b;
  const auto a = b.alloc(4000, 1);
  b.free(a, 4000, 1);
  const auto x = b.alloc(4000, 2);    // stream 2 cannot reuse stream 1's block yet: new block
  b.sync(1);
  const auto y = b.alloc(4000, 2);    // now it can
  const auto big = b.alloc(8 * MiB, 0);
  const auto z = b.alloc(4000, 1);
  b.free(z, 4000, 1);
  b.free(x, 4000, 2);
  b.free(big, 8 * MiB, 0);            // cudaFree: the device is idle afterwards
  const auto w = b.alloc(4000, 0);    // reuses a block cached by another stream
  b.free(w, 4000, 0);
  b.free(y, 4000, 2);
  const auto comparison = cuda_replay::compare_cub_with_model(b.t, 80 * GiB);
  require_same(comparison);
  CHECK(comparison.real.total.upstream.syncs >= 1);
}

TEST_CASE("cub model = real CUB: a failed cudaMalloc empties the cache and retries, impossible requests",
          "[cuda][cub]") {
  Builder b;
  const auto a = b.alloc(2 * MiB);
  const auto c = b.alloc(2 * MiB);
  b.free(a, 2 * MiB);
  b.free(c, 2 * MiB);                 // 4 MiB cached
  const auto d = b.alloc(7 * MiB);    // fits only once the cache is freed
  b.alloc(64 * GiB);                  // never fits: an OOM, after freeing the (empty) cache
  const auto e = b.alloc(1 * MiB);    // 2 MiB bin
  b.free(e, 1 * MiB);
  const auto f = b.alloc(3 * GiB);    // beyond the 10 MiB device: empties the cache, then OOM
  b.free(f, 3 * GiB);
  b.free(d, 7 * MiB);
  const auto comparison = cuda_replay::compare_cub_with_model(b.t, 10 * MiB);
  require_same(comparison);
  CHECK(comparison.real.total.ooms == 2);
  CHECK(comparison.real.total.upstream.frees == 4);  // a and c for d, e for f, then d itself
}

TEST_CASE("cub model = real CUB: random traffic on three streams, settings from the conf", "[cuda][cub]") {
  for (std::uint64_t seed : {1ULL, 7ULL}) {
    const trace::Trace t = random_trace(seed * 0x9e3779b97f4a7c15ULL, 6000);
    INFO("seed " << seed);
    require_same(cuda_replay::compare_cub_with_model(t, 2 * GiB));
    require_same(cuda_replay::compare_cub_with_model(t, 600 * MiB, "max_cached_bytes:none"));
    require_same(cuda_replay::compare_cub_with_model(t, 2 * GiB, "bin_growth:4,min_bin:5,max_bin:10"));
  }
}

TEST_CASE("cub model = real CUB: a generated LLM training trace", "[cuda][cub]") {
  require_same(cuda_replay::compare_cub_with_model(
      tptest::generated("layers:4,hidden:1024,ffn:4096,micro_batch:4,seq:2048,seq_dist:uniform,steps:3"), 80 * GiB));
}

TEST_CASE("cub model = real CUB on every shared PyTorch snapshot", "[cuda][cub][shared]") {
  namespace fs = std::filesystem;
  TP_REQUIRE_SHARED_TRACES(dir);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".pickle") files.push_back(entry.path());
  REQUIRE(!files.empty());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    INFO(f.filename().string());
    require_same(cuda_replay::compare_cub_with_model(trace::pytorch::import_snapshot(f), 80 * GiB));
  }
}

// CUB as shipped, not through the replay target (which unwraps CubDebug, see
// cuda/replay/cub_real_target.cpp): CubDebug() returns the runtime's pending last error, so on a
// runtime that records cudaEventQuery's cudaErrorNotReady (the double does) an allocation on an
// explicit device fails with cudaErrorNotReady when the only cached block of its bin belongs to
// a stream still busy: DeviceAllocate(device, ...) returns it from its next cudaGetDevice.
TEST_CASE("real CUB as shipped: a pending cudaErrorNotReady from its own event query fails DeviceAllocate",
          "[cuda][cub]") {
  cuda_double::reset();
  cudaStream_t s1 = nullptr, s2 = nullptr;
  REQUIRE(cudaStreamCreate(&s1) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&s2) == cudaSuccess);
  {
    cub::CachingDeviceAllocator cub;
    void* a = nullptr;
    REQUIRE(cub.DeviceAllocate(0, &a, 4000, s1) == cudaSuccess);
    REQUIRE(cub.DeviceFree(0, a) == cudaSuccess);  // cached; its event waits for s1
    void* b = nullptr;
    CHECK(cub.DeviceAllocate(0, &b, 4000, s2) == cudaErrorNotReady);
    CHECK(b == nullptr);
    cuda_double::complete_stream(s1);
    CHECK(cub.DeviceAllocate(0, &b, 4000, s2) == cudaSuccess);  // s1 done: the block is reused
    CHECK(b == a);
    CHECK(cub.DeviceFree(0, b) == cudaSuccess);
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

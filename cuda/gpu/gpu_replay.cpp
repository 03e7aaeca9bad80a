// gpu_replay.cpp: replays a trace (device 0's events) on a real GPU against real allocators, with
// a spin kernel between events (the trace's time gap, scaled) so that stream work is in flight:
//   raw             cudaMalloc / cudaFree
//   async           cudaMallocAsync / cudaFreeAsync on the device's default pool
//   tensorpool-async, tensorpool-malloc, tensorpool-vmm
//                   tensorpool::Allocator with fixed segments (mode:fixed) on each CUDA backend,
//                   and tensorpool-vmm-mode: the VMM backend in mode:vmm, its default there
//   cub             CUB's CachingDeviceAllocator (the CCCL header, default settings)
//   rmm-pool        RMM's pool_memory_resource over cuda_memory_resource, initial pool half of
//                   the free memory (built only with -DTENSORPOOL_RMM_ROOT, the unpacked
//                   librmm-cu13 wheel)
// For each allocator, one JSON line: wall time of the replay (events + kernels, to the final
// device sync), host ns per allocation or free (only the allocator's calls are timed), peak
// reserved bytes (cudaMemGetInfo: used now - used before the allocator existed, sampled after
// every allocation), OOMs.
//
//   gpu_replay TRACE [--allocators a,b,...] [--time-scale 0.01] [--max-gap-us 200]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <cub/util_allocator.cuh>

#include "spin_kernel.hpp"
#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/interop.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/trace/load.hpp"

#ifdef TP_WITH_RMM
#include <rmm/cuda_device.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda/stream_ref>
#endif

namespace {

using namespace tensorpool;
using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gpu_replay: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

class GpuAllocator {
 public:
  virtual ~GpuAllocator() = default;
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;  // nullptr: out of memory
  virtual void deallocate(void* p, std::size_t bytes, cudaStream_t stream) = 0;
  virtual void empty_cache() {}
};

class Raw final : public GpuAllocator {
 public:
  void* allocate(std::size_t bytes, cudaStream_t) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    return p;
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { check(cudaFree(p), "cudaFree"); }
};

class Async final : public GpuAllocator {
 public:
  void* allocate(std::size_t bytes, cudaStream_t s) override {
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, s) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    return p;
  }
  void deallocate(void* p, std::size_t, cudaStream_t s) override { check(cudaFreeAsync(p, s), "cudaFreeAsync"); }
};

class Tensorpool final : public GpuAllocator {
 public:
  Tensorpool(CudaBackendKind kind, const std::string& conf) : alloc_(make_cuda_backend(kind, 0), Config::parse(conf)) {}
  void* allocate(std::size_t bytes, cudaStream_t s) override {
    try {
      return alloc_.allocate(bytes, to_stream(s));
    } catch (const OutOfMemoryError&) {
      return nullptr;
    }
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { alloc_.deallocate(p); }
  void empty_cache() override { alloc_.empty_cache(); }

 private:
  Allocator alloc_;
};

class Cub final : public GpuAllocator {
 public:
  void* allocate(std::size_t bytes, cudaStream_t s) override {
    void* p = nullptr;
    if (cub_.DeviceAllocate(&p, bytes, s) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    return p;
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { check(cub_.DeviceFree(p), "DeviceFree"); }
  void empty_cache() override { cub_.FreeAllCached(); }

 private:
  cub::CachingDeviceAllocator cub_;
};

#ifdef TP_WITH_RMM
class RmmPool final : public GpuAllocator {
 public:
  RmmPool() : pool_(rmm::mr::cuda_memory_resource{}, rmm::percent_of_free_device_memory(50)) {}
  void* allocate(std::size_t bytes, cudaStream_t s) override {
    try {
      return pool_.allocate(cuda::stream_ref{s}, bytes, 256);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void deallocate(void* p, std::size_t bytes, cudaStream_t s) override {
    pool_.deallocate(cuda::stream_ref{s}, p, bytes, 256);
  }

 private:
  rmm::mr::pool_memory_resource pool_;
};
#endif

std::unique_ptr<GpuAllocator> make(const std::string& name) {
  if (name == "raw") return std::make_unique<Raw>();
  if (name == "async") return std::make_unique<Async>();
  if (name == "tensorpool-async") return std::make_unique<Tensorpool>(CudaBackendKind::async_pool, "mode:fixed");
  if (name == "tensorpool-malloc") return std::make_unique<Tensorpool>(CudaBackendKind::malloc, "mode:fixed");
  if (name == "tensorpool-vmm") return std::make_unique<Tensorpool>(CudaBackendKind::vmm, "mode:fixed");
  if (name == "tensorpool-vmm-mode") return std::make_unique<Tensorpool>(CudaBackendKind::vmm, "mode:vmm");
  if (name == "cub") return std::make_unique<Cub>();
#ifdef TP_WITH_RMM
  if (name == "rmm-pool") return std::make_unique<RmmPool>();
#endif
  return nullptr;
}

std::size_t used_memory() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

struct Result {
  double wall_ms = 0, host_ns_per_op = 0;
  std::size_t peak_reserved = 0;
  std::uint64_t allocs = 0, frees = 0, ooms = 0;
};

Result run(const trace::Trace& t, const std::string& name, double scale, double max_gap_us, int clock_khz) {
  check(cudaDeviceSynchronize(), "sync");
  const std::size_t before = used_memory();
  Result r;
  auto alloc = make(name);
  if (!alloc) {
    std::fprintf(stderr, "gpu_replay: unknown or unavailable allocator '%s'\n", name.c_str());
    std::exit(2);
  }
  std::unordered_map<std::uint64_t, cudaStream_t> streams;
  auto stream_of = [&](std::uint64_t id) {
    if (id == 0) return cudaStream_t{nullptr};
    auto [it, fresh] = streams.try_emplace(id, nullptr);
    if (fresh) check(cudaStreamCreateWithFlags(&it->second, cudaStreamNonBlocking), "cudaStreamCreate");
    return it->second;
  };
  struct Live { void* p; std::size_t size; cudaStream_t s; };
  std::unordered_map<std::uint64_t, Live> live;
  double host_ns = 0;
  std::int64_t last_time = -1;
  const auto start = Clock::now();
  for (const trace::TraceEvent& e : t.events) {
    if (e.device != 0) continue;
    const bool seed = e.op == trace::Op::seed_alloc;
    if (!seed && last_time >= 0 && e.time_us > last_time) {
      const double gap = std::min(max_gap_us, static_cast<double>(e.time_us - last_time) * scale);
      if (gap >= 1.0) check(launch_spin(static_cast<long long>(gap * clock_khz / 1000.0), stream_of(e.stream)), "spin");
    }
    if (!seed && e.time_us != 0) last_time = e.time_us;
    switch (e.op) {
      case trace::Op::seed_alloc:
      case trace::Op::alloc: {
        if (e.size == 0) break;
        const cudaStream_t s = stream_of(e.stream);
        const auto t0 = Clock::now();
        void* p = alloc->allocate(e.size, s);
        host_ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        ++r.allocs;
        if (p == nullptr) { ++r.ooms; break; }
        if (auto old = live.find(e.addr); old != live.end()) {
          alloc->deallocate(old->second.p, old->second.size, old->second.s);
          live.erase(old);
        }
        live[e.addr] = {p, e.size, s};
        r.peak_reserved = std::max(r.peak_reserved, used_memory() - std::min(before, used_memory()));
        break;
      }
      case trace::Op::free_requested: {
        auto it = live.find(e.addr);
        if (it == live.end()) break;
        const auto t0 = Clock::now();
        alloc->deallocate(it->second.p, it->second.size, it->second.s);
        host_ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        ++r.frees;
        live.erase(it);
        break;
      }
      case trace::Op::stream_sync: check(cudaStreamSynchronize(stream_of(e.stream)), "cudaStreamSynchronize"); break;
      case trace::Op::empty_cache: alloc->empty_cache(); break;
      default: break;
    }
  }
  check(cudaDeviceSynchronize(), "final sync");
  r.wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  r.host_ns_per_op = r.allocs + r.frees == 0 ? 0 : host_ns / static_cast<double>(r.allocs + r.frees);
  for (auto& [addr, l] : live) alloc->deallocate(l.p, l.size, l.s);
  alloc.reset();
  for (auto& [id, s] : streams) cudaStreamDestroy(s);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE [--allocators a,b] [--time-scale S] [--max-gap-us U]\n", argv[0]);
    return 2;
  }
  std::string allocators = "raw,async,tensorpool-async,tensorpool-malloc,tensorpool-vmm,tensorpool-vmm-mode,cub";
#ifdef TP_WITH_RMM
  allocators += ",rmm-pool";
#endif
  double scale = 0.01, max_gap_us = 200;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--allocators")) allocators = argv[i + 1];
    else if (!std::strcmp(argv[i], "--time-scale")) scale = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-gap-us")) max_gap_us = std::atof(argv[i + 1]);
    else { std::fprintf(stderr, "gpu_replay: unknown option %s\n", argv[i]); return 2; }
  }
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  const trace::Trace t = trace::load_trace(argv[1]);
  std::stringstream names(allocators);
  std::string name;
  while (std::getline(names, name, ',')) {
    const Result r = run(t, name, scale, max_gap_us, clock_khz);
    std::printf("{\"trace\": \"%s\", \"allocator\": \"%s\", \"wall_ms\": %.3f, \"host_ns_per_op\": %.1f, "
                "\"peak_reserved_bytes\": %zu, \"allocs\": %llu, \"frees\": %llu, \"ooms\": %llu, "
                "\"time_scale\": %g}\n",
                argv[1], name.c_str(), r.wall_ms, r.host_ns_per_op, r.peak_reserved,
                static_cast<unsigned long long>(r.allocs), static_cast<unsigned long long>(r.frees),
                static_cast<unsigned long long>(r.ooms), scale);
    std::fflush(stdout);
  }
  return 0;
}

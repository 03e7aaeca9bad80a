// tests/cuda/test_real_hardware.cpp: checks that only mean something on a real GPU (built only
// with TENSORPOOL_CUDA_REAL_TESTS): the pointers every backend hands out through the caching
// allocator are real memory (written with cudaMemsetAsync and a kernel, read back with
// cudaMemcpy), staging buffers carry real copies, a real out-of-memory goes through the
// allocator's ladder with no error left behind, and sleep gives memory back to the GPU (printing
// its time per GiB) while wake maps usable pages at the same addresses with the kept contents,
// and a CUDA graph captured in global mode gets its blocks from a graph pool without
// invalidating the capture, its replays writing the pool's memory.
#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

using namespace tpcuda;

// real_kernels.cu: adds 1 to every byte of [p, p + n) on `stream`.
extern "C" cudaError_t tp_real_add_one(void* p, size_t n, cudaStream_t stream);

namespace {
bool all_bytes(const std::vector<unsigned char>& v, unsigned char value) {
  return std::all_of(v.begin(), v.end(), [&](unsigned char b) { return b == value; });
}

// Device memory: memset on the stream, a kernel on the stream, then a synchronous copy back.
void check_device_memory(void* p, std::size_t n, cudaStream_t stream) {
  TP_CUDA_OK(cudaMemsetAsync(p, 0x5a, n, stream));
  TP_CUDA_OK(tp_real_add_one(p, n, stream));
  TP_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<unsigned char> back(n);
  TP_CUDA_OK(cudaMemcpy(back.data(), p, n, cudaMemcpyDeviceToHost));
  REQUIRE(all_bytes(back, 0x5b));
}

// Pinned host memory: written by the host, copied to the device and back on the stream.
void check_pinned_memory(void* p, std::size_t n, cudaStream_t stream) {
  std::memset(p, 0xc3, n);
  void* dev = nullptr;
  TP_CUDA_OK(cudaMalloc(&dev, n));
  TP_CUDA_OK(cudaMemcpyAsync(dev, p, n, cudaMemcpyHostToDevice, stream));
  TP_CUDA_OK(tp_real_add_one(dev, n, stream));
  TP_CUDA_OK(cudaMemcpyAsync(p, dev, n, cudaMemcpyDeviceToHost, stream));
  TP_CUDA_OK(cudaStreamSynchronize(stream));
  TP_CUDA_OK(cudaFree(dev));
  const auto* bytes = static_cast<const unsigned char*>(p);
  REQUIRE(std::all_of(bytes, bytes + n, [](unsigned char b) { return b == 0xc4; }));
}
}  // namespace

TEST_CASE("real: every backend's blocks are memory the GPU reads and writes", "[cuda][real]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  for (const std::size_t n : {std::size_t{1000}, 3 * MiB + 7, 40 * MiB}) {
    INFO(n);
    void* p = alloc->allocate(n, s.id());
    REQUIRE(p != nullptr);
    if (kind == CudaBackendKind::pinned_host) check_pinned_memory(p, n, s.get());
    else check_device_memory(p, n, s.get());
    alloc->deallocate(p);
  }
  alloc->empty_cache();
  alloc->check_invariants();
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("real: the allocator's vmm mode hands out pages the GPU reads and writes",
          "[cuda][real][vmm]") {
  Env env;
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  std::vector<void*> blocks;
  for (const std::size_t n : {std::size_t{1000}, 3 * MiB + 7, 40 * MiB, 300 * MiB}) {
    INFO(n);
    void* p = alloc->allocate(n, s.id());
    check_device_memory(p, n, s.get());
    blocks.push_back(p);
  }
  for (void* p : blocks) alloc->deallocate(p);
  alloc->empty_cache();  // unmaps after synchronizing the stream
  void* again = alloc->allocate(64 * MiB, s.id());  // maps pages again
  check_device_memory(again, 64 * MiB, s.get());
  alloc->deallocate(again);
  alloc->check_invariants();
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("real: sleep gives the GPU its memory back, keeping contents, and wake maps usable pages at the same addresses",
          "[cuda][real][vmm][sleep]") {
  Env env;
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (const std::size_t n : {std::size_t{1000}, 3 * MiB + 7, 300 * MiB, 2 * GiB}) {
    void* p = alloc->allocate(n, s.id());
    check_device_memory(p, n, s.get());
    blocks.emplace_back(p, n);
  }
  std::size_t free_before = 0;
  std::size_t total = 0;
  TP_CUDA_OK(cudaMemGetInfo(&free_before, &total));
  const auto t0 = std::chrono::steady_clock::now();
  const SleepReport r = alloc->sleep(Contents::keep);  // each block holds 0x5b (check_device_memory)
  const auto t1 = std::chrono::steady_clock::now();
  std::size_t free_asleep = 0;
  TP_CUDA_OK(cudaMemGetInfo(&free_asleep, &total));
  REQUIRE(free_asleep >= free_before + r.asleep_bytes);
  REQUIRE(r.asleep_blocks == blocks.size());
  alloc->check_invariants();
  const auto t2 = std::chrono::steady_clock::now();
  alloc->wake();
  const auto t3 = std::chrono::steady_clock::now();
  const double gib = static_cast<double>(r.asleep_bytes) / static_cast<double>(GiB);
  std::printf("real sleep/wake: %.2f GiB asleep; sleep %.2f ms/GiB, wake %.2f ms/GiB\n", gib,
              std::chrono::duration<double, std::milli>(t1 - t0).count() / gib,
              std::chrono::duration<double, std::milli>(t3 - t2).count() / gib);
  for (const auto& [p, n] : blocks) {
    REQUIRE_FALSE(alloc->is_asleep(p));
    std::vector<unsigned char> kept(n);
    TP_CUDA_OK(cudaMemcpy(kept.data(), p, n, cudaMemcpyDeviceToHost));
    REQUIRE(all_bytes(kept, 0x5b));      // the contents came back
    check_device_memory(p, n, s.get());  // the same addresses, new pages the GPU reads and writes
  }
  for (const auto& [p, n] : blocks) alloc->deallocate(p);
  alloc->check_invariants();
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("real: a staging buffer reused after its copy finished holds the copied data",
          "[cuda][real][pinned]") {
  Env env;
  CudaStream compute;
  CudaStream copy;
  auto staging = make_allocator(make_cuda_backend(CudaBackendKind::pinned_host, 0));
  auto device = make_allocator(make_cuda_backend(CudaBackendKind::async_pool, 0));
  const std::size_t n = 8 * MiB;
  void* dst = device->allocate(n, copy.id());
  void* buf = staging->allocate(n, compute.id());
  std::memset(buf, 0x11, n);
  TP_CUDA_OK(cudaMemcpyAsync(dst, buf, n, cudaMemcpyHostToDevice, copy.get()));
  staging->record_stream(buf, copy.id());
  staging->deallocate(buf);
  void* next = staging->allocate(n, compute.id());  // buf only if the copy already finished
  std::memset(next, 0x22, n);
  TP_CUDA_OK(cudaStreamSynchronize(copy.get()));
  std::vector<unsigned char> back(n);
  TP_CUDA_OK(cudaMemcpy(back.data(), dst, n, cudaMemcpyDeviceToHost));
  REQUIRE(all_bytes(back, 0x11));  // the copy never saw the second fill
  staging->deallocate(next);
  device->deallocate(dst);
}

TEST_CASE("real: device out of memory goes through the ladder and leaves no error",
          "[cuda][real][oom]") {
  Env env;
  for (const CudaBackendKind kind :
       {CudaBackendKind::async_pool, CudaBackendKind::malloc, CudaBackendKind::vmm}) {
    DYNAMIC_SECTION(to_string(kind)) {
      auto backend = make_cuda_backend(kind, 0);
      auto alloc = make_allocator(backend, Config::parse("mode:fixed"));  // fixed segments everywhere
      const std::size_t g = backend->properties().segment_granularity;
      const std::size_t free = backend->free_memory();
      const std::size_t big = free / 4 * 3 / g * g;
      const std::size_t half = free / 2 / g * g;
      void* p = alloc->allocate(big);
      REQUIRE(p != nullptr);
      REQUIRE_THROWS_AS(alloc->allocate(half), OutOfMemoryError);
      REQUIRE(alloc->stats().upstream_alloc_failures >= 1);
      REQUIRE(cudaPeekAtLastError() == cudaSuccess);
      alloc->check_invariants();
      alloc->deallocate(p);
      void* q = alloc->allocate(half);  // served from the cached segment
      REQUIRE(q == p);
      check_device_memory(q, 64 * MiB, nullptr);
      alloc->deallocate(q);
      alloc->empty_cache();
      REQUIRE(cudaPeekAtLastError() == cudaSuccess);
    }
  }
}

TEST_CASE("real: a graph captured in global mode is served from its pool, and its replays write the pool's blocks",
          "[cuda][real][graphs]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  if (kind == CudaBackendKind::pinned_host) return;  // kernels need device memory here
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  const GraphPool pool = alloc->begin_capture(s.id(), 64 * MiB);
  TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  void* scratch = alloc->allocate(8 * MiB, s.id());
  TP_CUDA_OK(cudaMemsetAsync(scratch, 0, 8 * MiB, s.get()));
  alloc->deallocate(scratch);  // back to the pool: the next block may reuse it, in stream order
  void* out = alloc->allocate(20 * MiB, s.id());
  TP_CUDA_OK(cudaMemsetAsync(out, 0x10, 20 * MiB, s.get()));
  TP_CUDA_OK(tp_real_add_one(out, 20 * MiB, s.get()));
  cudaGraph_t graph = nullptr;
  TP_CUDA_OK(cudaStreamEndCapture(s.get(), &graph));  // valid: the allocator called nothing
  alloc->end_capture(s.id());
  cudaGraphExec_t exec = nullptr;
  TP_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    TP_CUDA_OK(cudaGraphLaunch(exec, s.get()));
    TP_CUDA_OK(cudaStreamSynchronize(s.get()));
    std::vector<unsigned char> back(20 * MiB);
    TP_CUDA_OK(cudaMemcpy(back.data(), out, back.size(), cudaMemcpyDeviceToHost));
    REQUIRE(all_bytes(back, 0x11));
  }
  // Another stream's allocation meanwhile never lands in the pool.
  CudaStream other;
  void* elsewhere = alloc->allocate(20 * MiB, other.id());
  for (const GraphPoolInfo& info : alloc->graph_pools())
    for (const auto& [start, bytes] : info.ranges)
      REQUIRE((address(elsewhere) + 20 * MiB <= start || start + bytes <= address(elsewhere)));
  alloc->deallocate(elsewhere);
  TP_CUDA_OK(cudaGraphExecDestroy(exec));
  TP_CUDA_OK(cudaGraphDestroy(graph));
  alloc->deallocate(out);
  alloc->release_graph(pool);
  REQUIRE(alloc->graph_pools().empty());
  alloc->empty_cache();
  alloc->check_invariants();
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
}

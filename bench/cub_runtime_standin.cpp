// cub_runtime_standin.cpp: a host-only stand-in for the nine CUDA runtime calls that CUB's
// CachingDeviceAllocator makes, each as cheap as a call can be, so that a benchmark of the real
// CUB code over it measures CUB's own bookkeeping (its mutex, its two std::multisets), not a
// driver. Used by bench_vs_cub.cpp only; the binary links no CUDA library.
//
// cudaMalloc hands out increasing, never-dereferenced addresses (bump pointer); cudaFree and the
// event calls do nothing; cudaEventQuery reports every event complete. cudaMalloc and cudaFree
// are counted, so a benchmark can show that its timed loop made no such call.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "cub_runtime_standin.hpp"

namespace {
std::atomic<std::uintptr_t> g_next{std::uintptr_t{1} << 44};
std::atomic<std::uintptr_t> g_next_event{1};
std::atomic<std::uint64_t> g_mallocs{0};
std::atomic<std::uint64_t> g_frees{0};
}  // namespace

namespace cub_standin {
std::uint64_t mallocs() noexcept { return g_mallocs.load(std::memory_order_relaxed); }
std::uint64_t frees() noexcept { return g_frees.load(std::memory_order_relaxed); }
}  // namespace cub_standin

extern "C" {

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int) { return cudaSuccess; }

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t size) {
  const std::uintptr_t bytes = (size + 511) / 512 * 512 + 512;  // distinct, 512-aligned
  *ptr = reinterpret_cast<void*>(g_next.fetch_add(bytes, std::memory_order_relaxed));
  g_mallocs.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void*) {
  g_frees.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(g_next_event.fetch_add(1, std::memory_order_relaxed));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaGetLastError(void) { return cudaSuccess; }

}  // extern "C"

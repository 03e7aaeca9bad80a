// malloc_backend.cpp: CudaMallocBackend (cudaMalloc / cudaFree) and CudaPinnedHostBackend
// (cudaHostAlloc / cudaFreeHost): the two synchronous backends.
//
// Both wait for the segment's stream before freeing: the allocator returns a segment once its
// blocks are free and their other streams' events completed, but work on the owner stream may
// still be in flight, and the implicit synchronization of cudaFree/cudaFreeHost is not a
// documented guarantee.
#include <unistd.h>

#include <algorithm>

#include "cuda_common.hpp"

namespace tensorpool {

using cuda_detail::as_stream;
using cuda_detail::check;
using cuda_detail::DeviceGuard;

// --- CudaMallocBackend ----------------------------------------------------------------------

CudaMallocBackend::CudaMallocBackend(int device) : CudaBackend(device, "cudaMalloc") {}

void* CudaMallocBackend::allocate_segment(std::size_t bytes, Stream) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  if (!cuda_detail::check_alloc(cudaMalloc(&ptr, bytes), "cudaMalloc", device_, bytes))
    return nullptr;
  return ptr;
}

void CudaMallocBackend::free_segment(void* ptr, std::size_t bytes, Stream stream) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_);
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize", device_);
    check(cudaFree(ptr), "cudaFree", device_, bytes);
  });
}

// --- CudaPinnedHostBackend ------------------------------------------------------------------

namespace {
std::size_t host_pages(int name) {
  const long pages = sysconf(name);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}
}  // namespace

CudaPinnedHostBackend::CudaPinnedHostBackend(int device, std::size_t capacity)
    : CudaBackend(device, "pinned host") {
  props_.capacity = capacity != 0 ? capacity : host_pages(_SC_PHYS_PAGES);
  props_.alignment = 4096;  // cudaHostAlloc returns whole pages
}

std::size_t CudaPinnedHostBackend::free_memory() {
  const std::size_t held = held_.load();
  const std::size_t left = props_.capacity > held ? props_.capacity - held : 0;
  const std::size_t available = host_pages(_SC_AVPHYS_PAGES);
  return available == 0 ? left : std::min(left, available);
}

void* CudaPinnedHostBackend::allocate_segment(std::size_t bytes, Stream) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  // Portable: copies on any device may use the buffer, not only device_'s.
  const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
  if (!cuda_detail::check_alloc(err, "cudaHostAlloc", device_, bytes)) return nullptr;
  held_ += bytes;
  return ptr;
}

void CudaPinnedHostBackend::free_segment(void* ptr, std::size_t bytes, Stream stream) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_);
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize", device_);
    check(cudaFreeHost(ptr), "cudaFreeHost", device_, bytes);
    held_ -= bytes;
  });
}

}  // namespace tensorpool

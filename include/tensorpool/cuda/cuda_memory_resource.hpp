// tensorpool/cuda/cuda_memory_resource.hpp: CudaMemoryResource, an Allocator as a memory
// resource of CCCL's cuda::mr (the <cuda/memory_resource> of the CCCL shipped with the CUDA
// Toolkit), so CCCL- and RMM-style code (cuda::mr::async_resource_ref<device_accessible>, RMM's
// device_async_resource_ref) can take it. Header-only; needs the CCCL and CUDA runtime headers.
//
//   tensorpool::CudaMemoryResource mr(alloc, stream);
//   cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{mr};
//   void* p = ref.allocate_async(bytes, 256, cuda::stream_ref{other_stream});
//
// It models cuda::mr::async_resource_with<device_accessible> (checked below): allocate() and
// deallocate() use the resource's stream; allocate_async() allocates for the given stream, and
// deallocate_async() on a stream other than the allocation's marks the block as used there
// (record_stream) before freeing it, so its reuse waits for that stream's work. Blocks are
// 512-byte aligned at most (a larger alignment throws UsageError). Equal resources share the
// Allocator.
#pragma once

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE  // <cuda/memory_resource> is opt-in in CCCL 2-3
#endif

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>

#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/interop.hpp"
#include "tensorpool/memory_resource.hpp"

namespace tensorpool {

class CudaMemoryResource {
 public:
  explicit CudaMemoryResource(Allocator& alloc, Stream stream = kDefaultStream) noexcept
      : alloc_(&alloc), stream_(stream) {}

  void* allocate(std::size_t bytes, std::size_t alignment) {
    return detail::allocate_aligned(*alloc_, bytes, alignment, stream_, "CudaMemoryResource");
  }
  void deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/) { alloc_->deallocate(p); }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) {
    return detail::allocate_aligned(*alloc_, bytes, alignment, to_stream(stream.get()),
                                    "CudaMemoryResource");
  }
  void deallocate_async(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/, cuda::stream_ref stream) {
    if (p == nullptr) return;
    alloc_->record_stream(p, to_stream(stream.get()));  // no-op on the allocation's own stream
    alloc_->deallocate(p);
  }

  Allocator& allocator() const noexcept { return *alloc_; }
  Stream stream() const noexcept { return stream_; }

  friend bool operator==(const CudaMemoryResource& a, const CudaMemoryResource& b) noexcept {
    return a.alloc_ == b.alloc_;
  }
  friend bool operator!=(const CudaMemoryResource& a, const CudaMemoryResource& b) noexcept {
    return !(a == b);
  }
  /// The memory is device memory.
  friend void get_property(const CudaMemoryResource&, cuda::mr::device_accessible) noexcept {}

 private:
  Allocator* alloc_;  // never null
  Stream stream_;
};

static_assert(cuda::mr::resource_with<CudaMemoryResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<CudaMemoryResource, cuda::mr::device_accessible>);

}  // namespace tensorpool

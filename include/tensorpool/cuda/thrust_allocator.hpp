// tensorpool/cuda/thrust_allocator.hpp: ThrustAllocator, the allocator of Thrust's temporary
// storage, for thrust::cuda::par(alloc).on(stream) (header-only; needs the CUDA runtime headers).
//
//   tensorpool::ThrustAllocator alloc(pool, stream);
//   thrust::sort(thrust::cuda::par(alloc).on(stream), keys.begin(), keys.end());
//
// Thrust asks for bytes (value_type char); the blocks come from the Allocator on the allocator's
// stream, which should be the stream the algorithm runs on. Copies share the Allocator.
#pragma once

#include <cstddef>

#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/interop.hpp"

namespace tensorpool {

class ThrustAllocator {
 public:
  using value_type = char;

  ThrustAllocator(Allocator& alloc, Stream stream) noexcept : alloc_(&alloc), stream_(stream) {}
  ThrustAllocator(Allocator& alloc, cudaStream_t stream) noexcept
      : ThrustAllocator(alloc, to_stream(stream)) {}

  /// Throws OutOfMemoryError (a std::bad_alloc, which Thrust reports) when nothing fits.
  char* allocate(std::ptrdiff_t n) {
    return static_cast<char*>(alloc_->allocate(n > 0 ? static_cast<std::size_t>(n) : 1, stream_));
  }
  /// Throws UsageError for a pointer the allocator did not hand out.
  void deallocate(char* p, std::size_t /*n*/) { alloc_->deallocate(p); }

  Allocator& allocator() const noexcept { return *alloc_; }
  Stream stream() const noexcept { return stream_; }

  friend bool operator==(const ThrustAllocator& a, const ThrustAllocator& b) noexcept {
    return a.alloc_ == b.alloc_;
  }
  friend bool operator!=(const ThrustAllocator& a, const ThrustAllocator& b) noexcept {
    return !(a == b);
  }

 private:
  Allocator* alloc_;  // never null
  Stream stream_;
};

}  // namespace tensorpool

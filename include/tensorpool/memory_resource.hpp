// tensorpool/memory_resource.hpp: PoolMemoryResource, a std::pmr::memory_resource that allocates
// from an Allocator on one stream (header-only).
//
//   tensorpool::PoolMemoryResource mr(alloc, stream);
//   std::pmr::polymorphic_allocator<float> pa(&mr);   // for code written against std::pmr
//
// The memory is the allocator's device's: containers that touch their elements on the host
// (std::pmr::vector) need a host-accessible device (pinned host memory, a test backend). Every
// block is aligned to alignment() bytes; a larger alignment is refused with UsageError.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory_resource>
#include <string>

#include "tensorpool/allocator.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

namespace detail {

/// The alignment of every block of `alloc`: blocks start at multiples of 512 bytes within
/// segments whose addresses are multiples of the device's alignment.
inline std::size_t block_alignment(const Allocator& alloc) noexcept {
  return std::min(alloc.device().properties().alignment, kMinBlockSize);
}

/// allocate() for the memory-resource adapters: refuses an alignment the blocks do not have
/// (UsageError naming `who`), and gives 0 bytes a distinct pointer too.
inline void* allocate_aligned(Allocator& alloc, std::size_t bytes, std::size_t alignment,
                              Stream stream, const char* who) {
  if (alignment > block_alignment(alloc)) {
    throw UsageError(std::string("tensorpool::") + who + ": alignment " + std::to_string(alignment) +
                     " is larger than the " + std::to_string(block_alignment(alloc)) +
                     " bytes every block has");
  }
  return alloc.allocate(bytes == 0 ? 1 : bytes, stream);
}

}  // namespace detail

class PoolMemoryResource final : public std::pmr::memory_resource {
 public:
  explicit PoolMemoryResource(Allocator& alloc, Stream stream = kDefaultStream) noexcept
      : alloc_(&alloc), stream_(stream) {}

  Allocator& allocator() const noexcept { return *alloc_; }
  Stream stream() const noexcept { return stream_; }
  /// The alignment of every block (detail::block_alignment).
  std::size_t alignment() const noexcept { return detail::block_alignment(*alloc_); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    return detail::allocate_aligned(*alloc_, bytes, alignment, stream_, "PoolMemoryResource");
  }
  void do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/) override {
    alloc_->deallocate(p);
  }
  /// Equal resources free each other's memory: the same allocator (the stream only orders reuse).
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    const auto* o = dynamic_cast<const PoolMemoryResource*>(&other);
    return o != nullptr && o->alloc_ == alloc_;
  }

  Allocator* alloc_;  // never null
  Stream stream_;
};

}  // namespace tensorpool

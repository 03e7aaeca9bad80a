// util.hpp: small helpers shared by the core's source files.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <new>
#include <vector>

#include "tensorpool/types.hpp"

/// For the few helpers of the hot path that must be inlined whatever the optimizer thinks.
#define TP_ALWAYS_INLINE inline __attribute__((always_inline))
/// For branches of the hot path into slow paths.
#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)
/// For the fast path's own branch.
#define TP_LIKELY(x) __builtin_expect(!!(x), 1)

namespace tensorpool::detail {

/// An allocator of whole cache lines, for the containers a thread writes in its fast path: their
/// storage shares no line with what threads on other shards write (false sharing).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::size_t kLine = 64;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new((n * sizeof(T) + kLine - 1) / kLine * kLine, std::align_val_t{kLine}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(static_cast<void*>(p), std::align_val_t{kLine}); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
};

/// Room for `n` elements in `v` (its size and contents are kept), every page of it written once:
/// a vector the fast path appends to must neither reallocate nor take a page fault there (the
/// first touch of a fresh page costs 1-3 us; a record of 8,192 blocks spans 80 pages).
template <class T, class A>
void reserve_resident(std::vector<T, A>& v, std::size_t n) {
  const std::size_t size = v.size();
  if (n <= size) return;
  v.resize(n);
  v.resize(size);
}

/// "0x7e0000200000": how addresses appear in messages.
inline std::string hex(Address a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

}  // namespace tensorpool::detail

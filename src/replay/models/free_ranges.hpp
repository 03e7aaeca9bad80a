// free_ranges.hpp: a coalescing set of free address ranges with best-fit and address-ordered
// first-fit lookup, the free list of the RMM models ("rmm-pool", "rmm-arena"; internal to
// tensorpool::replay, header-only).
//
// Invariants: by_addr_ and by_size_ hold the same ranges; ranges never overlap and two ranges
// never touch (insert() merges touching ones); every size is non-zero; total_ is their sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "tensorpool/types.hpp"

namespace tensorpool::replay::model {

class FreeRanges {
 public:
  struct Range {
    Address addr = 0;
    std::size_t size = 0;
  };

  /// Adds [addr, addr + size), merged with the ranges it touches.
  void insert(Address addr, std::size_t size) {
    if (size == 0) return;
    auto next = by_addr_.lower_bound(addr);
    if (next != by_addr_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == addr) {
        addr = prev->first;
        size += prev->second;
        erase(prev);
      }
    }
    next = by_addr_.lower_bound(addr);
    if (next != by_addr_.end() && next->first == addr + size) {
      size += next->second;
      erase(next);
    }
    by_addr_.emplace(addr, size);
    by_size_.emplace(size, addr);
    total_ += size;
  }

  /// The smallest range of at least `size` bytes (lowest address among equals).
  std::optional<Range> best_fit(std::size_t size) const {
    const auto it = by_size_.lower_bound({size, 0});
    if (it == by_size_.end()) return std::nullopt;
    return Range{it->second, it->first};
  }
  /// The lowest-addressed range of at least `size` bytes.
  std::optional<Range> first_fit(std::size_t size) const {
    for (const auto& [addr, s] : by_addr_)
      if (s >= size) return Range{addr, s};
    return std::nullopt;
  }
  /// Takes `size` bytes from the front of the free range `r` (from best_fit/first_fit).
  void take_front(const Range& r, std::size_t size) {
    erase(by_addr_.find(r.addr));
    if (r.size > size) insert(r.addr + size, r.size - size);
  }
  /// Moves every range of `other` into this set (merging), leaving `other` empty.
  void absorb(FreeRanges& other) {
    for (const auto& [addr, size] : other.by_addr_) insert(addr, size);
    other = FreeRanges{};
  }

  std::size_t total() const noexcept { return total_; }
  /// Calls visit(addr, size) for each range, in address order.
  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (const auto& [addr, size] : by_addr_) visit(addr, size);
  }
  std::size_t largest() const noexcept { return by_size_.empty() ? 0 : std::prev(by_size_.end())->first; }
  bool empty() const noexcept { return by_addr_.empty(); }

 private:
  void erase(std::map<Address, std::size_t>::iterator it) {
    by_size_.erase({it->second, it->first});
    total_ -= it->second;
    by_addr_.erase(it);
  }

  std::map<Address, std::size_t> by_addr_;
  std::set<std::pair<std::size_t, Address>> by_size_;
  std::size_t total_ = 0;
};

}  // namespace tensorpool::replay::model

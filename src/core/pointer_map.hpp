// pointer_map.hpp: address -> Block* for allocated blocks, an open-addressing hash table.
//
// Linear probing with Fibonacci hashing and backward-shift deletion (no tombstones), kept at most
// half full, so a lookup touches one or two cache lines whatever the number of live blocks.
// Key 0 marks an empty slot (0 is never a block address).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/block.hpp"

namespace tensorpool::detail {

class PointerMap {
 public:
  PointerMap() { rehash(1024); }

  std::size_t size() const noexcept { return size_; }

  void insert(Address key, Block* value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }

  Block* find(Address key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  /// Removes `key` and returns its block, or nullptr if absent (nothing changes then).
  Block* erase(Address key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return nullptr;
    }
    Block* value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole when their home
    // position does not lie cyclically in (hole, j].
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool in_range = i <= j ? (h > i && h <= j) : (h > i || h <= j);
      if (!in_range) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {0, nullptr};
    --size_;
    return value;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct Slot {
    Address key = 0;
    Block* value = nullptr;
  };

  std::size_t home(Address key) const noexcept {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64u - static_cast<unsigned>(std::countr_zero(capacity));
    size_ = 0;
    for (const auto& s : old)
      if (s.key != 0) insert(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace tensorpool::detail

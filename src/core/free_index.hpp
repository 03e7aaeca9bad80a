// free_index.hpp: the segregated free lists (TLSF-style) that find a free block in O(1).
//
// One FreeIndex per (stream, kind of block). Bins follow size_classes.hpp: bin (fl, sl) holds
// free blocks whose size lies in [bin_lower, bin_upper). Two bitmaps say which bins are
// non-empty, so the search is a bounded look at the request's own bin, two count-trailing-zeros
// and a bounded look at the bin they find: no step depends on how many blocks are cached.
//
// Invariants (checked by Allocator::check_invariants):
//  - a block is in exactly one list, the one of bins::bin_of(block->size), iff its state is free;
//  - bit sl of sl_map_[fl] is set iff heads_[fl][sl] != nullptr; bit fl of fl_map_ is set iff
//    sl_map_[fl] != 0;
//  - count_ and bytes_ are the number and total size of listed blocks.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/block.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool::detail {

class FreeIndex {
 public:
  /// Blocks a search looks at in one bin: a bounded best fit in the request's own bin, and in
  /// the first non-empty bin above it when the own bin has no fit.
  static constexpr int kOwnBinScan = 4;

  void insert(Block* b) noexcept {
    const bins::Bin bin = bins::bin_of(b->size);
    Block*& head = heads_[bin.fl][bin.sl];
    b->free_prev = nullptr;
    b->free_next = head;
    if (head != nullptr) head->free_prev = b;
    head = b;
    sl_map_[bin.fl] |= 1u << bin.sl;
    fl_map_ |= std::uint64_t{1} << bin.fl;
    ++count_;
    bytes_ += b->size;
  }

  void remove(Block* b) noexcept {
    const bins::Bin bin = bins::bin_of(b->size);
    if (b->free_prev != nullptr) {
      b->free_prev->free_next = b->free_next;
    } else {
      heads_[bin.fl][bin.sl] = b->free_next;
      if (b->free_next == nullptr) clear_bin(bin);
    }
    if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
    b->free_prev = b->free_next = nullptr;
    --count_;
    bytes_ -= b->size;
  }

  /// A free block of at least `size` bytes (a multiple of 512), or nullptr. Not removed.
  Block* find(std::size_t size) const noexcept {
    const bins::Bin own = bins::bin_of(size);
    Block* best = nullptr;
    Block* b = heads_[own.fl][own.sl];
    for (int i = 0; b != nullptr && i < kOwnBinScan; ++i, b = b->free_next) {
      if (b->size >= size && (best == nullptr || b->size < best->size)) {
        best = b;
        if (b->size == size) break;
      }
    }
    if (best != nullptr) return best;
    return smallest_of_first(first_at_or_above(bins::bin_ceil(size)));
  }

  /// The largest listed block (scans the highest non-empty bin only).
  Block* largest() const noexcept {
    if (fl_map_ == 0) return nullptr;
    const unsigned fl = 63u - static_cast<unsigned>(std::countl_zero(fl_map_));
    const unsigned sl = 31u - static_cast<unsigned>(std::countl_zero(sl_map_[fl]));
    Block* best = heads_[fl][sl];
    for (Block* b = best; b != nullptr; b = b->free_next)
      if (b->size > best->size) best = b;
    return best;
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

  /// Calls f(block) for every listed block, bin by bin.
  template <class F>
  void for_each(F&& f) const {
    for (unsigned fl = 0; fl < bins::kFirstLevels; ++fl)
      for (unsigned sl = 0; sl < bins::kSub; ++sl)
        for (Block* b = heads_[fl][sl]; b != nullptr; b = b->free_next) f(b);
  }

  /// Whether the bitmaps agree with the lists (for check_invariants).
  bool bitmaps_consistent() const noexcept {
    for (unsigned fl = 0; fl < bins::kFirstLevels; ++fl) {
      for (unsigned sl = 0; sl < bins::kSub; ++sl) {
        const bool bit = (sl_map_[fl] >> sl) & 1u;
        if (bit != (heads_[fl][sl] != nullptr)) return false;
      }
      if ((((fl_map_ >> fl) & 1u) != 0) != (sl_map_[fl] != 0)) return false;
    }
    return true;
  }

 private:
  // The smallest of the first kOwnBinScan blocks of the list that starts at `head` (all of them
  // fit: a bin above the request's). The head alone (good fit) is the block freed last, which
  // may be larger than one lying next in the same list: splitting it leaves more memory beside
  // the request (docs/benchmarks.md, "Best fit in the bin above").
  static Block* smallest_of_first(Block* head) noexcept {
    Block* best = head;
    int looked = 1;
    for (Block* b = head != nullptr ? head->free_next : nullptr; b != nullptr && looked < kOwnBinScan;
         b = b->free_next, ++looked)
      if (b->size < best->size) best = b;
    return best;
  }

  Block* first_at_or_above(bins::Bin c) const noexcept {
    if (c.fl >= bins::kFirstLevels) return nullptr;
    const std::uint32_t sl = sl_map_[c.fl] & (~std::uint32_t{0} << c.sl);
    if (sl != 0) return heads_[c.fl][std::countr_zero(sl)];
    if (c.fl + 1 >= 64) return nullptr;
    const std::uint64_t fl = fl_map_ & (~std::uint64_t{0} << (c.fl + 1));
    if (fl == 0) return nullptr;
    const unsigned f = static_cast<unsigned>(std::countr_zero(fl));
    return heads_[f][std::countr_zero(sl_map_[f])];
  }

  void clear_bin(bins::Bin bin) noexcept {
    sl_map_[bin.fl] &= ~(1u << bin.sl);
    if (sl_map_[bin.fl] == 0) fl_map_ &= ~(std::uint64_t{1} << bin.fl);
  }

  std::uint64_t fl_map_ = 0;
  std::uint32_t sl_map_[bins::kFirstLevels] = {};
  Block* heads_[bins::kFirstLevels][bins::kSub] = {};
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace tensorpool::detail

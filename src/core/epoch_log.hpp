// epoch_log.hpp: the record a vmm heap keeps of its current epoch, updated inline by the fast path.
//
// An epoch of a heap runs from a moment it has nothing allocated to the next, or, for a heap that
// never empties, from one step boundary (Allocator::step()) to the next: the blocks live when
// it began are then its base, which the epoch's own allocations are planned around. The allocator
// reports every block it hands out of the heap (on_alloc) and every one it makes free again
// (on_release, which says when the heap is left empty); the heap's segment source reads the
// record when the epoch ends, to hold the heap's pages and plan the next epoch's layout
// (vmm_heaps.cpp, layout_plan.hpp). Inline, through Segment::epoch: no call in the fast path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/block.hpp"
#include "core/layout_plan.hpp"
#include "core/util.hpp"

namespace tensorpool::detail {

/// How the free that leaves a heap empty ends its epoch (SegmentSource::epoch_end_of).
enum class EpochEnd : std::uint8_t {
  unknown,    // not asked: end_epoch() finds out
  elsewhere,  // with device calls, the planner or other heaps: in the allocator's exclusive mode
  to_index,   // the epoch's one block, as the one before it: the block goes to the free index
  held,       // its plan repeats in place: the heap's pages are held and the plan followed again
};

struct EpochLog {
  static constexpr std::uint32_t kNoSlot = UINT32_MAX;
  static constexpr std::uint32_t kBaseSlot = UINT32_MAX - 1;  // a base block: live before the epoch

  // Invariants (VmmHeaps::check_epoch): `live` is the number of the heap's blocks that are
  // allocated or pending_free; each of them has an open entry (end == 0) in `entries` at its
  // epoch_slot, or kNoSlot once `entries` held `capacity` entries (then `full`), or kBaseSlot
  // (`base` of them: the blocks live when a step began the epoch); every tick of
  // `clock` is used once (an allocation or a free), so entries' lifetimes are [start, end).
  // `signature` hashes the sizes of all the epoch's allocations in order (FNV-1a), full or not:
  // what names an epoch when the next one's plan is looked up (vmm_heaps.cpp).
  static constexpr std::uint64_t kSignatureSeed = 0xcbf29ce484222325ull;
  std::size_t live = 0;
  std::uint64_t clock = 0;
  std::uint64_t signature = kSignatureSeed;
  std::size_t capacity = 0;  // vmm_plan_max_blocks
  bool full = false;         // the epoch made more allocations than capacity: no plan from it
  std::size_t base = 0;      // live base blocks
  /// Base blocks freed during the epoch (fixed, alive from its start to their free), with room
  /// for every base block (reserved when the epoch begins: no allocation in the fast path).
  std::vector<RecordedBlock> freed_base;
  bool at_step = false;      // the epoch began at a step boundary (else where the heap was empty)
  std::uint64_t base_signature = kSignatureSeed;  // hashes the base's places and sizes (at_step)
  std::uint32_t boundaries = 0;  // step boundaries the epoch went on over
  std::vector<RecordedBlock> entries;
  std::size_t fixed = 0;  // fixed entries at the end of `entries` (VmmHeaps::end_step_epoch)
  std::size_t high = 0;   // the highest end of a block of the epoch (base included), from the heap's start
  /// An end inside the heap (to_index, held) that SegmentSource::epoch_end_of() answered the fast
  /// path's free of the heap's last block, until the end_epoch() of that free reads it (under the
  /// same lock); `unknown` otherwise.
  EpochEnd end_known = EpochEnd::unknown;

  TP_ALWAYS_INLINE void on_alloc(Block* b, Address heap_start) {
    ++live;
    mix(b->size);
    high = std::max<std::size_t>(high, b->addr - heap_start + b->size);
    if (TP_UNLIKELY(entries.size() >= capacity)) {
      full = true;
      b->epoch_slot = kNoSlot;
      return;
    }
    b->epoch_slot = static_cast<std::uint32_t>(entries.size());
    entries.push_back(RecordedBlock{b->size, clock++, 0, b->addr - heap_start});
  }

  /// Folds `value` into the signature (one FNV-1a step).
  TP_ALWAYS_INLINE void mix(std::uint64_t value) { signature = mixed(signature, value); }
  static constexpr std::uint64_t mixed(std::uint64_t hash, std::uint64_t value) {
    return (hash ^ value) * 0x100000001b3ull;
  }

  /// Whether releasing the one live block left would end the epoch.
  TP_ALWAYS_INLINE bool one_live() const noexcept { return live == 1; }

  /// True when the heap has nothing allocated any more.
  TP_ALWAYS_INLINE bool on_release(const Block* b, Address heap_start) {
    if (b->epoch_slot < kBaseSlot) {
      entries[b->epoch_slot].end = clock++;
    } else if (TP_UNLIKELY(b->epoch_slot == kBaseSlot)) {
      --base;  // alive from tick 0, which a step epoch keeps for its base, to this one
      freed_base.push_back(RecordedBlock{b->size, 0, clock++, b->addr - heap_start, true});
    }
    return --live == 0;
  }

  /// The epoch ran from an empty heap to an empty heap with no step boundary inside it: the
  /// whole of what the program did with the heap, which a plan of it lays out.
  bool empty_to_empty() const noexcept { return !at_step && boundaries == 0; }

  /// A new epoch begins (the heap is empty).
  void restart() {
    entries.clear();
    full = false;
    clock = 0;
    signature = kSignatureSeed;
    base = 0;
    freed_base.clear();
    at_step = false;
    base_signature = kSignatureSeed;
    boundaries = 0;
    fixed = 0;
    high = 0;
  }

  /// The epoch's allocations recorded (the entries but the base's, appended as fixed blocks when
  /// a step ends the epoch).
  std::size_t allocations() const noexcept { return entries.size() - fixed; }
};

}  // namespace tensorpool::detail

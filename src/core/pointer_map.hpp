// pointer_map.hpp: address -> Block* for allocated blocks, an open-addressing hash table.
//
// Linear probing with Fibonacci hashing and backward-shift deletion (no tombstones), kept at most
// half full, so a lookup touches one or two cache lines whatever the number of live blocks.
// Key 0 marks an empty slot (0 is never a block address).
//
// Growth never stalls a call: when the table is half full a table twice its size takes the new
// entries, and every insert moves a few entries of the old one over (kMigrationSteps slots), so
// the old table is empty before the new one is half full. Tables come from calloc: the zero pages
// of a large table are the kernel's, faulted in as they are used, not cleared at once. A drained
// table is not freed in the insert that drains it (glibc unmaps a large one: 34-108 us measured on
// a KVM guest) but kept until release_retired() (empty_cache) or the map's end; the tables kept
// are together smaller than the one in use.
// Invariants: old_ is a valid table with no entry before migrated_; the two tables hold
// disjoint keys; size() counts both.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "core/util.hpp"

namespace tensorpool::detail {

class PointerMap {
 public:
  PointerMap() : cur_(Table::make(1024)) { retired_.reserve(64); }  // tables double: 64 is plenty

  std::size_t size() const noexcept { return cur_.size + old_.size; }

  TP_ALWAYS_INLINE void insert(Address key, Block* value) {
    if (TP_UNLIKELY(old_.size != 0)) migrate(kMigrationSteps);
    if (TP_UNLIKELY((cur_.size + 1) * 2 > cur_.capacity())) grow();
    cur_.insert(key, value);
  }

  TP_ALWAYS_INLINE Block* find(Address key) const noexcept {
    if (Block* b = cur_.find(key)) return b;
    return TP_UNLIKELY(old_.size != 0) ? old_.find(key) : nullptr;
  }

  /// Removes `key` and returns its block, or nullptr if absent (nothing changes then).
  TP_ALWAYS_INLINE Block* erase(Address key) noexcept {
    if (Block* b = cur_.erase(key)) return b;
    return TP_UNLIKELY(old_.size != 0) ? old_.erase(key) : nullptr;
  }

  template <class F>
  void for_each(F&& f) const {
    cur_.for_each(f);
    old_.for_each(f);
  }

  /// Frees the drained tables kept since the last call (never from an insert: see the banner).
  void release_retired() noexcept { retired_.clear(); }
  /// The bytes of those tables.
  std::size_t retired_bytes() const noexcept {
    std::size_t bytes = 0;
    for (const Table& t : retired_) bytes += t.capacity() * sizeof(Slot);
    return bytes;
  }

 private:
  // 4 slot steps per insert: the old table (capacity c, c/2 entries) takes at most 1.5c steps to
  // empty, and the new one (2c) takes c/2 inserts to be half full: 2c steps.
  static constexpr int kMigrationSteps = 4;

  struct Slot {
    Address key;
    Block* value;
  };
  struct FreeSlots {
    void operator()(Slot* p) const noexcept { std::free(p); }
  };

  struct Table {
    std::unique_ptr<Slot[], FreeSlots> slots;
    std::size_t mask = 0;  // capacity - 1 (a power of two), or 0 with no slots
    unsigned shift = 64;
    std::size_t size = 0;

    static Table make(std::size_t capacity) {
      void* p = std::calloc(capacity, sizeof(Slot));  // all keys 0: empty
      if (p == nullptr) throw std::bad_alloc();
      Table t;
      t.slots.reset(static_cast<Slot*>(p));
      t.mask = capacity - 1;
      t.shift = 64u - static_cast<unsigned>(std::countr_zero(capacity));
      return t;
    }
    std::size_t capacity() const noexcept { return slots ? mask + 1 : 0; }
    std::size_t home(Address key) const noexcept {
      return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift);
    }
    TP_ALWAYS_INLINE void insert(Address key, Block* value) noexcept {
      std::size_t i = home(key);
      while (slots[i].key != 0) i = (i + 1) & mask;
      slots[i] = {key, value};
      ++size;
    }
    TP_ALWAYS_INLINE Block* find(Address key) const noexcept {
      for (std::size_t i = home(key);; i = (i + 1) & mask) {
        if (slots[i].key == key) return slots[i].value;
        if (slots[i].key == 0) return nullptr;
      }
    }
    TP_ALWAYS_INLINE Block* erase(Address key) noexcept {
      std::size_t i = home(key);
      for (;; i = (i + 1) & mask) {
        if (slots[i].key == key) break;
        if (slots[i].key == 0) return nullptr;
      }
      return erase_at(i);
    }
    // Backward shift: later entries of the probe run move into the hole when their home position
    // does not lie cyclically in (hole, j]. Entries only move towards their home.
    Block* erase_at(std::size_t i) noexcept {
      Block* value = slots[i].value;
      for (std::size_t j = (i + 1) & mask; slots[j].key != 0; j = (j + 1) & mask) {
        const std::size_t h = home(slots[j].key);
        const bool in_range = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!in_range) {
          slots[i] = slots[j];
          i = j;
        }
      }
      slots[i] = {0, nullptr};
      --size;
      return value;
    }
    template <class F>
    void for_each(F&& f) const {
      for (std::size_t i = 0; i < capacity(); ++i)
        if (slots[i].key != 0) f(slots[i].key, slots[i].value);
    }
  };

  __attribute__((noinline)) void grow() {
    migrate(SIZE_MAX);  // only if inserts outran the migration: never with kMigrationSteps
    old_ = std::exchange(cur_, Table::make(cur_.capacity() * 2));
    migrated_ = 0;
  }

  // Moves entries of old_ to cur_ from slot migrated_ on, `steps` slots at most (a move or a
  // skip each); an entry moved out may pull a later one into its slot, which is looked at again.
  __attribute__((noinline)) void migrate(std::size_t steps) noexcept {
    for (; steps != 0 && old_.size != 0; --steps) {
      const std::size_t i = migrated_ & old_.mask;
      const Address key = old_.slots[i].key;
      if (key == 0) {
        ++migrated_;
        continue;
      }
      cur_.insert(key, old_.erase_at(i));
    }
    if (old_.size == 0 && old_.slots) retired_.push_back(std::exchange(old_, Table{}));
  }

  Table cur_;
  Table old_;              // draining into cur_ while size != 0
  std::size_t migrated_ = 0;
  std::vector<Table> retired_;  // drained tables, freed by release_retired() or the destructor
};

}  // namespace tensorpool::detail

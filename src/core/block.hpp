// block.hpp: blocks and segments, the allocator's unit of bookkeeping, and the pool of Block
// objects with the two operations that cut a block in two and merge two back.
//
// A segment is one address range [addr, addr + size) that a segment source handed to the
// allocator: one device allocation (fixed segments), or one reserved range partly mapped with
// physical chunks (a vmm heap). Its blocks tile it exactly, in address order through prev/next.
// Invariants (checked by Allocator::check_invariants):
//  - first->addr == segment->addr; b->next->addr == b->addr + b->size; the sizes sum to size;
//  - no two address-adjacent blocks with the same `mapped` and `held` are both free (frees
//    coalesce at once), but for a shard's seam (shards.hpp): two free twins kept apart between
//    two fast-path calls;
//  - every block's size is a multiple of kMinBlockSize; blocks == number of blocks;
//  - a block of an oversize segment is never split (blocks == 1);
//  - a block with mapped == false is free and lies in a heap;
//  - an asleep block lies in a heap's sleeping chunk: allocated, or free and unmapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "core/util.hpp"
#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::detail {

struct Segment;
struct StreamState;
class FreeIndex;
struct EpochLog;
struct Heap;

struct Block {
  Address addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;       // user's size while allocated or pending_free, else 0
  Segment* segment = nullptr;
  Block* prev = nullptr;           // address-order neighbours in the segment
  Block* next = nullptr;
  Block* free_prev = nullptr;      // bin links while free; pool free list while unused
  Block* free_next = nullptr;
  BlockState state = BlockState::free;
  bool mapped = true;              // physical memory lies under the whole block (false: a vmm hole)
  bool held = false;               // free and mapped, but kept out of the free index: a vmm
                                   // heap's held pages (vmm_heaps.cpp, end_epoch()); never in fixed mode
  bool lent = false;               // allocated, but by no user: its whole pages are mapped again in
                                   // a stitched range of its vmm heap (vmm_stitch.cpp), until that
                                   // range is unmapped; never merged, in no index
  bool asleep = false;             // its pages were released by sleep() and come back at wake()
                                   // (vmm_sleep.cpp): allocated, or free with mapped == false and
                                   // in no index and no unmapped list
  std::uint32_t pending_events = 0;  // outstanding stream events while pending_free
  std::uint32_t epoch_slot = UINT32_MAX;  // while allocated in a vmm heap: its entry in the
                                          // heap's EpochLog (UINT32_MAX: none)
  bool from_seam = false;          // while allocated: handed out whole from its shard's seam
                                   // (shards.hpp), so its free keeps the seam
  std::vector<Stream>* uses = nullptr;  // streams other than the owner's that used the block
  std::uint64_t born = 0;  // while allocated: its pool's Shard::handed_out when it was handed out
  const void* freed_by = nullptr;  // while free: the thread whose fast-path free left it so (an
                                   // address of that thread's: allocator.cpp); null: unknown (a
                                   // growth, a split, or a free outside the fast path)
};

/// Whether the program holds b (allocated or waiting for its stream events): not free, and not
/// lent by a vmm heap to a stitched range (vmm_stitch.cpp). What a heap's epoch record counts.
inline bool held_by_program(const Block* b) noexcept { return b->state != BlockState::free && !b->lent; }

/// Which FreeIndex of a stream a segment's free blocks go to.
enum IndexKind : int { kSmallIndex = 0, kLargeIndex = 1, kOversizeIndex = 2, kNumIndexKinds = 3 };

struct alignas(64) Segment {  // a cache line of its own: segments of other streams change side by side
  Address addr = 0;
  std::size_t size = 0;
  StreamState* owner = nullptr;  // the stream whose free index holds this segment's free blocks
  FreeIndex* index = nullptr;    // &owner->index[kind]
  Pool pool = Pool::large;
  bool oversize = false;
  EpochLog* epoch = nullptr;     // a vmm heap's record of its epoch (epoch_log.hpp), else null
  Heap* vmm = nullptr;           // the vmm heap it is (vmm_heaps.hpp: a reserved range, mapped
                                 // only where chunks lie), else null
  std::size_t blocks = 1;
  Block* first = nullptr;

  /// Free bytes in it sit next to used (or unmapped) space: "inactive split" memory.
  bool is_heap() const noexcept { return vmm != nullptr; }
  bool is_split() const noexcept { return blocks > 1 || is_heap(); }
  bool is_free() const noexcept { return blocks == 1 && first->state == BlockState::free && !is_heap(); }
  Address end() const noexcept { return addr + size; }
};

/// Recycles Block objects so the hot path never calls operator new, and cuts and merges blocks
/// (every split and merge of the hot path goes through split_at and absorb_next: inline).
class BlockPool {
 public:
  Block* acquire() {
    Block* b = take_storage();
    *b = Block{};
    return b;
  }
  void release(Block* b) noexcept {
    delete b->uses;
    b->uses = nullptr;
    b->free_next = free_;
    free_ = b;
  }

  /// Cuts b after `offset` bytes; the new block (returned) has b's state and mapping. No index
  /// is touched.
  TP_ALWAYS_INLINE Block* split_at(Block* b, std::size_t offset) {
    Block* rest = take_storage();
    *rest = Block{.addr = b->addr + offset,
                  .size = b->size - offset,
                  .segment = b->segment,
                  .prev = b,
                  .next = b->next,
                  .state = b->state,
                  .mapped = b->mapped};
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = offset;
    ++b->segment->blocks;
    return rest;
  }

  /// b swallows its successor (adjacent in b's segment, in no index, no free set): the
  /// successor's bytes join b and its Block comes back here.
  TP_ALWAYS_INLINE void absorb_next(Block* b) noexcept {
    Block* n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    --b->segment->blocks;
    release(n);
  }

 private:
  // Storage comes in chunks of kChunk Blocks, constructed one at a time as they are first used
  // (a bump pointer): a chunk's pages are faulted in one by one over many calls, never all in
  // the call that needs a new chunk.
  static constexpr std::size_t kChunk = 512;
  static_assert(std::is_trivially_destructible_v<Block>, "chunks are freed as raw storage");
  // Chunks take whole cache lines: a pool's Blocks share no line with anything else, since
  // pools of different shards (shards.hpp) are used by threads side by side.
  struct FreeStorage {
    void operator()(Block* p) const noexcept { CacheLineAllocator<Block>{}.deallocate(p, kChunk); }
  };
  // A Block to be assigned whole: one released before, or fresh storage.
  TP_ALWAYS_INLINE Block* take_storage() {
    if (TP_UNLIKELY(free_ == nullptr)) return fresh();
    Block* b = free_;
    free_ = b->free_next;
    return b;
  }
  __attribute__((noinline)) Block* fresh() {
    if (bump_ == bump_end_) {
      chunks_.emplace_back(CacheLineAllocator<Block>{}.allocate(kChunk));
      bump_ = chunks_.back().get();
      bump_end_ = bump_ + kChunk;
    }
    return ::new (static_cast<void*>(bump_++)) Block{};
  }
  std::vector<std::unique_ptr<Block, FreeStorage>> chunks_;
  Block* bump_ = nullptr;      // the next never-used Block of the last chunk
  Block* bump_end_ = nullptr;  // the end of the last chunk
  Block* free_ = nullptr;      // released Blocks, linked through free_next
};

}  // namespace tensorpool::detail

// block.hpp: blocks and segments, the allocator's unit of bookkeeping.
//
// A segment is one upstream allocation [addr, addr + size). Its blocks tile it exactly, in
// address order through prev/next. Invariants (checked by Allocator::check_invariants):
//  - first->addr == segment->addr; b->next->addr == b->addr + b->size; the sizes sum to size;
//  - no two address-adjacent blocks are both free (frees coalesce at once);
//  - every block's size is a multiple of kMinBlockSize; blocks == number of blocks;
//  - a block of an oversize segment is never split (blocks == 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "tensorpool/device.hpp"
#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::detail {

struct Segment;
struct StreamState;
class FreeIndex;

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
  bool mapped = true;              // virtual-memory mode: physical pages lie under the whole block
  std::uint32_t pending_events = 0;  // outstanding stream events while pending_free
  std::vector<Stream>* uses = nullptr;  // streams other than the owner's that used the block
};

/// Virtual-memory mode: a physical allocation (one cuMemCreate handle) of whole pages.
struct Chunk {
  Address addr = 0;  // where it is mapped (0 while unmapped, in the allocator's cache)
  std::size_t size = 0;
  PhysicalHandle handle = 0;
  Pool pool = Pool::large;
  Address end() const noexcept { return addr + size; }
};

/// Virtual-memory mode: the mapping state of one heap (a segment spanning a reserved address
/// range). Invariants: chunks do not overlap and lie inside the range; every page of a block
/// with mapped == true lies in a chunk; a block with mapped == false is free, page-aligned at
/// both ends, intersects no chunk, and is in `unmapped`.
struct Heap {
  std::map<Address, Chunk> chunks;     // mapped chunks by address
  std::map<Address, Block*> unmapped;  // free blocks without pages, by address
};

/// Which FreeIndex of a stream a segment's free blocks go to.
enum IndexKind : int { kSmallIndex = 0, kLargeIndex = 1, kOversizeIndex = 2, kNumIndexKinds = 3 };

struct Segment {
  Address addr = 0;
  std::size_t size = 0;
  StreamState* owner = nullptr;  // the stream whose free index holds this segment's free blocks
  FreeIndex* index = nullptr;    // &owner->index[kind]
  Pool pool = Pool::large;
  bool oversize = false;
  std::size_t blocks = 1;
  Block* first = nullptr;
  std::unique_ptr<Heap> heap;    // virtual-memory mode only: this segment is a heap

  bool is_split() const noexcept { return blocks > 1 || heap != nullptr; }
  bool is_free() const noexcept { return blocks == 1 && first->state == BlockState::free && !heap; }
  Address end() const noexcept { return addr + size; }
};

/// Recycles Block objects so the hot path never calls operator new.
class BlockPool {
 public:
  Block* acquire() {
    if (free_ == nullptr) grow();
    Block* b = free_;
    free_ = b->free_next;
    *b = Block{};
    return b;
  }
  void release(Block* b) noexcept {
    delete b->uses;
    b->uses = nullptr;
    b->free_next = free_;
    free_ = b;
  }

 private:
  static constexpr std::size_t kChunk = 512;
  void grow() {
    chunks_.push_back(std::make_unique<Block[]>(kChunk));
    Block* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) {
      chunk[i].free_next = free_;
      free_ = &chunk[i];
    }
  }
  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_ = nullptr;
};

}  // namespace tensorpool::detail

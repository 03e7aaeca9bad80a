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
#include <memory>
#include <vector>

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
  std::uint32_t pending_events = 0;  // outstanding stream events while pending_free
  std::vector<Stream>* uses = nullptr;  // streams other than the owner's that used the block
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

  bool is_split() const noexcept { return blocks > 1; }
  bool is_free() const noexcept { return blocks == 1 && first->state == BlockState::free; }
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

// vmm_check.cpp: the invariants of the vmm heaps (vmm_heaps.hpp), for Allocator::check_invariants:
// every segment is a heap, each heap's chunks, mapped and unmapped blocks, held pages and epoch
// record agree with each other, and the reserved bytes and segments per pool are recounted from
// the chunks (mapped and cached).
#include <algorithm>
#include <iterator>
#include <string>

#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

void VmmHeaps::check(Recount& rc) const {
  std::size_t heap_segments = 0;
  for (const auto& [addr, seg] : st_.segments) {
    if (!seg->is_heap()) invariant_failed("segment " + hex(addr) + " is not a heap, but the mode is vmm");
    ++heap_segments;
  }
  if (heap_segments != heaps_.size()) invariant_failed("the heaps and the segments disagree");
  for (const auto& [base, heap] : heaps_) {
    auto it = st_.segments.find(base);
    if (it == st_.segments.end() || it->second.get() != heap.segment)
      invariant_failed("heap at " + hex(base) + " is not a segment of the allocator");
    if (heap_of(*heap.segment->owner, heap.pool()) != &heap || heap.segment->vmm != &heap)
      invariant_failed("heap at " + hex(base) + " is not its stream's heap of its pool, or its segment's");
    check_heap(heap);
    for (const Chunk& c : heap.sleeping) {
      if (c.handle != 0 || c.addr % page_ != 0 || c.size % page_ != 0)
        invariant_failed("sleeping chunk at " + hex(c.addr) + " holds a handle or is not page-aligned");
      auto next = heap.chunks.lower_bound(c.addr);
      if (next != heap.chunks.end() && next->first < c.end())
        invariant_failed("sleeping chunk at " + hex(c.addr) + " overlaps a mapped chunk");
      if (next != heap.chunks.begin() && std::prev(next)->second.end() > c.addr)
        invariant_failed("sleeping chunk at " + hex(c.addr) + " overlaps a mapped chunk");
    }
    if (!heap.sleeping.empty() && !heap.asleep) invariant_failed("an awake heap has sleeping chunks");
    std::size_t asleep_blocks = 0;
    std::size_t asleep_bytes = 0;
    for (const Block* b = heap.segment->first; b != nullptr; b = b->next)
      if (b->asleep && b->state != BlockState::free) {
        ++asleep_blocks;
        asleep_bytes += b->size;
      }
    for (const auto& [addr, k] : heap.kept) {
      const Block* b = st_.find_live(addr);
      if (b == nullptr || !b->asleep || b->segment != heap.segment || k.bytes != b->requested || k.host == nullptr)
        invariant_failed("kept contents at " + hex(addr) + " belong to no live asleep block of the heap");
    }
    if (asleep_blocks != heap.asleep_blocks || asleep_bytes != heap.asleep_allocated)
      invariant_failed("the heap at " + hex(base) + " counts " + std::to_string(heap.asleep_blocks) +
                       " asleep blocks of " + std::to_string(heap.asleep_allocated) + " bytes; they are " +
                       std::to_string(asleep_blocks) + " of " + std::to_string(asleep_bytes));
    for (const auto& [a, c] : heap.chunks) {
      if (c.stitched()) continue;  // its memory is its owner's
      rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
      rc.add(c.pool, Metric::segments, 1);
    }
  }
  for (const Chunk& c : cached_.chunks()) {
    if (c.addr != 0) invariant_failed("a cached chunk claims to be mapped");
    rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
    rc.add(c.pool, Metric::segments, 1);
  }
}

// Mapping consistency of a heap: chunks are page-aligned, inside the range, disjoint and each
// within the heap's own pool; mapped blocks lie on chunks and unmapped ones off them; the held
// pages are listed and counted.
void VmmHeaps::check_heap(const Heap& h) const {
  const Segment& seg = *h.segment;
  Address prev_end = seg.addr;
  for (const auto& [a, c] : h.chunks) {
    if (a != c.addr || c.addr % page_ != 0 || c.size == 0 || c.size % page_ != 0)
      invariant_failed("chunk at " + hex(c.addr) + " is not page-aligned");
    if (c.addr < prev_end || c.end() > seg.end())
      invariant_failed("chunk at " + hex(c.addr) + " overlaps or leaves the heap");
    if (c.pool != seg.pool) invariant_failed("chunk at " + hex(c.addr) + " belongs to the other pool");
    prev_end = c.end();
  }
  std::size_t chunk_bytes = 0;
  Address prefix_end = seg.addr;
  for (const auto& [a, c] : h.chunks) {
    chunk_bytes += c.size;
    if (c.addr == prefix_end) prefix_end = c.end();
  }
  if (chunk_bytes != h.chunk_bytes || prefix_end - seg.addr != h.mapped_prefix)
    invariant_failed("the heap at " + hex(seg.addr) + " counts " + std::to_string(h.chunk_bytes) + " bytes of chunks, " +
                     std::to_string(h.mapped_prefix) + " mapped from its start; they are " +
                     std::to_string(chunk_bytes) + " and " + std::to_string(prefix_end - seg.addr));
  const Address top = h.chunks.empty() ? 0 : std::prev(h.chunks.end())->second.end();
  if (top != h.mapped_end)
    invariant_failed("the heap at " + hex(seg.addr) + " says its chunks end at " + hex(h.mapped_end) + ", not " + hex(top));
  std::size_t unmapped = 0;
  std::size_t held = 0;
  std::size_t held_bytes = 0;
  auto chunk_at = [&](Address addr) -> const Chunk* {  // the chunk covering addr, if any
    auto it = h.chunks.upper_bound(addr);
    if (it == h.chunks.begin()) return nullptr;
    --it;
    return addr < it->second.end() ? &it->second : nullptr;
  };
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    if (b->asleep) {
      check_asleep(h, b);
      continue;
    }
    if (b->held) {
      ++held;
      held_bytes += b->size;
      if (h.held.find(b->addr) != b)
        invariant_failed("held block " + hex(b->addr) + " is not listed");
      if (b->next != nullptr && b->next->held) invariant_failed("held blocks at " + hex(b->addr) + " were not merged");
    }
    if (b->mapped) {
      // Every page under the block is mapped: walk the chunks across it.
      for (Address at = b->addr; at < b->addr + b->size;) {
        const Chunk* c = chunk_at(at);
        if (c == nullptr) invariant_failed("block " + hex(b->addr) + " spans an unmapped page at " + hex(at));
        at = c->end();
      }
    } else {
      ++unmapped;
      if (b->addr % page_ != 0 || b->size % page_ != 0)
        invariant_failed("unmapped block " + hex(b->addr) + " is not page-aligned");
      auto it = h.chunks.lower_bound(b->addr);
      if (chunk_at(b->addr) != nullptr || (it != h.chunks.end() && it->first < b->addr + b->size))
        invariant_failed("unmapped block " + hex(b->addr) + " overlaps a chunk");
      auto u = h.unmapped.find(b->addr);
      if (u == h.unmapped.end() || u->second != b) invariant_failed("unmapped block " + hex(b->addr) + " is not listed");
    }
  }
  if (unmapped != h.unmapped.size()) invariant_failed("the heap's unmapped list has stale entries");
  check_stitched(h);
  if (held != h.held.blocks().size()) invariant_failed("the heap's held list has stale entries");
  if (held_bytes != h.held.bytes()) invariant_failed("the heap's held byte count is wrong");
  check_epoch(h);
}

// Stitching (vmm_stitch.cpp): each stitched chunk maps again the pages of one lent block, of its
// size, inside a chunk of its own handle; every lent block is listed, and no block is lent that
// no stitched chunk maps.
void VmmHeaps::check_stitched(const Heap& h) const {
  std::size_t stitched = 0;
  for (const auto& [a, c] : h.chunks) {
    if (!c.stitched()) continue;
    ++stitched;
    const auto lent = h.lent.find(c.lent_at);
    if (lent == h.lent.end() || lent->second->size != c.size || !lent->second->lent)
      invariant_failed("stitched chunk at " + hex(c.addr) + " maps no lent block of its size");
    auto owner = h.chunks.upper_bound(c.lent_at);
    if (owner == h.chunks.begin() || (--owner)->second.stitched() || owner->second.handle != c.handle ||
        owner->second.addr + c.offset != c.lent_at || c.lent_at + c.size > owner->second.end())
      invariant_failed("stitched chunk at " + hex(c.addr) + " is not the part of its owner's handle it lends");
  }
  std::size_t lent = 0;
  for (const Block* b = h.segment->first; b != nullptr; b = b->next) {
    if (!b->lent) continue;
    ++lent;
    if (b->state != BlockState::allocated || !b->mapped || b->held || b->asleep || h.lent.find(b->addr) == h.lent.end())
      invariant_failed("lent block " + hex(b->addr) + " is not an allocated, mapped, listed block");
  }
  if (h.stitched_chunks.size() != stitched ||
      std::any_of(h.stitched_chunks.begin(), h.stitched_chunks.end(), [&h](Address at) {
        const auto c = h.chunks.find(at);
        return c == h.chunks.end() || !c->second.stitched();
      }))
    invariant_failed("the heap at " + hex(h.segment->addr) + " lists " + std::to_string(h.stitched_chunks.size()) +
                     " stitched chunks, not its " + std::to_string(stitched));
  if (lent != stitched || lent != h.lent.size())
    invariant_failed("the heap at " + hex(h.segment->addr) + " has " + std::to_string(lent) + " lent blocks, " +
                     std::to_string(h.lent.size()) + " listed, for " + std::to_string(stitched) + " stitched chunks");
}

// An asleep block (vmm_sleep.cpp) lies on the heap's sleeping chunks; a free one has no pages,
// is in no list and has no asleep free neighbour.
void VmmHeaps::check_asleep(const Heap& h, const Block* b) const {
  for (Address at = b->addr; at < b->addr + b->size;) {
    auto it = std::upper_bound(h.sleeping.begin(), h.sleeping.end(), at,
                               [](Address a, const Chunk& c) { return a < c.addr; });
    if (it == h.sleeping.begin() || (--it)->end() <= at)
      invariant_failed("asleep block " + hex(b->addr) + " leaves its heap's sleeping chunks at " + hex(at));
    at = it->end();
  }
  if (b->held) invariant_failed("asleep block " + hex(b->addr) + " is held");
  if (b->state != BlockState::free) return;
  if (b->mapped) invariant_failed("asleep free block " + hex(b->addr) + " claims pages");
  if (h.unmapped.count(b->addr) != 0) invariant_failed("asleep free block " + hex(b->addr) + " is listed unmapped");
  if (b->next != nullptr && b->next->asleep && b->next->state == BlockState::free)
    invariant_failed("asleep free blocks at " + hex(b->addr) + " were not merged");
}

// The epoch's record: `live` counts the blocks in use; each has its open entry in the log (or
// none, past vmm_plan_max_blocks); the stream reads the heap's own plan state; a heap that
// follows its plan has steps left.
void VmmHeaps::check_epoch(const Heap& h) const {
  const Segment& seg = *h.segment;
  const EpochLog& log = h.epoch;
  if (!h.recording) {
    if (seg.epoch != nullptr || log.live != 0 || !log.entries.empty() || h.cursor.state() != PlanState::recording ||
        h.asleep || h.give_back_event != 0 || !h.held.empty())
      invariant_failed("the heap at " + hex(seg.addr) +
                       " records nothing but keeps an epoch, a plan, an event or held pages");
    return;
  }
  if (seg.epoch != &log) invariant_failed("the heap at " + hex(seg.addr) + " does not point to its epoch record");
  std::size_t in_use = 0;
  std::size_t open = 0;
  std::size_t base = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    if (!held_by_program(b)) continue;
    ++in_use;
    if (b->epoch_slot == EpochLog::kBaseSlot) {
      ++base;
      continue;
    }
    if (b->epoch_slot == EpochLog::kNoSlot) {
      if (!log.full) invariant_failed("block " + hex(b->addr) + " is missing from its heap's epoch record");
      continue;
    }
    if (b->epoch_slot >= log.entries.size() || log.entries[b->epoch_slot].end != 0 ||
        log.entries[b->epoch_slot].start >= log.clock || log.entries[b->epoch_slot].size != b->size)
      invariant_failed("block " + hex(b->addr) + " has no open entry in its heap's epoch record");
    ++open;
  }
  if (in_use != log.live)
    invariant_failed("the heap at " + hex(seg.addr) + " counts " + std::to_string(log.live) + " blocks in use, not " +
                     std::to_string(in_use));
  if (base != log.base || (base != 0 && !log.at_step) || log.fixed != 0)
    invariant_failed("the heap at " + hex(seg.addr) + " counts " + std::to_string(log.base) +
                     " blocks live since its epoch began at a step, not " + std::to_string(base));
  std::size_t open_entries = 0;
  for (const RecordedBlock& e : log.entries) open_entries += e.end == 0 ? 1 : 0;
  if (open_entries != open) invariant_failed("the heap's epoch record has stale open entries");
  if (log.entries.size() > log.capacity) invariant_failed("the heap's epoch record is too long");
  if (log.end_known != EpochEnd::unknown)
    invariant_failed("the heap's epoch record keeps an answer of epoch_end_of() no free read");
  if (h.plans.recount_steps() != h.plans.steps()) invariant_failed("the heap's count of stored plan steps is wrong");
  if (seg.owner->plan_state[static_cast<int>(seg.pool)] != h.cursor.state_address())
    invariant_failed("the stream of the heap at " + hex(seg.addr) + " does not read the heap's plan state");
  const PlanCursor& c = h.cursor;
  if (c.state() == PlanState::following && (c.plan() == nullptr || c.next() >= c.plan()->steps.size()))
    invariant_failed("the heap at " + hex(seg.addr) + " follows a plan with no step left");
  if ((c.state() == PlanState::laying_out) != (h.layout_event != 0) ||
      (c.state() == PlanState::laying_out && c.plan() == nullptr))
    invariant_failed("the heap at " + hex(seg.addr) + " waits to lay out a plan without an event or a plan, "
                     "or holds an event without waiting");
  if (h.give_back_event != 0 && c.plan() == nullptr)
    invariant_failed("the heap at " + hex(seg.addr) + " waits to give back the pages above a plan it does not have");
}

}  // namespace tensorpool::detail

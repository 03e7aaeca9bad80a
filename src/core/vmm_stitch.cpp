// vmm_stitch.cpp: stitching under pressure (vmm_stitch). A chunk is one physical allocation,
// which the device unmaps and releases only whole, so the free pages of a chunk that also holds
// a live block are memory no reclaim gives back: near the device's capacity a training step
// fails with hundreds of MiB of them scattered over its heap. Where a growth finds nothing left
// to create or reclaim, stitch() maps those pages again, side by side, in the hole a growth
// would map (VirtualMemory::map_part(): cuMemMap with an offset into the chunk's handle, while
// the chunk stays mapped where it is), after the device's last pages if they are needed too,
// and the request is served there.
//
// The pages keep their first mapping: the free block they lie in gives them up as a lent block
// (Block::lent: allocated, by no user, listed in Heap::lent), so that nothing is carved from
// them there while the stitched range uses them. Each run of lent pages is one stitched chunk
// (Chunk::lent_at) of the heap: mapped memory like any other (blocks are carved from it, freed,
// coalesced), but its physical memory is its owner's. So it is never cached, reclaimed, traded
// or released: free_block_over(), reclaim_heap() and idle_physical() pass it by; empty_cache()
// and the OOM ladder (release()), a growth that finds no hole, and sleep() unmap the ones that
// lie under free blocks and give the pages back to their lent blocks (unstitch_free());
// sleep_heap() releases the rest with their owners, and their live blocks wake on pages of their
// own while the lent ones sleep as free pages (vmm_sleep.cpp); destroy() unmaps them before it
// releases their owners. A heap with lent blocks lays out no plan (map_plan()).
//
// Cost: O(the heap's blocks) and one map call per run, only where the request would otherwise
// fail; no synchronization (the pages are free in this heap's stream order, as any reuse).
#include <algorithm>
#include <array>
#include <iterator>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

// The request of `size` bytes, served from free pages lent where they lie and mapped again in
// the first hole a growth would map (place(): the lowest that, with the free blocks beside it,
// holds the request), so that stitched ranges fill holes before they take new address space;
// nullptr when no hole fits, the heap's free pages do not add up to what the hole needs (then
// not even with the device's last pages: with_last_pages()), or the device maps no parts. A
// DeviceError from a map of the free pages leaves the heap as it was (but for the device's last
// pages, if mapped: they stay, free, as any growth's).
Block* VmmHeaps::stitch(Heap& heap, std::size_t size) {
  if (!st_.config.vmm_stitch || !vm_.maps_parts() || heap.asleep || !heap.sleeping.empty() ||
      st_.capture_underway() || heap.cursor.state() == PlanState::laying_out)
    return nullptr;
  if (Block* b = stitch_free_pages(heap, size)) return b;
  return with_last_pages(heap, size);
}

// stitch() where the free pages alone fall short: the device's last whole pages (fewer than the
// request needs beyond the free block before its hole: the growth asked for chunks larger than
// the device had, and mapped none) are mapped at the hole, then the free pages make up the rest.
// Nothing is mapped unless they add up (the same free blocks lend either way: the pages join the
// block before the hole, which lends none); if the device then gives fewer pages than it said it
// had, those it gave stay mapped and free, for the ladder's release.
Block* VmmHeaps::with_last_pages(Heap& heap, std::size_t size) {
  Placement where = place(heap, size);
  const std::size_t room = st_.room_left() / page_ * page_;
  if (where.hole == nullptr || room == 0 || room >= where.need) return nullptr;
  if (runs_to_lend(heap, joined_by(where), where.need - room).empty()) return nullptr;
  where.bytes = where.need = room;
  where.left = room;
  if (map_into(heap, where).block == nullptr) return nullptr;
  return stitch_free_pages(heap, size);
}

// stitch() once its conditions hold: nothing changed where it returns nullptr.
Block* VmmHeaps::stitch_free_pages(Heap& heap, std::size_t size) {
  const Placement where = place(heap, size);
  if (where.hole == nullptr) return nullptr;
  Block* hole = where.hole;
  const std::vector<LentRun> runs = runs_to_lend(heap, joined_by(where), where.need);
  if (runs.empty()) return nullptr;
  map_runs(heap, hole->addr, runs);
  lend(heap, runs);
  heap.unmapped.erase(hole->addr);
  if (where.need < hole->size) {
    Block* rest = heap.blocks().split_at(hole, where.need);
    heap.unmapped.emplace(rest->addr, rest);
  }
  hole->mapped = true;
  Block* merged = st_.coalesce(hole);  // with the free blocks beside it
  heap.index().insert(merged);
  st_.counters.count(&Stats::stitches);
  log().debug("vmm: stitched {} of free pages in {} runs for a request of {}", format_bytes(where.need), runs.size(),
              format_bytes(size));
  return merged;
}

// The free blocks a range mapped for `where` joins, which lend no pages to it: the one before
// the hole, and the one after it where the range fills the hole (the request reaches into it).
std::array<const Block*, 2> VmmHeaps::joined_by(const Placement& where) const noexcept {
  const Block* hole = where.hole;
  const Block* below = free_mapped(hole->prev) ? hole->prev : nullptr;
  const Block* above = where.need >= hole->size && free_mapped(hole->next) ? hole->next : nullptr;
  return {below, above};
}

// The runs of whole free pages, lowest first, that add up to `need` bytes: each within one free
// mapped block of the heap (but the `spared` ones, which the stitched range joins) and one chunk
// of its own; empty if they fall short.
std::vector<VmmHeaps::LentRun> VmmHeaps::runs_to_lend(const Heap& heap, std::array<const Block*, 2> spared,
                                                       std::size_t need) const {
  std::vector<LentRun> runs;
  std::size_t got = 0;
  for (Block* b = heap.segment->first; b != nullptr && got < need; b = b->next) {
    if (b == spared[0] || b == spared[1] || !free_mapped(b)) continue;
    const Address begin = round_up(b->addr, page_);
    const Address end = (b->addr + b->size) / page_ * page_;
    if (end <= begin) continue;
    auto it = std::prev(heap.chunks.upper_bound(begin));  // the chunk under `begin` (b is mapped)
    for (; it != heap.chunks.end() && it->first < end && got < need; ++it) {
      const Chunk& c = it->second;
      if (c.stitched()) continue;  // its pages are lent already
      const Address from = std::max(begin, c.addr);
      const Address to = std::min({end, c.end(), from + (need - got)});
      if (to <= from) continue;
      runs.push_back({b, &c, from, to});
      got += to - from;
    }
  }
  if (got < need) runs.clear();
  return runs;
}

// Maps the runs side by side from `at` (the start of the hole stitch() chose) as stitched chunks
// of the heap. If the device refuses one, the ones mapped are unmapped and the error goes on.
void VmmHeaps::map_runs(Heap& heap, Address at, const std::vector<LentRun>& runs) {
  std::vector<Chunk> mapped;
  try {
    for (const LentRun& r : runs) {
      const std::size_t bytes = r.end - r.begin;
      vm_.map_part(at, bytes, r.chunk->handle, r.begin - r.chunk->addr);
      mapped.push_back(Chunk{at, bytes, r.chunk->handle, heap.pool(), r.begin, r.begin - r.chunk->addr});
      at += bytes;
    }
  } catch (...) {
    for (const Chunk& c : mapped) vm_.unmap(c.addr, c.size);
    throw;
  }
  for (const Chunk& c : mapped) {
    heap.add_chunk(c);
    st_.counters.count(&Stats::vm_maps);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_map, c.addr, 0, c.size, heap.stream());
  }
}

// Each run becomes a lent block where it lies; the pieces of its free block around it stay free,
// in the index. The runs are in address order, so a block's later runs lie in what its earlier
// ones left after them.
void VmmHeaps::lend(Heap& heap, const std::vector<LentRun>& runs) {
  Block* rest = nullptr;  // what the previous run left of its block, after it
  const Block* previous = nullptr;
  for (const LentRun& r : runs) {
    Block* b = r.block == previous ? rest : r.block;
    previous = r.block;
    heap.index().remove(b);
    if (r.begin > b->addr) {
      Block* mid = heap.blocks().split_at(b, r.begin - b->addr);
      heap.index().insert(b);
      b = mid;
    }
    rest = nullptr;
    if (r.end < b->addr + b->size) {
      rest = heap.blocks().split_at(b, r.end - b->addr);
      heap.index().insert(rest);
    }
    b->state = BlockState::allocated;
    b->lent = true;
    b->epoch_slot = EpochLog::kNoSlot;  // in no epoch record: the program does not hold it
    heap.lent.emplace(b->addr, b);
  }
}

// Unmaps the heap's stitched chunks that lie entirely under free blocks and gives their pages
// back to their lent blocks, after the heap's stream has done its work (unless `work` says so).
void VmmHeaps::unstitch_free(Heap& heap, StreamWork work) {
  const std::vector<Chunk> free_stitched = free_stitched_chunks(heap);
  if (free_stitched.empty()) return;
  if (work == StreamWork::may_run) {
    st_.device->synchronize_stream(heap.stream());
    st_.counters.count(&Stats::syncs);
  }
  Block* from = heap.segment->first;  // a block at or before the next chunk, alive
  for (const Chunk& c : free_stitched) {
    // Still free and covering c: the unmaps and give-backs before it only cut or grew blocks.
    Block* b = block_holding(from, c.addr);
    if (!covers_free(b, c)) invariant_failed("stitched chunk at " + hex(c.addr) + " is no longer under a free block");
    heap.index().remove(b);
    Block* after = unmap_chunk(heap, b, c);
    if (after != nullptr) heap.index().insert(after);
    give_back_lent(heap, c);  // once every piece is in the index: the lent block may merge with one
    // The walk goes on from the hole over c: a give-back merges mapped blocks only, so it is
    // alive, where the blocks beside c may have merged into the lent block and be gone.
    from = hole_holding(heap, c.addr);
  }
}

// The unmapped block (Heap::unmapped) that holds address `at`, which must lie in one.
Block* VmmHeaps::hole_holding(const Heap& heap, Address at) {
  auto it = heap.unmapped.upper_bound(at);
  if (it == heap.unmapped.begin()) invariant_failed("no hole holds " + hex(at));
  Block* hole = std::prev(it)->second;
  if (hole->addr + hole->size <= at) invariant_failed("no hole holds " + hex(at));
  return hole;
}

// The heap's stitched chunks that lie entirely under free blocks, in address order: one walk of
// the blocks beside the stitched chunks (both go by address), not a walk from the heap's start
// per chunk, nor over all its chunks. Every failed growth near a full device asks (release(),
// then grow()), with thousands of chunks and blocks.
std::vector<Chunk> VmmHeaps::free_stitched_chunks(const Heap& heap) {
  std::vector<Chunk> out;
  Block* b = heap.segment->first;
  for (const Address at : heap.stitched_chunks) {
    const Chunk& c = heap.chunks.at(at);
    b = block_holding(b, c.addr);
    if (covers_free(b, c)) out.push_back(c);
  }
  return out;
}

// Stitched chunk c was just unmapped: its lent block is a free block again, where it lies,
// merged with the free blocks beside it (each in the index).
void VmmHeaps::give_back_lent(Heap& heap, const Chunk& stitched) {
  const auto it = heap.lent.find(stitched.lent_at);
  if (it == heap.lent.end()) invariant_failed("stitched chunk at " + hex(stitched.addr) + " has no lent block");
  Block* b = it->second;
  heap.lent.erase(it);
  b->lent = false;
  b->state = BlockState::free;
  heap.index().insert(st_.coalesce(b));
}

}  // namespace tensorpool::detail

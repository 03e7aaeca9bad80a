// vmm_heaps.cpp: the virtual-memory source (mode:vmm). Physical pages, not address ranges, are
// the cached resource.
//
// Each stream has one heap per pool: a segment spanning a large reserved address range (twice
// the device capacity), tiled by blocks like any segment. Physical memory comes in chunks (one
// VirtualMemory::create_physical handle each, a multiple of the page size) mapped at
// page-aligned addresses of the heap. Blocks under chunks are "mapped"; free address space
// without pages is held by free blocks with mapped == false, listed in Heap::unmapped and never
// in a free index, so the fast path only ever sees mapped memory.
//
// Because a heap is one contiguous range, free space of neighbouring chunks coalesces, so the
// "separate segments never merge" fragmentation of fixed segments does not arise. When the free
// index has no block large enough, grow() maps more pages at the lowest unmapped hole whose
// span (with its free mapped neighbours) fits the request. The pages come, in this order, from
// chunks cached unmapped, from chunks that are entirely free somewhere else (unmapped there after
// synchronizing their stream: done when idle physical memory exceeds the idle limit, or when
// nothing more can be created), and finally from a new chunk (at least growth_step() bytes).
// New chunks are at most vmm_max_chunk; with vmm_chunk_divisor N, at most request/N (but at
// least a floor set by the device's capacity, chunk_floor()), and they end at the pages around
// where the request's block ends (new_chunk_size()).
// Mapped memory stays mapped otherwise, so a workload that repeats itself makes no map calls.
//
// Epochs: an epoch of a heap runs from a moment it has nothing allocated to the next; the fast
// path records its allocations (size, lifetime, offset) in the heap's EpochLog (epoch_log.hpp)
// and calls end_epoch() when the heap is left empty.
//
// Held pages: when an epoch ends, the heap's mapped memory is not put in the free index but held,
// and comes back a growth step at a time, without device calls, when nothing in the index fits
// (from_held()), exactly as the heap first grew from the device. Held pages are free memory
// (stats, fragmentation, snapshots say so); growth that they cannot serve, pressure and
// release() give them back to the index first.
//
// Planned layouts: the recorded epoch is planned offline (layout_plan.hpp: the lower of the
// recorded layout and a packing by size), and while the next epoch makes the same requests in the
// same order, each is served at its planned offset (take_planned()), carved from held or free
// memory, with no device call and no search of the index. The plan needs the memory from the
// heap's start to its height mapped; if the pages lie elsewhere (remapped under pressure), the
// free that ends the epoch maps them back there (map_plan()), once. A request the plan did not
// foresee drops it for the rest of the epoch (the held pages serve it), and that epoch is planned
// afresh. A program that repeats its steps from an empty heap so runs them at the live peak the
// packing reaches, with no device call (docs/vmm.md, "Planned layouts").
// See docs/vmm.md.
#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/epoch_log.hpp"
#include "core/layout_plan.hpp"
#include "core/logging.hpp"
#include "core/segment_source.hpp"
#include "core/util.hpp"

namespace tensorpool::detail {

namespace {

// A free block a request can use: mapped, and not held (held pages are in no index).
bool free_mapped(const Block* b) {
  return b != nullptr && b->state == BlockState::free && b->mapped && !b->held;
}
bool free_unmapped(const Block* b) { return b != nullptr && b->state == BlockState::free && !b->mapped; }

/// A physical allocation (one handle) of whole pages.
struct Chunk {
  Address addr = 0;  // where it is mapped (0 while unmapped, in the cache)
  std::size_t size = 0;
  PhysicalHandle handle = 0;
  Pool pool = Pool::large;
  Address end() const noexcept { return addr + size; }
};

/// One step of a planned layout: the next allocation of the epoch is `size` bytes at `offset`
/// from the heap's start; `below` is the step whose block ends closest below it while it lives
/// (LayoutPlan::kNone: none), where the search for its free block starts.
struct PlanStep {
  std::size_t size = 0;
  std::size_t offset = 0;
  std::uint32_t below = LayoutPlan::kNone;
};

/// The planned layout of one recorded epoch; `height`: the mapped bytes from the heap's start it
/// needs (whole pages). Immutable once made, shared by the keys it is stored under.
struct Plan {
  std::vector<PlanStep> steps;
  std::size_t height = 0;
};

/// A stored plan and when it was last used (for the least-recently-used eviction).
struct StoredPlan {
  std::shared_ptr<const Plan> plan;
  std::uint64_t used = 0;
};

/// The mapping state of one heap. Invariants: chunks do not overlap, lie inside the segment and
/// are of its pool; every page of a block with mapped == true lies in a chunk; a block with
/// mapped == false is free, page-aligned at both ends, intersects no chunk, and is in
/// `unmapped` (which holds nothing else).
///
/// Epochs: `epoch` records the current one (epoch_log.hpp; Segment::epoch points to it). `plans`
/// holds the plans of recorded epochs, each under the signature of the epoch that came before it
/// (a heap that empties several times per iteration runs the same chain of epochs each
/// iteration), at most vmm_plan_max_blocks steps in all. While `following` (== the owner
/// stream's planned[pool]) the epoch's allocations are served by `active`, step `cursor` next;
/// placed[i] is the block step i got (checked before use: the Block may have been recycled).
struct Heap {
  Segment* segment = nullptr;          // the reserved range, in AllocatorState::segments
  std::map<Address, Chunk> chunks;     // mapped chunks by address
  std::map<Address, Block*> unmapped;  // free blocks without pages, by address
  std::map<Address, Block*> held;      // held pages: free mapped blocks kept out of the index

  EpochLog epoch;
  std::uint64_t last_signature = 0;    // of the epoch that ended last (0: none yet)
  std::unordered_map<std::uint64_t, StoredPlan> plans;
  std::size_t stored_steps = 0;        // sum of the stored plans' steps, per key
  std::uint64_t plan_uses = 0;         // the clock of StoredPlan::used
  std::shared_ptr<const Plan> active;  // the plan this epoch was given (null: none) ...
  std::uint64_t active_key = 0;        // ... as stored under this key
  std::vector<Block*> placed;
  std::size_t cursor = 0;
  bool following = false;
  bool departed = false;               // this epoch left its plan (a request it did not foresee)
};

class VmmHeaps final : public SegmentSource {
 public:
  VmmHeaps(AllocatorState& state, VirtualMemory& vm);

  Block* grow(StreamState& ss, Pool pool, std::size_t size) override;
  std::size_t release(ReleaseGoal goal) override;
  void destroy() override;
  void check(Recount& rc) const override;
  Block* end_epoch(Block* b) override;
  Block* take_planned(StreamState& ss, Pool pool, std::size_t size) override;
  void for_each_held(const std::function<void(const Block*)>& f) const override;

 private:
  struct Placement {
    Block* hole;        // an unmapped free block
    std::size_t bytes;  // to map at its start (a growth step)
    std::size_t need;   // of which the request needs at least this much
    std::size_t request = 0;  // the request's size
    Address block_end = 0;    // where the request's block will end, if it is placed here
  };

  Heap* heap_of(const StreamState& ss, Pool pool) const;
  Heap& heap_of(const Block* b) { return heaps_.at(b->segment->addr); }
  Block* hold(Heap& heap, Block* x);
  void hold_all(Heap& heap, Block* freed);
  void plan_next_epoch(Heap& heap);
  void follow(Heap& heap);
  std::shared_ptr<const Plan> make_plan(const Heap& heap) const;
  void store_plan(Heap& heap, std::uint64_t key, std::shared_ptr<const Plan> plan, std::uint64_t spare);
  bool map_plan(Heap& heap, std::size_t height);
  void stop_following(Heap& heap, bool departed);
  Block* find_planned(Heap& heap, const PlanStep& step) const;
  Block* carve(Heap& heap, Block* x, Address at, std::size_t size);
  Block* from_held(Heap& heap, Pool pool, std::size_t size);
  Block* unhold(Heap& heap, Block* r, std::size_t bytes);
  void release_held(Pool pool, bool spare_following = false);
  Heap& heap_for(StreamState& ss, Pool pool);
  std::size_t growth_step(Pool pool) const noexcept;
  std::size_t idle_limit(Pool pool) const noexcept;
  Placement place(const Heap& heap, std::size_t size) const;
  std::size_t new_chunk_size(const Placement& where, Address at, Address end) const;
  std::size_t chunk_floor(bool past_block) const noexcept;
  Block* map_into(Heap& heap, const Placement& where, Pool pool, bool& complete);
  bool create_chunk(std::size_t bytes, Pool pool, Chunk& out);
  std::ptrdiff_t pick_cached(Pool pool, std::size_t want, std::size_t room) const;
  std::size_t idle_physical(Pool pool) const;
  std::size_t reclaim_free_chunks(Pool pool, std::size_t& keep, bool spare_following = false);
  std::size_t reclaim_heap(Heap& heap, std::size_t& keep);
  void release_held(Heap& heap);
  Block* unmap_chunk(Heap& heap, Block* free_block, const Chunk& chunk);
  void mark_unmapped(Heap& heap, Block* b);
  std::size_t release_cached_chunks();
  void check_heap(const Heap& heap) const;
  void check_epoch(const Heap& heap) const;

  AllocatorState& st_;
  VirtualMemory& vm_;
  const std::size_t page_;                 // vm_.page_size()
  std::map<Address, Heap> heaps_;          // by the address of their range
  std::unordered_map<const StreamState*, std::array<Heap*, kNumPools>> by_stream_;  // into heaps_
  std::vector<Chunk> cached_;              // physical chunks mapped nowhere (addr == 0)
  std::array<std::size_t, kNumPools> held_bytes_{};  // bytes of held blocks, per pool (invariant)
};

VmmHeaps::VmmHeaps(AllocatorState& state, VirtualMemory& vm)
    : st_(state), vm_(vm), page_(vm.page_size()) {
  st_.config.max_split_size = 0;  // every block of a heap can be split: no oversize segments
}

Heap* VmmHeaps::heap_of(const StreamState& ss, Pool pool) const {
  auto it = by_stream_.find(&ss);
  return it == by_stream_.end() ? nullptr : it->second[static_cast<int>(pool)];
}

Heap& VmmHeaps::heap_for(StreamState& ss, Pool pool) {
  Heap*& slot = by_stream_[&ss][static_cast<int>(pool)];
  if (slot != nullptr) return *slot;
  const std::size_t range = round_up(2 * st_.props.capacity, page_);
  const Address base = vm_.reserve_address_range(range, page_);
  if (base == 0)
    throw DeviceError("tensorpool: cannot reserve " + format_bytes(range) + " of address space on " +
                      st_.props.name);
  auto seg = std::make_unique<Segment>();
  seg->addr = base;
  seg->size = range;
  seg->owner = &ss;
  seg->pool = pool;
  seg->index = &AllocatorState::index_for(ss, pool, false);
  seg->heap = true;
  Block* b = st_.blocks.acquire();
  b->addr = base;
  b->size = range;
  b->segment = seg.get();
  b->mapped = false;
  seg->first = b;
  Heap& heap = heaps_[base];
  heap.segment = seg.get();
  heap.epoch.capacity = st_.config.vmm_plan_max_blocks;
  seg->epoch = &heap.epoch;
  heap.unmapped.emplace(base, b);
  st_.segments.emplace(base, std::move(seg));
  slot = &heap;
  return heap;
}

// Where to map pages for a request of `size`: the lowest unmapped hole that, with the free
// mapped block before it (and if need be the whole hole plus the one after it), fits; how many
// bytes of the hole to map (a growth step), and how many the request needs at least.
VmmHeaps::Placement VmmHeaps::place(const Heap& heap, std::size_t size) const {
  for (const auto& [addr, hole] : heap.unmapped) {
    const std::size_t before = free_mapped(hole->prev) ? hole->prev->size : 0;
    const std::size_t need = size > before ? round_up(size - before, page_) : page_;
    const Address block_end = (before != 0 ? hole->prev->addr : hole->addr) + size;
    if (need <= hole->size)
      return {hole, std::min(std::max(need, growth_step(heap.segment->pool)), hole->size), need, size, block_end};
    const std::size_t after = free_mapped(hole->next) ? hole->next->size : 0;
    if (before + hole->size + after >= size) return {hole, hole->size, hole->size, size, block_end};
  }
  return {nullptr, 0, 0};
}

// The least memory a growth maps: 1/vmm_growth_divisor of what the pool holds, between one page
// and vmm_max_growth; the small pool grows a page at a time. Growing in steps keeps upstream
// calls few while bounding the memory mapped ahead of need at any peak to that fraction.
std::size_t VmmHeaps::growth_step(Pool pool) const noexcept {
  if (pool == Pool::small) return page_;
  // What the pool has exposed (held pages aside): the same figure at the same point of a
  // repeated step as when the pool grew there.
  const std::size_t exposed = st_.counters.reserved(pool) - held_bytes_[static_cast<int>(pool)];
  const Config& c = st_.config;
  return round_up(std::clamp(exposed / c.vmm_growth_divisor, page_, std::max(page_, c.vmm_max_growth)), page_);
}

// The size of the next new chunk, mapped at `at` by a growth that maps up to `end`: at most
// vmm_max_chunk. With vmm_chunk_divisor N also at most the largest power of two of pages not
// above request/N (but at least chunk_floor()), and a chunk never crosses the page boundaries
// around the end of the request's block (for a request within one chunk, only the one after
// it): the memory after the block then lies in chunks of its own, which can be unmapped whole
// once free, while the block lives. Small chunks are what lets a heap near the device's
// capacity give back free pages beside live blocks; the price is calls.
std::size_t VmmHeaps::new_chunk_size(const Placement& where, Address at, Address end) const {
  std::size_t limit = std::max(page_, round_up(st_.config.vmm_max_chunk, page_));
  const std::size_t divisor = st_.config.vmm_chunk_divisor;
  if (divisor == 0) return std::min(end - at, limit);
  const Address last_page = where.block_end / page_ * page_;  // page holding the block's end
  const Address past_block = round_up(where.block_end, page_);
  std::size_t pow2 = page_;
  while (pow2 <= where.request / divisor / 2) pow2 *= 2;
  limit = std::min(limit, std::max(pow2, chunk_floor(at >= past_block)));
  // A request no larger than one chunk gets one chunk up to the page past its block, the page
  // holding its end included: one call fewer per growth, and what a live neighbour on that page
  // can pin is at most one such chunk.
  if (at < past_block && where.request <= limit && past_block - at <= limit) limit = past_block - at;
  else if (at < last_page) limit = std::min<std::size_t>(limit, last_page - at);
  else if (at < past_block) limit = std::min<std::size_t>(limit, past_block - at);
  return std::min(end - at, limit);
}

// The smallest chunk vmm_chunk_divisor makes: 1/vmm_chunk_floor_divisor of the memory the
// allocator may use (the device's capacity, or the memory limit if lower), in whole pages, and
// twice that for the chunks a growth maps past the request's block (memory mapped ahead of
// need). What a free, partly used chunk strands is then a bounded share of the device, while a
// request of a few MiB no longer makes chunks of a page or two.
std::size_t VmmHeaps::chunk_floor(bool past_block) const noexcept {
  const std::size_t divisor = st_.config.vmm_chunk_floor_divisor;
  if (divisor == 0) return page_;
  const std::size_t room = st_.limit == 0 ? st_.props.capacity : std::min(st_.limit, st_.props.capacity);
  const std::size_t floor = room / divisor * (past_block ? 2 : 1) / page_ * page_;
  return std::max(page_, floor);
}

// Idle physical memory (free chunks, cached or mapped under free blocks) a growth tolerates
// before it remaps instead of creating: vmm_idle_limit, and at most 1/vmm_idle_divisor of the
// pool, so that a small pool does not keep a large share of itself idle while it grows.
std::size_t VmmHeaps::idle_limit(Pool pool) const noexcept {
  return std::min(st_.config.vmm_idle_limit, st_.counters.reserved(pool) / st_.config.vmm_idle_divisor);
}

Block* VmmHeaps::grow(StreamState& ss, Pool pool, std::size_t size) {
  Heap& heap = heap_for(ss, pool);
  if (Block* b = from_held(heap, pool, size)) return b;
  const std::size_t want = round_up(size, page_);
  const bool pressure = !st_.within_limit(want) || want > st_.device->free_memory();
  // Too few held pages: they join the free block before the hole, for place(), and other heaps'
  // may be remapped here; but for the pages of heaps that follow a plan, unless under pressure
  // (they are about to be used where they lie).
  release_held(pool, !pressure);
  if (pressure || idle_physical(pool) > idle_limit(pool)) {
    std::size_t keep = 0;
    reclaim_free_chunks(pool, keep, !pressure);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Placement where = place(heap, size);
    if (where.hole == nullptr) return nullptr;
    bool complete = false;
    Block* b = map_into(heap, where, pool, complete);
    if (complete && b != nullptr && b->size >= size) return b;
    std::size_t keep = 0;
    if (attempt == 0 && reclaim_free_chunks(pool, keep) == 0) break;
  }
  return nullptr;
}

// Index of the cached chunk of `pool` to map next: the smallest that covers `want` and fits in
// `room`, else the largest that fits. -1 if none fits.
std::ptrdiff_t VmmHeaps::pick_cached(Pool pool, std::size_t want, std::size_t room) const {
  std::ptrdiff_t covering = -1;
  std::ptrdiff_t largest = -1;
  for (std::size_t i = 0; i < cached_.size(); ++i) {
    const Chunk& c = cached_[i];
    if (c.pool != pool || c.size > room) continue;
    if (c.size >= want && (covering < 0 || c.size < cached_[static_cast<std::size_t>(covering)].size))
      covering = static_cast<std::ptrdiff_t>(i);
    if (largest < 0 || c.size > cached_[static_cast<std::size_t>(largest)].size)
      largest = static_cast<std::ptrdiff_t>(i);
  }
  return covering >= 0 ? covering : largest;
}

bool VmmHeaps::create_chunk(std::size_t bytes, Pool pool, Chunk& out) {
  if (!st_.within_limit(bytes)) return false;
  const PhysicalHandle h = vm_.create_physical(bytes);
  if (h == 0) {
    st_.counters.count(&Stats::upstream_alloc_failures);
    return false;
  }
  out = Chunk{0, bytes, h, pool};
  st_.counters.on_upstream_alloc(pool, bytes);
  if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_alloc, 0, 0, bytes, kDefaultStream);
  return true;
}

// Maps chunks at the start of the hole until `where.bytes` are mapped (cached chunks first, then
// new ones; if the device or the limit refuses the growth step, only the `where.need` bytes the
// request needs). Returns the free mapped block that now starts at or before the hole's address
// (merged with its neighbours, in the index), or nullptr if nothing could be mapped; `complete`
// tells whether the needed bytes were.
Block* VmmHeaps::map_into(Heap& heap, const Placement& where, Pool pool, bool& complete) {
  Block* hole = where.hole;
  const Address start = hole->addr;
  const Address needed_end = start + where.need;
  Address end = start + where.bytes;
  const Address hole_end = hole->addr + hole->size;
  Address cursor = start;
  auto place_chunk = [&](Chunk c) {
    try {
      vm_.map(cursor, c.size, c.handle);
    } catch (...) {
      cached_.push_back(c);  // keeps the physical memory accounted for
      throw;
    }
    c.addr = cursor;
    heap.chunks.emplace(c.addr, c);
    st_.counters.count(&Stats::vm_maps);
    if (st_.hooks.observed())
      st_.hooks.notify(EventType::segment_map, c.addr, 0, c.size, heap.segment->owner->stream);
    cursor += c.size;
  };
  // The mapped bytes [start, cursor) become part of the free block before the hole, or a new
  // one; the rest of the hole stays unmapped.
  auto record_mapped = [&]() -> Block* {
    heap.unmapped.erase(hole->addr);
    if (cursor < hole_end) {
      Block* rest = st_.blocks.split_at(hole, cursor - start);
      heap.unmapped.emplace(rest->addr, rest);
    }
    hole->mapped = true;
    Block* merged = st_.coalesce(hole);  // with free mapped neighbours
    heap.segment->index->insert(merged);
    return merged;
  };
  try {
    while (cursor < end) {
      const std::ptrdiff_t i = pick_cached(pool, end - cursor, hole_end - cursor);
      if (i < 0) break;
      const Chunk c = cached_[static_cast<std::size_t>(i)];
      cached_.erase(cached_.begin() + i);
      place_chunk(c);
    }
    // New memory: a chunk is unmapped only whole, so smaller chunks let free pages next to
    // live blocks be reclaimed under pressure (new_chunk_size()).
    Chunk fresh;
    while (cursor < end) {
      if (!create_chunk(new_chunk_size(where, cursor, end), pool, fresh)) {
        if (cursor >= needed_end) break;
        end = needed_end;  // the step does not fit: map only what the request needs
        if (!create_chunk(new_chunk_size(where, cursor, end), pool, fresh)) break;
      }
      place_chunk(fresh);
    }
  } catch (...) {
    if (cursor == start) throw;  // nothing changed
    complete = false;
    record_mapped();  // some chunks were mapped: the blocks say so before the error goes on
    throw;
  }
  complete = cursor >= needed_end;
  if (cursor == start) return nullptr;
  return record_mapped();
}

// --- epochs: held pages and planned layouts --------------------------------------------------

// b, free and coalesced (in no index), leaves its heap with nothing allocated: the epoch ends.
// All the heap's free mapped memory is held (b and every free block after an unmapped hole),
// and the epoch just recorded is planned for the next one.
Block* VmmHeaps::end_epoch(Block* b) {
  Heap& heap = heap_of(b);
  hold_all(heap, b);
  plan_next_epoch(heap);
  heap.epoch.restart();
  return nullptr;
}

// Holds free block x (in no index), merged with held neighbours (one held block per run of
// mapped memory); returns the held block x is now part of.
Block* VmmHeaps::hold(Heap& heap, Block* x) {
  x->held = true;
  held_bytes_[static_cast<int>(x->segment->pool)] += x->size;
  if (x->next != nullptr && x->next->held) {
    heap.held.erase(x->next->addr);
    st_.blocks.absorb_next(x);
  }
  if (x->prev != nullptr && x->prev->held) {
    x = x->prev;
    st_.blocks.absorb_next(x);
  } else {
    heap.held.emplace(x->addr, x);
  }
  return x;
}

// Holds every free mapped block of the heap: `freed` (in no index) and those in the index.
void VmmHeaps::hold_all(Heap& heap, Block* freed) {
  for (Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (x != freed && free_mapped(x)) {
      x->segment->index->remove(x);
      x = hold(heap, x);
    }
  }
  hold(heap, freed);
}

// The heap is empty and its epoch recorded. Its plan is stored under the signature of the epoch
// before it (an epoch that followed its plan to the end, with nothing more, keeps that plan: the
// same requests in the same order, no planning cost). The next epoch gets the plan stored after
// an epoch like this one, if any, else this one's again, when the memory from the heap's start up
// to its height is mapped (map_plan()); without one it runs unplanned from the held pages.
void VmmHeaps::plan_next_epoch(Heap& heap) {
  const std::vector<PlanBlock>& record = heap.epoch.entries;
  const bool matched = heap.active != nullptr && !heap.following && !heap.departed &&
                       heap.cursor == heap.active->steps.size() && record.size() == heap.active->steps.size();
  const std::uint64_t signature = heap.epoch.signature;
  stop_following(heap, false);
  heap.departed = false;
  if (matched && signature == heap.last_signature && heap.active_key == signature) {
    // The epoch repeated the one before it, as the plan stored after that one said: the same
    // plan again, with nothing to store or look up (a loop that runs one epoch over and over).
    if (map_plan(heap, heap.active->height)) follow(heap);
    else heap.active = nullptr;
    return;
  }
  std::shared_ptr<const Plan> mine = matched ? std::move(heap.active) : make_plan(heap);
  heap.active = nullptr;
  std::shared_ptr<const Plan> next;
  std::uint64_t next_key = heap.last_signature;  // where `mine` is stored
  if (const auto it = heap.plans.find(signature); it != heap.plans.end()) {
    it->second.used = ++heap.plan_uses;
    next = it->second.plan;
    next_key = signature;
  } else {
    next = mine;
  }
  if (mine) store_plan(heap, heap.last_signature, std::move(mine), signature);
  heap.last_signature = signature;
  if (!next || !map_plan(heap, next->height)) return;
  heap.active = std::move(next);
  heap.active_key = next_key;
  follow(heap);
}

// The empty heap starts following `active` from its first step.
void VmmHeaps::follow(Heap& heap) {
  heap.placed.assign(heap.active->steps.size(), nullptr);
  heap.cursor = 0;
  heap.following = true;
  heap.segment->owner->planned[static_cast<int>(heap.segment->pool)] = true;
}

// The plan of the epoch just recorded (null when it made more allocations than are recorded, or
// none, or planning failed: a free must not fail for want of a plan).
std::shared_ptr<const Plan> VmmHeaps::make_plan(const Heap& heap) const {
  const std::vector<PlanBlock>& record = heap.epoch.entries;
  if (heap.epoch.full || record.empty()) return nullptr;
  try {
    const LayoutPlan layout = plan_layout(record);
    auto plan = std::make_shared<Plan>();
    plan->steps.resize(record.size());
    for (std::size_t i = 0; i < record.size(); ++i)
      plan->steps[i] = PlanStep{record[i].size, layout.offsets[i], layout.below[i]};
    plan->height = round_up(layout.height, page_);
    return plan;
  } catch (const std::exception& e) {
    log().error("vmm: planning an epoch of {} allocations failed: {}", record.size(), e.what());
    return nullptr;
  }
}

// Stores `plan` under `key`, then evicts the least recently used plans (but the one under
// `spare`) while the stored plans hold more than vmm_plan_max_blocks steps.
void VmmHeaps::store_plan(Heap& heap, std::uint64_t key, std::shared_ptr<const Plan> plan, std::uint64_t spare) {
  auto [it, inserted] = heap.plans.try_emplace(key);
  if (!inserted) heap.stored_steps -= it->second.plan->steps.size();
  heap.stored_steps += plan->steps.size();
  it->second = StoredPlan{std::move(plan), ++heap.plan_uses};
  while (heap.stored_steps > st_.config.vmm_plan_max_blocks && heap.plans.size() > 1) {
    auto oldest = heap.plans.end();
    for (auto p = heap.plans.begin(); p != heap.plans.end(); ++p)
      if (p->first != spare && p->first != key && (oldest == heap.plans.end() || p->second.used < oldest->second.used))
        oldest = p;
    if (oldest == heap.plans.end()) break;
    heap.stored_steps -= oldest->second.plan->steps.size();
    heap.plans.erase(oldest);
  }
}

// Makes [start, start + height) of the empty heap mapped (and held), if the physical memory
// the heap and the cache hold can: when it is not already, every chunk of the heap is unmapped
// (after synchronizing its stream) and chunks are mapped back from the heap's start, its own and
// the cached ones, until the plan's height is covered. No memory is created for a plan.
bool VmmHeaps::map_plan(Heap& heap, std::size_t height) {
  const Address start = heap.segment->addr;
  const Address end = start + height;
  Address covered = start;
  for (auto it = heap.chunks.begin(); it != heap.chunks.end() && it->first == covered && covered < end; ++it)
    covered = it->second.end();
  if (covered >= end) return true;
  const Pool pool = heap.segment->pool;
  std::size_t physical = 0;
  for (const auto& [a, c] : heap.chunks) physical += c.size;
  for (const Chunk& c : cached_)
    if (c.pool == pool) physical += c.size;
  if (physical < height) return false;
  // Unmap everything (the heap is empty: every chunk lies under a free block); the heap becomes
  // one unmapped hole, as when it was made, and is mapped again from its start. This is the one
  // place a free makes device calls (and waits for the heap's stream): once, when an epoch ends
  // whose plan the pages are not laid out for.
  try {
    release_held(heap);
    std::size_t keep = 0;
    reclaim_heap(heap, keep);
    Block* hole = heap.segment->first;
    if (hole->mapped || hole->state != BlockState::free) return false;
    bool complete = false;
    Block* mapped = map_into(heap, Placement{hole, height, height, 0, 0}, pool, complete);
    if (mapped == nullptr) return false;
    mapped->segment->index->remove(mapped);
    hold(heap, mapped);
    return complete;
  } catch (const DeviceError& e) {  // the heap stays consistent, partly mapped; no plan then
    log().warn("vmm: laying out the pages of a planned heap failed: {}", e.what());
    return false;
  }
}

void VmmHeaps::stop_following(Heap& heap, bool departed) {
  heap.following = false;
  heap.departed = heap.departed || departed;
  heap.segment->owner->planned[static_cast<int>(heap.segment->pool)] = false;
}

Block* VmmHeaps::take_planned(StreamState& ss, Pool pool, std::size_t size) {
  Heap* heap = heap_of(ss, pool);
  if (heap == nullptr || !heap->following) {
    ss.planned[static_cast<int>(pool)] = false;
    return nullptr;
  }
  const std::vector<PlanStep>& steps = heap->active->steps;
  const PlanStep& step = steps[heap->cursor];
  Block* x = step.size == size ? find_planned(*heap, step) : nullptr;
  if (x == nullptr) {
    stop_following(*heap, true);
    return nullptr;
  }
  Block* b = carve(*heap, x, heap->segment->addr + step.offset, size);
  if (b == nullptr) {
    stop_following(*heap, true);
    return nullptr;
  }
  heap->placed[heap->cursor] = b;
  if (++heap->cursor == steps.size()) stop_following(*heap, false);
  return b;
}

// The free mapped block (in the index or held) that holds the start of the step's range, or
// nullptr. The search starts after the block of the step `below` when that block is still
// there (allocated at its planned address), else at the heap's start.
Block* VmmHeaps::find_planned(Heap& heap, const PlanStep& step) const {
  const Address at = heap.segment->addr + step.offset;
  Block* x = heap.segment->first;
  if (step.below != LayoutPlan::kNone) {
    const Block* anchor = heap.placed[step.below];
    const Address anchor_at = heap.segment->addr + heap.active->steps[step.below].offset;
    if (anchor != nullptr && anchor->segment == heap.segment && anchor->addr == anchor_at &&
        anchor->state != BlockState::free && anchor->addr + anchor->size <= at)
      x = anchor->next;
  }
  while (x != nullptr && x->addr + x->size <= at) x = x->next;
  if (x == nullptr || x->state != BlockState::free || !x->mapped || x->addr > at) return nullptr;
  return x;
}

// Cuts [at, at + size) out of the free mapped memory that starts with x (free, mapped, in the
// index or held, holding `at`): x and the free mapped blocks after it that the range needs are
// taken out of the index or the held pages and merged; the pieces before and after the range go
// to the index. Returns the range as a free block in no index, or nullptr (nothing changed but
// the merge) when free mapped memory does not reach its end.
Block* VmmHeaps::carve(Heap& heap, Block* x, Address at, std::size_t size) {
  const auto take_out = [&](Block* y) {
    if (y->held) unhold(heap, y, y->size);
    else y->segment->index->remove(y);
  };
  take_out(x);
  x = st_.coalesce(x);
  for (Block* n = x->next; x->addr + x->size < at + size && n != nullptr && n->state == BlockState::free && n->mapped;
       n = x->next) {
    take_out(n);
    st_.blocks.absorb_next(x);
  }
  FreeIndex& index = *x->segment->index;
  if (x->addr + x->size < at + size) {
    index.insert(st_.coalesce(x));
    return nullptr;
  }
  Block* mid = x;
  if (at > x->addr) {
    mid = st_.blocks.split_at(x, at - x->addr);
    index.insert(x);
  }
  if (mid->size > size) index.insert(st_.blocks.split_at(mid, size));
  return mid;
}

// Serves a request from held pages when a held block (with the free block before it) fits: as
// a growth would map (the shortfall in pages, at least a growth step), unholds the front of it
// and returns the free block it joined, in the index.
Block* VmmHeaps::from_held(Heap& heap, Pool pool, std::size_t size) {
  const std::size_t step = growth_step(pool);
  for (const auto& [addr, r] : heap.held) {
    const std::size_t before = free_mapped(r->prev) ? r->prev->size : 0;
    if (before + r->size < size) continue;
    const std::size_t need = size > before ? round_up(size - before, page_) : page_;
    Block* front = unhold(heap, r, std::min(r->size, std::max(need, step)));
    Block* merged = st_.coalesce(front);
    heap.segment->index->insert(merged);
    return merged;
  }
  return nullptr;
}

// Takes the first `bytes` of held block r out of the held pages; returns them as a free block
// in no index (not yet coalesced). The rest stays held.
Block* VmmHeaps::unhold(Heap& heap, Block* r, std::size_t bytes) {
  heap.held.erase(r->addr);
  if (bytes < r->size) {
    Block* rest = st_.blocks.split_at(r, bytes);
    rest->held = true;
    heap.held.emplace(rest->addr, rest);
  }
  r->held = false;
  held_bytes_[static_cast<int>(r->segment->pool)] -= r->size;
  return r;
}

// Gives every held block of `pool` back to the free index (before mapping, reclaiming, releasing),
// but those of heaps that follow a plan when `spare_following`.
void VmmHeaps::release_held(Pool pool, bool spare_following) {
  for (auto& [base, heap] : heaps_)
    if (heap.segment->pool == pool && !(spare_following && heap.following)) release_held(heap);
}

void VmmHeaps::release_held(Heap& heap) {
  while (!heap.held.empty()) {
    Block* r = heap.held.begin()->second;
    Block* merged = st_.coalesce(unhold(heap, r, r->size));
    heap.segment->index->insert(merged);
  }
}

void VmmHeaps::for_each_held(const std::function<void(const Block*)>& f) const {
  for (const auto& [base, heap] : heaps_)
    for (const auto& [addr, b] : heap.held) f(b);
}

// Physical memory doing nothing: cached chunks plus chunks that lie entirely under free blocks
// (but for those of heaps that follow a plan: their free pages are about to be used).
std::size_t VmmHeaps::idle_physical(Pool pool) const {
  std::size_t idle = 0;
  for (const Chunk& c : cached_)
    if (c.pool == pool) idle += c.size;
  for (const auto& [stream, ss] : st_.streams) {
    const Heap* heap = heap_of(*ss, pool);
    if (heap == nullptr || heap->following) continue;
    heap->segment->index->for_each([&](const Block* b) {
      if (b->segment != heap->segment) return;
      for (auto it = heap->chunks.lower_bound(b->addr);
           it != heap->chunks.end() && it->second.end() <= b->addr + b->size; ++it)
        idle += it->second.size;
    });
  }
  return idle;
}

// Unmaps every chunk of `pool` that lies entirely under a free block (after synchronizing the
// heap's stream, since kernels may still use memory freed in stream order), keeping the first
// `keep` bytes of them mapped (keep is decreased by what is kept), and sparing heaps that follow
// a plan when `spare_following`. The chunks go to the cache. Returns the bytes unmapped.
std::size_t VmmHeaps::reclaim_free_chunks(Pool pool, std::size_t& keep, bool spare_following) {
  std::size_t reclaimed = 0;
  for (auto& [stream, ss] : st_.streams) {
    Heap* heap = heap_of(*ss, pool);
    if (heap != nullptr && !(spare_following && heap->following)) reclaimed += reclaim_heap(*heap, keep);
  }
  return reclaimed;
}

// reclaim_free_chunks() for one heap.
std::size_t VmmHeaps::reclaim_heap(Heap& heap, std::size_t& keep) {
  std::vector<std::pair<Block*, std::vector<Chunk>>> work;
  heap.segment->index->for_each([&](Block* b) {
    if (b->segment != heap.segment) return;
    std::vector<Chunk> inside;
    for (auto it = heap.chunks.lower_bound(b->addr);
         it != heap.chunks.end() && it->second.end() <= b->addr + b->size; ++it) {
      if (it->second.size <= keep) {
        keep -= it->second.size;
        continue;
      }
      inside.push_back(it->second);
    }
    if (!inside.empty()) work.emplace_back(b, std::move(inside));
  });
  if (work.empty()) return 0;
  st_.device->synchronize_stream(heap.segment->owner->stream);
  st_.counters.count(&Stats::syncs);
  std::size_t reclaimed = 0;
  for (auto& [block, chunks] : work) {
    Block* cur = block;
    cur->segment->index->remove(cur);
    try {
      for (const Chunk& c : chunks) {
        cur = unmap_chunk(heap, cur, c);
        reclaimed += c.size;
      }
    } catch (...) {  // the device refused an unmap: what is left of the block stays free, mapped
      if (cur != nullptr) cur->segment->index->insert(cur);
      throw;
    }
    if (cur != nullptr) cur->segment->index->insert(cur);
  }
  return reclaimed;
}

// `b` is a free mapped block, out of the index, containing chunk `c`. Unmaps c; the pieces of b
// before c go back to the index, the unmapped middle to Heap::unmapped. Returns the piece after
// c (out of the index; nullptr if c ended b).
Block* VmmHeaps::unmap_chunk(Heap& heap, Block* b, const Chunk& c) {
  vm_.unmap(c.addr, c.size);  // first: if the device refuses, nothing has changed
  Block* mid = b;
  if (c.addr > b->addr) {
    mid = st_.blocks.split_at(b, c.addr - b->addr);
    b->segment->index->insert(b);
  }
  Block* after = mid->size > c.size ? st_.blocks.split_at(mid, c.size) : nullptr;
  st_.counters.count(&Stats::vm_unmaps);
  if (st_.hooks.observed())
    st_.hooks.notify(EventType::segment_unmap, c.addr, 0, c.size, heap.segment->owner->stream);
  heap.chunks.erase(c.addr);
  cached_.push_back(Chunk{0, c.size, c.handle, c.pool});
  mark_unmapped(heap, mid);
  return after;
}

// b: a free block, in no index, whose pages were just unmapped: merge with unmapped neighbours.
void VmmHeaps::mark_unmapped(Heap& heap, Block* b) {
  b->mapped = false;
  if (free_unmapped(b->prev)) {
    b = b->prev;
    heap.unmapped.erase(b->addr);
    st_.blocks.absorb_next(b);
  }
  if (free_unmapped(b->next)) {
    heap.unmapped.erase(b->next->addr);
    st_.blocks.absorb_next(b);
  }
  heap.unmapped[b->addr] = b;
}

std::size_t VmmHeaps::release_cached_chunks() {
  std::size_t released = 0;
  while (!cached_.empty()) {
    const Chunk c = cached_.back();
    vm_.release_physical(c.handle);
    cached_.pop_back();
    released += c.size;
    st_.counters.on_upstream_free(c.pool, c.size);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_free, 0, 0, c.size, kDefaultStream);
  }
  return released;
}

// Unmaps every entirely free chunk (empty_cache: but the first vmm_reserve bytes of them, over
// both pools) and releases every cached one.
std::size_t VmmHeaps::release(ReleaseGoal goal) {
  release_held(Pool::small);
  release_held(Pool::large);
  std::size_t keep = goal == ReleaseGoal::empty_cache ? st_.config.vmm_reserve : 0;
  reclaim_free_chunks(Pool::small, keep);
  reclaim_free_chunks(Pool::large, keep);
  return release_cached_chunks();
}

// Teardown: no kernel may still touch the pages; unmap and release everything, give the
// address ranges back.
void VmmHeaps::destroy() {
  st_.device->synchronize_device();
  try {
    for (auto& [base, heap] : heaps_) {
      for (auto& [a, c] : heap.chunks) {
        vm_.unmap(c.addr, c.size);
        vm_.release_physical(c.handle);
      }
      heap.chunks.clear();
      vm_.release_address_range(heap.segment->addr, heap.segment->size);
    }
    for (const Chunk& c : cached_) vm_.release_physical(c.handle);
    cached_.clear();
  } catch (const std::exception& e) {
    log().error("allocator teardown on {}: {}", st_.props.name, e.what());
  }
}

void VmmHeaps::check(Recount& rc) const {
  std::size_t heap_segments = 0;
  for (const auto& [addr, seg] : st_.segments) {
    if (!seg->heap) invariant_failed("segment " + hex(addr) + " is not a heap, but the mode is vmm");
    ++heap_segments;
  }
  if (heap_segments != heaps_.size()) invariant_failed("the heaps and the segments disagree");
  for (const auto& [base, heap] : heaps_) {
    auto it = st_.segments.find(base);
    if (it == st_.segments.end() || it->second.get() != heap.segment)
      invariant_failed("heap at " + hex(base) + " is not a segment of the allocator");
    if (heap_of(*heap.segment->owner, heap.segment->pool) != &heap)
      invariant_failed("heap at " + hex(base) + " is not its stream's heap of its pool");
    check_heap(heap);
    for (const auto& [a, c] : heap.chunks) {
      rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
      rc.add(c.pool, Metric::segments, 1);
    }
  }
  std::array<std::size_t, kNumPools> held{};
  for (const auto& [base, heap] : heaps_)
    for (const auto& [addr, b] : heap.held) held[static_cast<int>(b->segment->pool)] += b->size;
  if (held != held_bytes_) invariant_failed("the held byte counts are wrong");
  for (const Chunk& c : cached_) {
    if (c.addr != 0) invariant_failed("a cached chunk claims to be mapped");
    rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
    rc.add(c.pool, Metric::segments, 1);
  }
}

// Mapping consistency of a heap: chunks are page-aligned, inside the range, disjoint and each
// within the heap's own pool; mapped blocks lie on chunks and unmapped ones off them.
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
  std::size_t unmapped = 0;
  std::size_t held = 0;
  auto chunk_at = [&](Address addr) -> const Chunk* {  // the chunk covering addr, if any
    auto it = h.chunks.upper_bound(addr);
    if (it == h.chunks.begin()) return nullptr;
    --it;
    return addr < it->second.end() ? &it->second : nullptr;
  };
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    if (b->held) {
      ++held;
      auto it = h.held.find(b->addr);
      if (it == h.held.end() || it->second != b) invariant_failed("held block " + hex(b->addr) + " is not listed");
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
      if (u == h.unmapped.end() || u->second != b)
        invariant_failed("unmapped block " + hex(b->addr) + " is not listed");
    }
  }
  if (unmapped != h.unmapped.size()) invariant_failed("the heap's unmapped list has stale entries");
  if (held != h.held.size()) invariant_failed("the heap's held list has stale entries");
  check_epoch(h);
}

// The epoch's record: `live` counts the blocks in use; each has its open entry in the log (or
// none, past vmm_plan_max_blocks); a heap follows its plan iff its stream says so, and then has
// steps left.
void VmmHeaps::check_epoch(const Heap& h) const {
  const Segment& seg = *h.segment;
  const EpochLog& log = h.epoch;
  if (seg.epoch != &log) invariant_failed("the heap at " + hex(seg.addr) + " does not point to its epoch record");
  std::size_t in_use = 0;
  std::size_t open = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    if (b->state == BlockState::free) continue;
    ++in_use;
    if (b->epoch_slot == EpochLog::kNoSlot) {
      if (!log.full) invariant_failed("block " + hex(b->addr) + " is missing from its heap's epoch record");
      continue;
    }
    if (b->epoch_slot >= log.entries.size() || log.entries[b->epoch_slot].end != 0 ||
        log.entries[b->epoch_slot].start >= log.clock || log.entries[b->epoch_slot].size != b->size)
      invariant_failed("block " + hex(b->addr) + " has no open entry in its heap's epoch record");
    ++open;
  }
  if (in_use != log.live) invariant_failed("the heap at " + hex(seg.addr) + " counts " + std::to_string(log.live) +
                                           " blocks in use, not " + std::to_string(in_use));
  std::size_t open_entries = 0;
  for (const PlanBlock& e : log.entries) open_entries += e.end == 0 ? 1 : 0;
  if (open_entries != open) invariant_failed("the heap's epoch record has stale open entries");
  if (log.entries.size() > log.capacity) invariant_failed("the heap's epoch record is too long");
  std::size_t stored = 0;
  for (const auto& [key, p] : h.plans) stored += p.plan->steps.size();
  if (stored != h.stored_steps) invariant_failed("the heap's count of stored plan steps is wrong");
  if (h.following != seg.owner->planned[static_cast<int>(seg.pool)])
    invariant_failed("the heap at " + hex(seg.addr) + " and its stream disagree on following a plan");
  if (h.following && (h.active == nullptr || h.cursor >= h.active->steps.size() ||
                      h.placed.size() != h.active->steps.size()))
    invariant_failed("the heap at " + hex(seg.addr) + " follows a plan with no step left");
}

}  // namespace

std::unique_ptr<SegmentSource> make_vmm_heaps(AllocatorState& state) {
  VirtualMemory* vm = state.device->virtual_memory();
  if (vm == nullptr)
    throw ConfigError("tensorpool config: mode:vmm needs a device with virtual memory; " +
                      state.props.name + " has none");
  return std::make_unique<VmmHeaps>(state, *vm);
}

}  // namespace tensorpool::detail

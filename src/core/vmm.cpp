// vmm.cpp: virtual-memory mode. Physical pages, not address ranges, are the cached resource.
//
// Each stream has one heap per pool: a segment spanning a large reserved address range (twice
// the device capacity), tiled by blocks like any segment. Physical memory comes in chunks (one
// cuMemCreate handle each, a multiple of the page size) mapped at page-aligned addresses of the
// heap. Blocks under chunks are "mapped"; free address space without pages is held by free
// blocks with mapped == false, listed in Heap::unmapped and never in a free index.
//
// Because a heap is one contiguous range, free space of neighbouring chunks coalesces, so the
// "separate segments never merge" fragmentation of fixed segments does not arise. When the free
// index has no block large enough, grow_heap() maps more pages at the lowest unmapped hole whose
// span (with its free mapped neighbours) fits the request. The pages come, in this order, from
// chunks cached unmapped, from chunks that are entirely free somewhere else (unmapped there after
// synchronizing their stream: done when idle physical memory exceeds vmm_idle_limit, or when
// nothing more can be created), and finally from a new chunk (at least growth_step() bytes). Mapped
// memory stays mapped otherwise, so a workload that repeats itself makes no map calls.
#include <algorithm>
#include <string>

#include "core/allocator_impl.hpp"
#include "core/util.hpp"
#include "core/logging.hpp"

namespace tensorpool {

using detail::round_up;

using detail::Block;
using detail::Chunk;
using detail::Heap;
using detail::Segment;
using detail::StreamState;

namespace {
bool free_mapped(const Block* b) { return b != nullptr && b->state == BlockState::free && b->mapped; }
bool free_unmapped(const Block* b) { return b != nullptr && b->state == BlockState::free && !b->mapped; }
}  // namespace

Segment& Allocator::Impl::heap_for(StreamState& ss, Pool pool) {
  Segment*& slot = ss.heaps[static_cast<int>(pool)];
  if (slot != nullptr) return *slot;
  const std::size_t range = round_up(2 * props_.capacity, page_);
  const Address base = vm_->reserve_address_range(range, page_);
  if (base == 0) throw DeviceError("tensorpool: cannot reserve " + format_bytes(range) + " of address space on " + props_.name);
  auto seg = std::make_unique<Segment>();
  seg->addr = base;
  seg->size = range;
  seg->owner = &ss;
  seg->pool = pool;
  seg->index = &ss.index[pool == Pool::small ? detail::kSmallIndex : detail::kLargeIndex];
  seg->heap = std::make_unique<Heap>();
  Block* b = block_pool_.acquire();
  b->addr = base;
  b->size = range;
  b->segment = seg.get();
  b->mapped = false;
  seg->first = b;
  seg->heap->unmapped.emplace(base, b);
  slot = seg.get();
  segments_.emplace(base, std::move(seg));
  return *slot;
}

// Where to map pages for a request of `size`: the lowest unmapped hole that, with the free
// mapped block before it (and if need be the whole hole plus the one after it), fits; how many
// bytes of the hole to map (a growth step), and how many the request needs at least.
Allocator::Impl::Placement Allocator::Impl::place(const Segment& heap, std::size_t size) const {
  for (const auto& [addr, hole] : heap.heap->unmapped) {
    const std::size_t before = free_mapped(hole->prev) ? hole->prev->size : 0;
    const std::size_t need = size > before ? round_up(size - before, page_) : page_;
    if (need <= hole->size)
      return {hole, std::min(std::max(need, growth_step(heap.pool)), hole->size), need};
    const std::size_t after = free_mapped(hole->next) ? hole->next->size : 0;
    if (before + hole->size + after >= size) return {hole, hole->size, hole->size};
  }
  return {nullptr, 0, 0};
}

// The least memory a growth maps: 1/vmm_growth_divisor of what the pool holds, between one page
// and vmm_max_growth; the small pool grows a page at a time. Growing in steps keeps upstream
// calls few while bounding the memory mapped ahead of need at any peak to that fraction.
std::size_t Allocator::Impl::growth_step(Pool pool) const noexcept {
  if (pool == Pool::small) return page_;
  const auto held = static_cast<std::size_t>(pool_stats_[static_cast<int>(pool)][Metric::reserved_bytes].current);
  return round_up(std::clamp(held / config_.vmm_growth_divisor, page_, std::max(page_, config_.vmm_max_growth)), page_);
}

// Idle physical memory (free chunks, cached or mapped under free blocks) a growth tolerates
// before it remaps instead of creating: vmm_idle_limit, and at most 1/vmm_idle_divisor of the
// pool, so that a small pool does not keep a large share of itself idle while it grows.
std::size_t Allocator::Impl::idle_limit(Pool pool) const noexcept {
  const auto held = static_cast<std::size_t>(pool_stats_[static_cast<int>(pool)][Metric::reserved_bytes].current);
  return std::min(config_.vmm_idle_limit, held / config_.vmm_idle_divisor);
}

Block* Allocator::Impl::grow_heap(StreamState& ss, Pool pool, std::size_t size) {
  Segment& heap = heap_for(ss, pool);
  const auto reserved = static_cast<std::size_t>(total_stats_[Metric::reserved_bytes].current);
  const std::size_t want = round_up(size, page_);
  const bool pressure = (limit_ != 0 && reserved + want > limit_) || want > device_->free_memory();
  if (pressure || idle_physical(pool) > idle_limit(pool)) {
    std::size_t keep = 0;
    reclaim_free_chunks(pool, keep);
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
std::ptrdiff_t Allocator::Impl::pick_cached(Pool pool, std::size_t want, std::size_t room) const {
  std::ptrdiff_t covering = -1;
  std::ptrdiff_t largest = -1;
  for (std::size_t i = 0; i < cached_chunks_.size(); ++i) {
    const Chunk& c = cached_chunks_[i];
    if (c.pool != pool || c.size > room) continue;
    if (c.size >= want && (covering < 0 || c.size < cached_chunks_[static_cast<std::size_t>(covering)].size))
      covering = static_cast<std::ptrdiff_t>(i);
    if (largest < 0 || c.size > cached_chunks_[static_cast<std::size_t>(largest)].size)
      largest = static_cast<std::ptrdiff_t>(i);
  }
  return covering >= 0 ? covering : largest;
}

bool Allocator::Impl::create_chunk(std::size_t bytes, Pool pool, Chunk& out) {
  const auto reserved = static_cast<std::size_t>(total_stats_[Metric::reserved_bytes].current);
  if (limit_ != 0 && reserved + bytes > limit_) return false;
  const PhysicalHandle h = vm_->create_physical(bytes);
  if (h == 0) {
    ++counters_.upstream_alloc_failures;
    return false;
  }
  out = Chunk{0, bytes, h, pool};
  ++counters_.upstream_allocs;
  add_stat(Metric::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  add_stat(Metric::segments, pool, 1);
  if (has_observers_) notify(EventType::segment_alloc, 0, 0, bytes, kDefaultStream);
  return true;
}

// Maps chunks at the start of the hole until `where.bytes` are mapped (cached chunks first, then
// new ones; if the device or the limit refuses the growth step, only the `where.need` bytes the
// request needs). Returns the free mapped block that now starts at or before the hole's address
// (merged with its neighbours), or nullptr if nothing could be mapped; `complete` tells whether
// the needed bytes were.
Block* Allocator::Impl::map_into(Segment& heap, const Placement& where, Pool pool, bool& complete) {
  Block* hole = where.hole;
  const Address start = hole->addr;
  const Address needed_end = start + where.need;
  Address end = start + where.bytes;
  const Address hole_end = hole->addr + hole->size;
  Address cursor = start;
  auto place_chunk = [&](Chunk c) {
    try {
      vm_->map(cursor, c.size, c.handle);
    } catch (...) {
      cached_chunks_.push_back(c);  // keeps the physical memory accounted for
      throw;
    }
    c.addr = cursor;
    heap.heap->chunks.emplace(c.addr, c);
    ++counters_.vm_maps;
    if (has_observers_) notify(EventType::segment_map, c.addr, 0, c.size, heap.owner->stream);
    cursor += c.size;
  };
  try {
    while (cursor < end) {
      const std::ptrdiff_t i = pick_cached(pool, end - cursor, hole_end - cursor);
      if (i < 0) break;
      const Chunk c = cached_chunks_[static_cast<std::size_t>(i)];
      cached_chunks_.erase(cached_chunks_.begin() + i);
      place_chunk(c);
    }
    // New memory in chunks of at most vmm_max_chunk: a chunk is unmapped only whole, so
    // smaller chunks let free pages next to live blocks be reclaimed under pressure.
    const std::size_t max_chunk = std::max(page_, round_up(config_.vmm_max_chunk, page_));
    Chunk fresh;
    while (cursor < end) {
      if (!create_chunk(std::min(end - cursor, max_chunk), pool, fresh)) {
        if (cursor >= needed_end) break;
        end = needed_end;  // the step does not fit: map only what the request needs
        if (!create_chunk(std::min(end - cursor, max_chunk), pool, fresh)) break;
      }
      place_chunk(fresh);
    }
  } catch (...) {
    if (cursor == start) throw;  // nothing changed
    // Some chunks were mapped: record them in the blocks before reporting the error.
    complete = false;
    heap.heap->unmapped.erase(hole->addr);
    Block* rest = cursor < hole_end ? split_raw(hole, cursor - start) : nullptr;
    if (rest != nullptr) heap.heap->unmapped.emplace(rest->addr, rest);
    hole->mapped = true;
    Block* merged = coalesce(hole);
    merged->segment->index->insert(merged);
    throw;
  }
  complete = cursor >= needed_end;
  if (cursor == start) return nullptr;
  heap.heap->unmapped.erase(hole->addr);
  if (cursor < hole_end) {
    Block* rest = split_raw(hole, cursor - start);
    heap.heap->unmapped.emplace(rest->addr, rest);
  }
  hole->mapped = true;
  Block* merged = coalesce(hole);  // with free mapped neighbours
  heap.index->insert(merged);
  return merged;
}

// Physical memory doing nothing: cached chunks plus chunks that lie entirely under free blocks.
std::size_t Allocator::Impl::idle_physical(Pool pool) const {
  std::size_t idle = 0;
  for (const Chunk& c : cached_chunks_)
    if (c.pool == pool) idle += c.size;
  for (const auto& [stream, ss] : streams_) {
    const Segment* heap = ss->heaps[static_cast<int>(pool)];
    if (heap == nullptr) continue;
    heap->index->for_each([&](const Block* b) {
      if (b->segment != heap) return;
      for (auto it = heap->heap->chunks.lower_bound(b->addr);
           it != heap->heap->chunks.end() && it->second.end() <= b->addr + b->size; ++it)
        idle += it->second.size;
    });
  }
  return idle;
}

// Unmaps every chunk of `pool` that lies entirely under a free block (after synchronizing the
// heap's stream, since kernels may still use memory freed in stream order), keeping the first
// `keep` bytes of them mapped (keep is decreased by what is kept). The chunks go to the cache.
// Returns the bytes unmapped.
std::size_t Allocator::Impl::reclaim_free_chunks(Pool pool, std::size_t& keep) {
  std::size_t reclaimed = 0;
  for (auto& [stream, ss] : streams_) {
    Segment* heap = ss->heaps[static_cast<int>(pool)];
    if (heap == nullptr) continue;
    std::vector<std::pair<Block*, std::vector<Chunk>>> work;
    heap->index->for_each([&](Block* b) {
      if (b->segment != heap) return;
      std::vector<Chunk> inside;
      for (auto it = heap->heap->chunks.lower_bound(b->addr);
           it != heap->heap->chunks.end() && it->second.end() <= b->addr + b->size; ++it) {
        if (it->second.size <= keep) {
          keep -= it->second.size;
          continue;
        }
        inside.push_back(it->second);
      }
      if (!inside.empty()) work.emplace_back(b, std::move(inside));
    });
    if (work.empty()) continue;
    device_->synchronize_stream(ss->stream);
    ++counters_.syncs;
    for (auto& [block, chunks] : work) {
      Block* cur = block;
      cur->segment->index->remove(cur);
      for (const Chunk& c : chunks) {
        cur = unmap_chunk(*heap, cur, c);
        reclaimed += c.size;
      }
      if (cur != nullptr) {
        cur->segment->index->insert(cur);
      }
    }
  }
  return reclaimed;
}

// `b` is a free mapped block, out of the index, containing chunk `c`. Unmaps c; the pieces of b
// before c go back to the index, the unmapped middle to Heap::unmapped. Returns the piece after
// c (out of the index; nullptr if c ended b).
Block* Allocator::Impl::unmap_chunk(Segment& heap, Block* b, const Chunk& c) {
  Block* mid = b;
  if (c.addr > b->addr) {
    mid = split_raw(b, c.addr - b->addr);
    b->segment->index->insert(b);
  }
  Block* after = mid->size > c.size ? split_raw(mid, c.size) : nullptr;
  vm_->unmap(c.addr, c.size);
  ++counters_.vm_unmaps;
  if (has_observers_) notify(EventType::segment_unmap, c.addr, 0, c.size, heap.owner->stream);
  heap.heap->chunks.erase(c.addr);
  cached_chunks_.push_back(Chunk{0, c.size, c.handle, c.pool});
  mark_unmapped(heap, mid);
  return after;
}

// b: a free block, in no index, whose pages were just unmapped: merge with unmapped neighbours.
void Allocator::Impl::mark_unmapped(Segment& heap, Block* b) {
  b->mapped = false;
  if (free_unmapped(b->prev)) {
    b = b->prev;
    heap.heap->unmapped.erase(b->addr);
    absorb_next(b);
  }
  if (free_unmapped(b->next)) {
    heap.heap->unmapped.erase(b->next->addr);
    absorb_next(b);
  }
  heap.heap->unmapped[b->addr] = b;
}

std::size_t Allocator::Impl::release_cached_chunks() {
  std::size_t released = 0;
  while (!cached_chunks_.empty()) {
    const Chunk c = cached_chunks_.back();
    vm_->release_physical(c.handle);
    cached_chunks_.pop_back();
    released += c.size;
    ++counters_.upstream_frees;
    add_stat(Metric::reserved_bytes, c.pool, -static_cast<std::int64_t>(c.size));
    add_stat(Metric::segments, c.pool, -1);
    if (has_observers_) notify(EventType::segment_free, 0, 0, c.size, kDefaultStream);
  }
  return released;
}

// Teardown: unmap and release everything, give the address ranges back.
void Allocator::Impl::destroy_heaps() noexcept {
  try {
    for (auto& [addr, seg] : segments_) {
      if (!seg->heap) continue;
      for (auto& [a, c] : seg->heap->chunks) {
        vm_->unmap(c.addr, c.size);
        vm_->release_physical(c.handle);
      }
      seg->heap->chunks.clear();
      vm_->release_address_range(seg->addr, seg->size);
    }
    for (const Chunk& c : cached_chunks_) vm_->release_physical(c.handle);
    cached_chunks_.clear();
  } catch (const std::exception& e) {
    detail::log().error("allocator teardown on {}: {}", props_.name, e.what());
  }
}

}  // namespace tensorpool

// vmm_pages.cpp: the pages of the vmm heaps (vmm_heaps.hpp): where a growth maps and how much,
// the sizes of new chunks, mapping chunks into a hole, the cache of unmapped chunks, and the
// reclaim of idle ones.
//
// New chunks for a request are at most vmm_max_chunk; with vmm_chunk_divisor N, at most request/N
// (but at least a floor set by the device's capacity, chunk_floor()), and they end at the pages
// around where the request's block ends (new_chunk_size()); those mapped into a plan's holes may
// be larger (up to 1/N of the plan's height). Mapped memory stays mapped but for a reclaim:
// a chunk entirely under a free block is unmapped into the cache (after synchronizing its heap's
// stream: kernels may still use memory freed in stream order) when idle memory exceeds the idle
// limit (but not the pages of a heap whose idle pages cycle with its steps: idle_pages()), under
// pressure, and on release.
#include <algorithm>
#include <utility>
#include <vector>

#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

namespace {

bool free_unmapped(const Block* b) {
  return b != nullptr && b->state == BlockState::free && !b->mapped && !b->asleep;
}

}  // namespace

// --- the chunk cache ------------------------------------------------------------------------

std::optional<Chunk> ChunkCache::take(Pool pool, std::size_t want, std::size_t room) {
  std::ptrdiff_t covering = -1;
  std::ptrdiff_t largest = -1;
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    if (c.pool != pool || c.size > room) continue;
    if (c.size >= want && (covering < 0 || c.size < chunks_[static_cast<std::size_t>(covering)].size))
      covering = static_cast<std::ptrdiff_t>(i);
    if (largest < 0 || c.size > chunks_[static_cast<std::size_t>(largest)].size)
      largest = static_cast<std::ptrdiff_t>(i);
  }
  const std::ptrdiff_t i = covering >= 0 ? covering : largest;
  if (i < 0) return std::nullopt;
  const Chunk c = chunks_[static_cast<std::size_t>(i)];
  chunks_.erase(chunks_.begin() + i);
  return c;
}

std::optional<Chunk> ChunkCache::take_handle(PhysicalHandle handle) {
  const auto it = std::find_if(chunks_.begin(), chunks_.end(), [&](const Chunk& c) { return c.handle == handle; });
  if (it == chunks_.end()) return std::nullopt;
  const Chunk c = *it;
  chunks_.erase(it);
  return c;
}

std::vector<Chunk> ChunkCache::take_all(Pool pool) {
  std::vector<Chunk> taken;
  std::erase_if(chunks_, [&](const Chunk& c) {
    if (c.pool != pool) return false;
    taken.push_back(c);
    return true;
  });
  return taken;
}

std::size_t ChunkCache::bytes(Pool pool) const noexcept {
  std::size_t bytes = 0;
  for (const Chunk& c : chunks_)
    if (c.pool == pool) bytes += c.size;
  return bytes;
}

// --- where and how much a growth maps -------------------------------------------------------

// Where to map pages for a request of `size`: the lowest unmapped hole that, with the free
// mapped block before it (and if need be the whole hole plus the one after it), fits; how many
// bytes of the hole to map (a growth step), and how many the request needs at least.
VmmHeaps::Placement VmmHeaps::place(const Heap& heap, std::size_t size) const {
  for (const auto& [addr, hole] : heap.unmapped) {
    const std::size_t before = free_mapped(hole->prev) ? hole->prev->size : 0;
    const std::size_t need = size > before ? round_up(size - before, page_) : page_;
    const Address block_end = (before != 0 ? hole->prev->addr : hole->addr) + size;
    if (need <= hole->size)
      return {.hole = hole,
              .bytes = std::min(std::max(need, growth_step(heap.pool())), hole->size),
              .need = need,
              .request = size,
              .block_end = block_end};
    const std::size_t after = free_mapped(hole->next) ? hole->next->size : 0;
    if (before + hole->size + after >= size)
      return {.hole = hole, .bytes = hole->size, .need = hole->size, .request = size, .block_end = block_end};
  }
  return {};
}

// The least memory a growth maps: 1/vmm_growth_divisor of what the pool holds, between one page
// and vmm_max_growth; the small pool grows a page at a time. Growing in steps keeps upstream
// calls few while bounding the memory mapped ahead of need at any peak to that fraction.
std::size_t VmmHeaps::growth_step(Pool pool) const noexcept {
  if (pool == Pool::small) return page_;
  // What the pool has exposed (held pages aside): the same figure at the same point of a
  // repeated step as when the pool grew there.
  const std::size_t exposed = st_.counters.reserved(pool) - held_bytes(pool);
  return round_up(std::max(page_, st_.growth_share(exposed)), page_);
}

// Idle physical memory (free chunks, cached or mapped under free blocks) a growth tolerates
// before it remaps instead of creating: vmm_idle_limit, and at most 1/vmm_idle_divisor of the
// pool, so that a small pool does not keep a large share of itself idle while it grows.
std::size_t VmmHeaps::idle_limit(Pool pool) const noexcept {
  return std::min(st_.config.vmm_idle_limit, st_.counters.reserved(pool) / st_.config.vmm_idle_divisor);
}

// What a growth of the heap by `size` bytes does with its own idle pages. It remaps them
// (synchronizing its stream) rather than create memory when idle memory exceeds the idle limit
// and the heap does not follow a plan (its free pages are about to be used where they lie). But
// not when they cycle: nothing was created in the pool since the heap's last idle reclaim, so
// what it lacks again is what that reclaim moved (a step whose shapes vary, such as an expert's
// load, frees and needs back the same pages each step), and the growth maps at most the idle
// limit. It then creates that rather than move pages (and synchronize) in every step; the next
// growth that finds idle memory over the limit remaps again (the pool grew since).
IdlePages VmmHeaps::idle_pages(const Heap& heap, std::size_t size) const {
  const Pool pool = heap.pool();
  const std::size_t limit = idle_limit(pool);
  if (plan_asks_source(heap.cursor.state()) || idle_physical(pool) <= limit) return IdlePages::keep;
  if (heap.reserved_at_idle_reclaim == 0 || st_.counters.reserved(pool) > heap.reserved_at_idle_reclaim)
    return IdlePages::remap;
  const Placement growth = place(heap, size);
  return growth.hole == nullptr || growth.bytes > limit ? IdlePages::remap : IdlePages::cycle;
}

// The size of the next new chunk, mapped at `at` by a growth that maps up to `end`: at most
// vmm_max_chunk. With vmm_chunk_divisor N also at most the largest power of two of pages not
// above request/N (but at least chunk_floor()), and a chunk never crosses the page boundaries
// around the end of the request's block (for a request within one chunk, only the one after
// it): the memory after the block then lies in chunks of its own, which can be unmapped whole
// once free, while the block lives. Small chunks are what lets a heap near the device's
// capacity give back free pages beside live blocks; the price is calls. A growth for a plan maps
// pages that the epoch following it uses whole (map_planned()): its chunks may be as large as
// 1/N of the plan's height (`request` there), for fewer calls, and are never made smaller than
// vmm_max_chunk. The height, not the hole: a hole a step maps after empty_cache() may be a small
// part of a plan whose weights fill the rest.
std::size_t VmmHeaps::new_chunk_size(const Placement& where, Address at, Address end) const {
  if (where.growth == Growth::plan) return std::min(end - at, planned_chunk_size(where.request));
  std::size_t limit = std::max(page_, round_up(st_.config.vmm_max_chunk, page_));
  const std::size_t divisor = st_.config.vmm_chunk_divisor;
  if (divisor == 0) return std::min(end - at, limit);
  const Address last_page = where.block_end / page_ * page_;  // page holding the block's end
  const Address past_block = round_up(where.block_end, page_);
  std::size_t pow2 = page_;
  while (pow2 <= where.request / divisor / 2) pow2 *= 2;
  limit = std::min(limit, std::max(pow2, chunk_floor(at >= past_block, where.left)));
  // A request no larger than one chunk gets one chunk up to the page past its block, the page
  // holding its end included: one call fewer per growth, and what a live neighbour on that page
  // can pin is at most one such chunk.
  if (at < past_block && where.request <= limit && past_block - at <= limit) limit = past_block - at;
  else if (at < last_page) limit = std::min<std::size_t>(limit, last_page - at);
  else if (at < past_block) limit = std::min<std::size_t>(limit, past_block - at);
  return std::min(end - at, limit);
}

// The chunks of a growth for a plan `height` bytes high: the largest power of two of pages not
// above height/vmm_chunk_divisor, raised to vmm_max_chunk.
std::size_t VmmHeaps::planned_chunk_size(std::size_t height) const noexcept {
  const std::size_t divisor = st_.config.vmm_chunk_divisor;
  std::size_t pow2 = page_;
  while (divisor != 0 && pow2 <= height / divisor / 2) pow2 *= 2;
  return std::max({page_, round_up(st_.config.vmm_max_chunk, page_), pow2});
}

// The smallest chunk vmm_chunk_divisor makes: 1/vmm_chunk_floor_divisor of the memory the
// allocator may use (the device's capacity, or the memory limit if lower), in whole pages, and
// twice that for the chunks a growth maps past the request's block (memory mapped ahead of
// need). What a free, partly used chunk strands is then a bounded share of the device, while a
// request of a few MiB no longer makes chunks of a page or two. Once the device is more than
// three-quarters full the share is of four times what is `left` (st_.room_left() when the growth
// began) instead: near a full device chunks shrink with what remains, so the pages a partly used
// one strands stay a small share of it too. (Four: the knee measured on a 2.7B training step
// fitted by bisection, docs/benchmarks.md, "Chunks that shrink as the device fills".)
std::size_t VmmHeaps::chunk_floor(bool past_block, std::size_t left) const noexcept {
  const std::size_t divisor = st_.config.vmm_chunk_floor_divisor;
  if (divisor == 0) return page_;
  std::size_t room = st_.limit == 0 ? st_.props.capacity : std::min(st_.limit, st_.props.capacity);
  if (left < room / kFloorShareOfLeft) room = left * kFloorShareOfLeft;
  const std::size_t floor = room / divisor * (past_block ? 2 : 1) / page_ * page_;
  return std::max(page_, floor);
}

// --- mapping --------------------------------------------------------------------------------

std::optional<Chunk> VmmHeaps::create_chunk(std::size_t bytes, Pool pool) {
  if (!st_.within_limit(bytes)) return std::nullopt;
  const PhysicalHandle h = vm_.create_physical(bytes);
  if (h == 0) {
    st_.counters.count(&Stats::upstream_alloc_failures);
    return std::nullopt;
  }
  st_.counters.on_upstream_alloc(pool, bytes);
  if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_alloc, 0, 0, bytes, kDefaultStream);
  return Chunk{0, bytes, h, pool};
}

// Maps chunks at the start of the hole until `where.bytes` are mapped (cached chunks first, those
// that end within the hole and `where.limit`, then new ones; if the device or the limit refuses
// the growth step, only the `where.need` bytes the request needs). The mapped bytes join the free
// block before the hole (or make a new one), in the index. A DeviceError propagates with the
// blocks saying what was mapped.
VmmHeaps::Mapped VmmHeaps::map_into(Heap& heap, const Placement& where) {
  const Pool pool = heap.pool();
  Block* hole = where.hole;
  const Address start = hole->addr;
  const Address needed_end = start + where.need;
  Address end = start + where.bytes;
  const Address hole_end = hole->addr + hole->size;
  const Address room_end = where.limit != 0 ? std::min(where.limit, hole_end) : hole_end;
  Address cursor = start;
  auto place_chunk = [&](Chunk c) {
    try {
      vm_.map(cursor, c.size, c.handle);
    } catch (...) {
      cached_.put(c);  // keeps the physical memory accounted for
      throw;
    }
    c.addr = cursor;
    heap.add_chunk(c);
    st_.counters.count(&Stats::vm_maps);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_map, c.addr, 0, c.size, heap.stream());
    cursor += c.size;
  };
  // The mapped bytes [start, cursor) become part of the free block before the hole, or a new
  // one; the rest of the hole stays unmapped.
  auto record_mapped = [&]() -> Block* {
    heap.unmapped.erase(hole->addr);
    if (cursor < hole_end) {
      Block* rest = heap.blocks().split_at(hole, cursor - start);
      heap.unmapped.emplace(rest->addr, rest);
    }
    hole->mapped = true;
    Block* merged = st_.coalesce(hole);  // with free mapped neighbours
    heap.index().insert(merged);
    return merged;
  };
  try {
    while (cursor < end) {
      const std::optional<Chunk> cached = cached_.take(pool, end - cursor, room_end - cursor);
      if (!cached) break;
      place_chunk(*cached);
    }
    // New memory: a chunk is unmapped only whole, so smaller chunks let free pages next to
    // live blocks be reclaimed under pressure (new_chunk_size()).
    while (cursor < end) {
      std::optional<Chunk> fresh = create_chunk(new_chunk_size(where, cursor, end), pool);
      if (!fresh) {
        if (cursor >= needed_end) break;
        end = needed_end;  // the step does not fit: map only what the request needs
        fresh = create_chunk(new_chunk_size(where, cursor, end), pool);
        if (!fresh) break;
      }
      place_chunk(*fresh);
    }
  } catch (...) {
    if (cursor == start) throw;  // nothing changed
    record_mapped();  // some chunks were mapped: the blocks say so before the error goes on
    throw;
  }
  if (cursor == start) return {};
  return {.block = record_mapped(), .complete = cursor >= needed_end};
}

// --- idle memory and its reclaim ------------------------------------------------------------

// Physical memory doing nothing: cached chunks plus chunks that lie entirely under free blocks
// (but for those of heaps that follow a plan: their free pages are about to be used).
std::size_t VmmHeaps::idle_physical(Pool pool) const {
  std::size_t idle = cached_.bytes(pool);
  for (const auto& [stream, ss] : st_.streams) {
    const Heap* heap = heap_of(*ss, pool);
    if (heap == nullptr || plan_asks_source(heap->cursor.state())) continue;
    heap->index().for_each([&](const Block* b) {
      if (b->segment != heap->segment) return;
      for (auto it = heap->chunks.lower_bound(b->addr); it != heap->chunks.end() && it->second.end() <= b->addr + b->size;
           ++it)
        if (!it->second.stitched()) idle += it->second.size;
    });
  }
  return idle;
}

// Unmaps every chunk of `pool` that lies entirely under a free block, into the cache, but the
// first `keep` bytes of them, and those of the heaps `spare` names.
VmmHeaps::Reclaimed VmmHeaps::reclaim_free_chunks(Pool pool, std::size_t keep, Spare spare) {
  Reclaimed total{.bytes = 0, .keep_left = keep};
  for (auto& [stream, ss] : st_.streams) {
    Heap* heap = heap_of(*ss, pool);
    if (heap == nullptr || (spare == Spare::following && plan_asks_source(heap->cursor.state()))) continue;
    const Reclaimed r = reclaim_heap(*heap, total.keep_left);
    total.bytes += r.bytes;
    total.keep_left = r.keep_left;
  }
  return total;
}

// reclaim_free_chunks() for one heap. The heap's stream is synchronized first (kernels may still
// use memory freed in stream order), unless the caller knows its work is done.
VmmHeaps::Reclaimed VmmHeaps::reclaim_heap(Heap& heap, std::size_t keep, StreamWork work) {
  std::vector<std::pair<Block*, std::vector<Chunk>>> to_unmap;
  heap.index().for_each([&](Block* b) {
    if (b->segment != heap.segment) return;
    std::vector<Chunk> inside;
    for (auto it = heap.chunks.lower_bound(b->addr); it != heap.chunks.end() && it->second.end() <= b->addr + b->size;
         ++it) {
      if (it->second.stitched()) continue;  // no memory of its own to reclaim (vmm_stitch.cpp)
      if (it->second.size <= keep) {
        keep -= it->second.size;
        continue;
      }
      inside.push_back(it->second);
    }
    if (!inside.empty()) to_unmap.emplace_back(b, std::move(inside));
  });
  if (to_unmap.empty()) return {.bytes = 0, .keep_left = keep};
  if (work == StreamWork::may_run) {
    st_.device->synchronize_stream(heap.stream());
    st_.counters.count(&Stats::syncs);
  }
  std::size_t reclaimed = 0;
  for (auto& [block, chunks] : to_unmap) {
    Block* cur = block;
    heap.index().remove(cur);
    try {
      for (const Chunk& c : chunks) {
        cur = unmap_chunk(heap, cur, c);
        reclaimed += c.size;
      }
    } catch (...) {  // the device refused an unmap: what is left of the block stays free, mapped
      if (cur != nullptr) heap.index().insert(cur);
      throw;
    }
    if (cur != nullptr) heap.index().insert(cur);
  }
  return {.bytes = reclaimed, .keep_left = keep};
}

// `b` is a free mapped block, out of the index, containing chunk `c`. Unmaps c (into the cache;
// a stitched chunk's pages stay its owner's: unstitch_free() gives them back); the pieces of b
// before c go back to the index, the unmapped middle to Heap::unmapped. Returns the piece after
// c (out of the index; nullptr if c ended b).
Block* VmmHeaps::unmap_chunk(Heap& heap, Block* b, const Chunk& c) {
  vm_.unmap(c.addr, c.size);  // first: if the device refuses, nothing has changed
  Block* mid = b;
  if (c.addr > b->addr) {
    mid = heap.blocks().split_at(b, c.addr - b->addr);
    heap.index().insert(b);
  }
  Block* after = mid->size > c.size ? heap.blocks().split_at(mid, c.size) : nullptr;
  st_.counters.count(&Stats::vm_unmaps);
  if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_unmap, c.addr, 0, c.size, heap.stream());
  heap.remove_chunk(c);
  if (!c.stitched()) cached_.put(c);  // a stitched one's pages are another chunk's (vmm_stitch.cpp)
  mark_unmapped(heap, mid);
  return after;
}

// b: a free block, in no index, whose pages were just unmapped: merge with unmapped neighbours.
void VmmHeaps::mark_unmapped(Heap& heap, Block* b) {
  b->mapped = false;
  if (free_unmapped(b->prev)) {
    b = b->prev;
    heap.unmapped.erase(b->addr);
    heap.blocks().absorb_next(b);
  }
  if (free_unmapped(b->next)) {
    heap.unmapped.erase(b->next->addr);
    heap.blocks().absorb_next(b);
  }
  heap.unmapped[b->addr] = b;
}

std::size_t VmmHeaps::release_cached_chunks() { return release_chunks(cached_.take_all()); }

// Releases `chunks` (unmapped, taken from the cache); on a DeviceError those not released go
// back to the cache, accounted for.
std::size_t VmmHeaps::release_chunks(std::vector<Chunk> chunks) {
  std::size_t released = 0;
  while (!chunks.empty()) {
    try {
      release_chunk(chunks.back());
    } catch (...) {  // what is not released stays cached, accounted for
      for (const Chunk& left : chunks) cached_.put(left);
      throw;
    }
    released += chunks.back().size;
    chunks.pop_back();
  }
  return released;
}

// c, unmapped and in no cache, goes back to the device (a DeviceError if it refuses: the caller
// keeps c accounted for).
void VmmHeaps::release_chunk(const Chunk& c) {
  vm_.release_physical(c.handle);
  st_.counters.on_upstream_free(c.pool, c.size);
  if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_free, 0, 0, c.size, kDefaultStream);
}

}  // namespace tensorpool::detail

// inspect.cpp: the read-only views of the allocator: stats, the fragmentation report,
// snapshots, and check_invariants(), which recomputes everything from the blocks and compares.
#include <algorithm>
#include <string>

#include "core/allocator_impl.hpp"
#include "core/util.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::hex;

using detail::Block;
using detail::Segment;
using detail::StreamState;

Stats Allocator::Impl::stats() const {
  Lock lock(mutex_);
  Stats s = counters_;
  s.pool = pool_stats_;
  s.total = total_stats_;
  return s;
}

MemoryUsage Allocator::Impl::usage() const {
  Lock lock(mutex_);
  const auto cur = [&](Metric m) { return static_cast<std::size_t>(total_stats_[m].current); };
  return {cur(Metric::reserved_bytes), cur(Metric::allocated_bytes), cur(Metric::requested_bytes),
          cur(Metric::active_bytes)};
}

void Allocator::Impl::reset_peaks() {
  Lock lock(mutex_);
  auto reset = [](PoolStats& p) {
    for (auto& stat : p.metrics) stat.peak = stat.current;
  };
  for (auto& p : pool_stats_) reset(p);
  reset(total_stats_);
}

FragmentationReport Allocator::Impl::fragmentation() const {
  Lock lock(mutex_);
  FragmentationReport r;
  const auto cur = [&](Metric m) { return static_cast<std::size_t>(total_stats_[m].current); };
  r.reserved = cur(Metric::reserved_bytes);
  r.allocated = cur(Metric::allocated_bytes);
  r.requested = cur(Metric::requested_bytes);
  r.pending_free = cur(Metric::active_bytes) - r.allocated;
  r.internal_waste = r.allocated - r.requested;
  r.reserved_unallocated = r.reserved - r.allocated;
  for (const auto& [stream, ss] : streams_) {
    for (const auto& index : ss->index) {
      r.total_free += index.bytes();
      r.free_blocks += index.count();
      index.for_each([&](const Block* b) {
        if (!b->segment->is_split()) return;
        r.inactive_split += b->size;
        ++r.inactive_split_blocks;
      });
    }
  }
  r.largest_free = largest_free_block();
  r.utilization = r.reserved == 0 ? 1.0 : static_cast<double>(r.allocated) / static_cast<double>(r.reserved);
  r.external_fragmentation =
      r.total_free == 0 ? 0.0
                        : 1.0 - static_cast<double>(r.largest_free) / static_cast<double>(r.total_free);
  return r;
}

Snapshot Allocator::Impl::snapshot() const {
  Lock lock(mutex_);
  Snapshot snap;
  snap.segments.reserve(segments_.size());
  for (const auto& [addr, seg] : segments_) {
    SegmentInfo info{seg->addr, seg->size, seg->owner->stream, seg->pool, seg->oversize, seg->heap != nullptr, {}};
    info.blocks.reserve(seg->blocks);
    for (const Block* b = seg->first; b != nullptr; b = b->next)
      info.blocks.push_back({b->addr, b->size, b->requested, b->state, b->mapped});
    snap.segments.push_back(std::move(info));
  }
  return snap;
}

void Allocator::Impl::check_invariants() const {
  Lock lock(mutex_);
  check_invariants_locked();
}

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw InvariantError("tensorpool invariant violated: " + what);
}


// The per-pool quantities recomputed from the blocks.
struct Recount {
  std::array<std::int64_t, kNumMetrics> pool[kNumPools] = {};
  void add(Pool p, Metric m, std::int64_t v) { pool[static_cast<int>(p)][static_cast<int>(m)] += v; }
};

void check_segment(const Segment& seg, Recount& rc, std::size_t& free_blocks) {
  if (seg.first == nullptr || seg.first->prev != nullptr || seg.first->addr != seg.addr)
    fail("segment " + hex(seg.addr) + " does not start with its first block");
  std::size_t count = 0;
  std::size_t covered = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    ++count;
    if (b->segment != &seg) fail("block " + hex(b->addr) + " points to the wrong segment");
    if (b->size == 0 || b->size % kMinBlockSize != 0)
      fail("block " + hex(b->addr) + " has size " + std::to_string(b->size));
    if (b->addr != seg.addr + covered) fail("gap or overlap before block " + hex(b->addr));
    if (b->next != nullptr && b->next->prev != b) fail("broken prev link after " + hex(b->addr));
    if (b->next != nullptr && b->state == BlockState::free && b->next->state == BlockState::free &&
        b->mapped == b->next->mapped)
      fail("adjacent free blocks at " + hex(b->addr) + " were not coalesced");
    if (!b->mapped && (b->state != BlockState::free || !seg.heap))
      fail("block " + hex(b->addr) + " is in use or outside a heap but has no pages");
    covered += b->size;
    const auto sz = static_cast<std::int64_t>(b->size);
    if (b->state == BlockState::allocated) {
      rc.add(seg.pool, Metric::allocated_bytes, sz);
      rc.add(seg.pool, Metric::requested_bytes, static_cast<std::int64_t>(b->requested));
      rc.add(seg.pool, Metric::allocations, 1);
      if (b->requested == 0 || round_size(b->requested) > b->size)
        fail("allocated block " + hex(b->addr) + " has requested " + std::to_string(b->requested));
    }
    if (b->state != BlockState::free) {
      rc.add(seg.pool, Metric::active_bytes, sz);
      rc.add(seg.pool, Metric::active_blocks, 1);
    } else if (b->mapped) {
      ++free_blocks;
    }
    if (b->state == BlockState::pending_free && b->pending_events == 0)
      fail("pending block " + hex(b->addr) + " has no outstanding event");
  }
  if (covered != seg.size) fail("blocks of segment " + hex(seg.addr) + " do not add up to its size");
  if (count != seg.blocks) fail("segment " + hex(seg.addr) + " block count is wrong");
  if (seg.oversize && count != 1) fail("oversize segment " + hex(seg.addr) + " was split");
  if (seg.heap) return;  // a heap's reserved memory is its chunks (check_heap)
  rc.add(seg.pool, Metric::reserved_bytes, static_cast<std::int64_t>(seg.size));
  rc.add(seg.pool, Metric::segments, 1);
}

}  // namespace

void Allocator::Impl::check_invariants_locked() const {
  Recount rc;
  std::size_t free_blocks = 0;
  Address previous_end = 0;
  for (const auto& [addr, seg] : segments_) {
    if (addr != seg->addr) fail("segment map key differs from segment address " + hex(seg->addr));
    if (seg->addr < previous_end) fail("segment " + hex(seg->addr) + " overlaps the previous one");
    if (seg->index != &seg->owner->index[seg->pool == Pool::small ? detail::kSmallIndex
                                         : seg->oversize          ? detail::kOversizeIndex
                                                                  : detail::kLargeIndex])
      fail("segment " + hex(seg->addr) + " points to the wrong free index");
    previous_end = seg->end();
    check_segment(*seg, rc, free_blocks);
    if (seg->heap) {
      check_heap(*seg);
      for (const auto& [a, c] : seg->heap->chunks) {
        rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
        rc.add(c.pool, Metric::segments, 1);
      }
    }
  }
  for (const detail::Chunk& c : cached_chunks_) {
    if (c.addr != 0) fail("a cached chunk claims to be mapped");
    rc.add(c.pool, Metric::reserved_bytes, static_cast<std::int64_t>(c.size));
    rc.add(c.pool, Metric::segments, 1);
  }
  // Free indexes: exactly the free blocks, each in its own bin of its segment's index.
  std::size_t listed = 0;
  std::size_t pending_events = 0;
  for (const auto& [stream, ss] : streams_) {
    for (const auto& index : ss->index) {
      if (!index.bitmaps_consistent()) fail("free-index bitmaps disagree with the bins");
      std::size_t n = 0;
      std::size_t bytes = 0;
      index.for_each([&](const Block* b) {
        if (b->state != BlockState::free) fail("non-free block " + hex(b->addr) + " in a free index");
        if (b->segment->index != &index) fail("free block " + hex(b->addr) + " in another stream's index");
        ++n;
        bytes += b->size;
      });
      if (n != index.count() || bytes != index.bytes()) fail("free-index totals are wrong");
      listed += n;
    }
    for (const auto& pe : ss->pending)
      if (pe.block->state != BlockState::pending_free) fail("pending event for a non-pending block");
    pending_events += ss->pending.size();
  }
  if (listed != free_blocks)
    fail(std::to_string(free_blocks) + " free blocks but " + std::to_string(listed) + " listed");
  if (pending_events != pending_total_) fail("pending event count is wrong");
  // Live map: exactly the allocated blocks.
  std::size_t live = 0;
  live_.for_each([&](Address a, const Block* b) {
    if (b->addr != a || b->state != BlockState::allocated) fail("live map entry " + hex(a) + " is stale");
    ++live;
  });
  // Stats equal the recount.
  std::int64_t allocations = 0;
  for (int p = 0; p < kNumPools; ++p) {
    for (int m = 0; m < kNumMetrics; ++m) {
      const auto metric = static_cast<Metric>(m);
      const std::int64_t have = pool_stats_[p].metrics[m].current;
      if (have != rc.pool[p][m])
        fail(std::string("stat ") + to_string(metric) + " of pool " + to_string(static_cast<Pool>(p)) +
             " is " + std::to_string(have) + ", recount " + std::to_string(rc.pool[p][m]));
      const std::int64_t sum = pool_stats_[0].metrics[m].current + pool_stats_[1].metrics[m].current;
      if (total_stats_.metrics[m].current != sum) fail(std::string("total ") + to_string(metric) + " is wrong");
      if (pool_stats_[p].metrics[m].peak < have) fail(std::string("peak of ") + to_string(metric) + " is below current");
    }
    allocations += rc.pool[p][static_cast<int>(Metric::allocations)];
  }
  if (static_cast<std::int64_t>(live) != allocations) fail("live map size differs from allocated blocks");
}

// Mapping consistency of a heap: chunks are page-aligned, inside the range, disjoint and each
// within the heap's own pool; mapped blocks lie on chunks and unmapped ones off them.
void Allocator::Impl::check_heap(const Segment& seg) const {
  const detail::Heap& h = *seg.heap;
  Address prev_end = seg.addr;
  for (const auto& [a, c] : h.chunks) {
    if (a != c.addr || c.addr % page_ != 0 || c.size == 0 || c.size % page_ != 0)
      fail("chunk at " + hex(c.addr) + " is not page-aligned");
    if (c.addr < prev_end || c.end() > seg.end()) fail("chunk at " + hex(c.addr) + " overlaps or leaves the heap");
    if (c.pool != seg.pool) fail("chunk at " + hex(c.addr) + " belongs to the other pool");
    prev_end = c.end();
  }
  std::size_t unmapped = 0;
  auto chunk_at = [&](Address addr) -> const detail::Chunk* {  // the chunk covering addr, if any
    auto it = h.chunks.upper_bound(addr);
    if (it == h.chunks.begin()) return nullptr;
    --it;
    return addr < it->second.end() ? &it->second : nullptr;
  };
  for (const Block* b = seg.first; b != nullptr; b = b->next) {
    if (b->mapped) {
      // Every page under the block is mapped: walk the chunks across it.
      for (Address at = b->addr; at < b->addr + b->size;) {
        const detail::Chunk* c = chunk_at(at);
        if (c == nullptr) fail("block " + hex(b->addr) + " spans an unmapped page at " + hex(at));
        at = c->end();
      }
    } else {
      ++unmapped;
      if (b->addr % page_ != 0 || b->size % page_ != 0) fail("unmapped block " + hex(b->addr) + " is not page-aligned");
      auto it = h.chunks.lower_bound(b->addr);
      if (chunk_at(b->addr) != nullptr || (it != h.chunks.end() && it->first < b->addr + b->size))
        fail("unmapped block " + hex(b->addr) + " overlaps a chunk");
      auto u = h.unmapped.find(b->addr);
      if (u == h.unmapped.end() || u->second != b) fail("unmapped block " + hex(b->addr) + " is not listed");
    }
  }
  if (unmapped != h.unmapped.size()) fail("the heap's unmapped list has stale entries");
}

}  // namespace tensorpool

// inspect.cpp: the read-only views of the allocator: stats, the fragmentation report,
// snapshots, the messages for a bad pointer, and check_invariants(), which recomputes
// everything from the blocks and compares. The mode-dependent part of the check (mapping
// state, reserved bytes) is the segment source's own check().
#include <algorithm>
#include <string>
#include <vector>

#include "core/allocator_impl.hpp"
#include "core/util.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::hex;

using detail::Block;
using detail::Recount;
using detail::Segment;
using detail::StreamState;

void detail::invariant_failed(const std::string& what) {
  throw InvariantError("tensorpool invariant violated: " + what);
}

namespace {
[[noreturn]] void fail(const std::string& what) { detail::invariant_failed(what); }
}  // namespace

Stats Allocator::Impl::stats() const {
  Lock lock(shards);
  shards.settle();
  Stats s = shards.merged(counters.stats());
  const SleepReport asleep = source_->asleep();
  s.asleep_bytes = asleep.asleep_bytes;
  s.asleep_allocated = asleep.asleep_allocated;
  graphs.for_each([&](const detail::GraphPoolRec& pool) {
    ++s.graph_pools;
    s.graph_reserved_bytes += pool.reserved;
    s.graph_allocated_bytes += pool.allocated;
  });
  return s;
}

MemoryUsage Allocator::Impl::usage() const {
  const detail::Shards::View view(shards);
  const auto cur = [&](Metric m) { return static_cast<std::size_t>(shards.total_current(m)); };
  return {counters.reserved(), cur(Metric::allocated_bytes), cur(Metric::requested_bytes), cur(Metric::active_bytes)};
}

void Allocator::Impl::reset_peaks() {
  Lock lock(shards);
  counters.reset_peaks();
  shards.reset_peaks();
}

FragmentationReport Allocator::Impl::fragmentation() const {
  const detail::Shards::View view(shards);
  FragmentationReport r;
  const PoolStats total = shards.merged(counters.stats()).total;
  const auto cur = [&](Metric m) { return static_cast<std::size_t>(total[m].current); };
  r.reserved = cur(Metric::reserved_bytes);
  r.allocated = cur(Metric::allocated_bytes);
  r.requested = cur(Metric::requested_bytes);
  r.pending_free = cur(Metric::active_bytes) - r.allocated;
  r.internal_waste = r.allocated - r.requested;
  // Asleep blocks stay allocated but have no pages (sleep()): only the awake ones use reserved memory.
  const std::size_t awake = r.allocated - source_->asleep().asleep_allocated;
  r.reserved_unallocated = r.reserved - awake;
  for (const auto& [stream, ss] : streams) {
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
  source_->for_each_held([&](const Block* b) {  // free memory, though kept out of the index
    r.total_free += b->size;
    ++r.free_blocks;
    r.inactive_split += b->size;
    ++r.inactive_split_blocks;
    r.largest_free = std::max(r.largest_free, b->size);
  });
  r.utilization = r.reserved == 0 ? 1.0 : static_cast<double>(awake) / static_cast<double>(r.reserved);
  r.external_fragmentation =
      r.total_free == 0 ? 0.0
                        : 1.0 - static_cast<double>(r.largest_free) / static_cast<double>(r.total_free);
  return r;
}

Snapshot Allocator::Impl::snapshot() const {
  const detail::Shards::View view(shards);
  Snapshot snap;
  snap.segments.reserve(segments.size());
  for (const auto& [addr, seg] : segments) {
    SegmentInfo info{seg->addr, seg->size, seg->owner->stream, seg->pool, seg->oversize, seg->is_heap(), {}};
    info.blocks.reserve(seg->blocks);
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      const detail::GraphPoolRec* pool =
          graphs.empty() || b->state != BlockState::allocated ? nullptr : graphs.owner_of(b->addr);
      // A lent block's pages are in use elsewhere in the heap (vmm_stitch.cpp): here, no pages.
      info.blocks.push_back({b->addr, b->size, b->requested, b->lent ? BlockState::free : b->state,
                             b->mapped && !b->lent, b->asleep, pool != nullptr ? pool->id : 0});
    }
    snap.segments.push_back(std::move(info));
  }
  snap.graph_pools = graphs.infos();
  return snap;
}

// --- misuse ---------------------------------------------------------------------------------

void Allocator::Impl::throw_bad_pointer(Address addr, const char* operation) const {
  const std::string what = std::string("tensorpool: ") + operation + " of " + hex(addr) + ": ";
  auto it = segments.upper_bound(addr);
  if (it == segments.begin() || addr >= std::prev(it)->second->end())
    throw UsageError(what + "pointer was not allocated by this allocator (device " + props.name +
                     ")");
  const Segment& seg = *std::prev(it)->second;
  const Block* b = seg.first;
  while (b->addr + b->size <= addr) b = b->next;
  if (b->addr != addr)
    throw UsageError(what + "pointer lies inside the block at " + hex(b->addr) + " (offset " +
                     std::to_string(addr - b->addr) + "), not at its start");
  if (b->state == BlockState::pending_free)
    throw UsageError(what + "double free: the block was already freed and waits for stream events");
  throw UsageError(what + "double free: the block (" + format_bytes(b->size) + ") is already free");
}

// --- check_invariants -----------------------------------------------------------------------

void Allocator::Impl::check_invariants() const {
  const detail::Shards::View view(shards, detail::Shards::Seams::as_left);
  check_invariants_locked();
}

namespace {

// The shards' seams (shards.hpp), each checked: the free blocks allowed to lie beside a free twin.
std::vector<const Block*> checked_seams(const detail::Shards& shards) {
  std::vector<const Block*> seams;
  for (std::size_t i = 0; i < shards.in_use(); ++i) {
    const Block* lower = shards[i].seam;
    if (lower == nullptr) continue;
    const Block* upper = lower->next;
    const auto merges = detail::AllocatorState::merges_with;
    if (upper == nullptr || lower->state != BlockState::free || upper->state != BlockState::free ||
        lower->size != upper->size || !lower->mapped || !upper->mapped || lower->held || upper->held ||
        merges(lower->prev, lower) || merges(upper->next, upper))
      fail("the seam at " + hex(lower->addr) + " is not two free twins apart from other free blocks");
    if (lower->segment->owner->shard != &shards[i]) fail("the seam at " + hex(lower->addr) + " is another shard's");
    seams.push_back(lower);
  }
  return seams;
}

// The tiling of one segment by its blocks, and the recount of what its blocks hold.
void check_segment(const Segment& seg, const std::vector<const Block*>& seams, Recount& rc, std::size_t& free_blocks) {
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
        b->mapped == b->next->mapped && b->held == b->next->held && b->asleep == b->next->asleep &&
        std::find(seams.begin(), seams.end(), b) == seams.end())
      fail("adjacent free blocks at " + hex(b->addr) + " were not coalesced");
    if (b->held && (b->state != BlockState::free || !b->mapped || !seg.is_heap()))
      fail("held block " + hex(b->addr) + " is not a free mapped block of a heap");
    if (!b->mapped && b->state != BlockState::free)
      fail("block " + hex(b->addr) + " is in use but has no pages");
    covered += b->size;
    if (b->lent) continue;  // the allocator's own pages, no user's block (vmm_stitch.cpp; the heaps check it)
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
    } else if (b->mapped && !b->held) {
      ++free_blocks;
    }
    if (b->state == BlockState::pending_free && b->pending_events == 0)
      fail("pending block " + hex(b->addr) + " has no outstanding event");
  }
  if (covered != seg.size) fail("blocks of segment " + hex(seg.addr) + " do not add up to its size");
  if (count != seg.blocks) fail("segment " + hex(seg.addr) + " block count is wrong");
  if (seg.oversize && count != 1) fail("oversize segment " + hex(seg.addr) + " was split");
}

}  // namespace

void Allocator::Impl::check_invariants_locked() const {
  Recount rc;
  std::size_t free_blocks = 0;
  Address previous_end = 0;
  const std::vector<const Block*> seams = checked_seams(shards);
  for (const auto& [addr, seg] : segments) {
    if (addr != seg->addr) fail("segment map key differs from segment address " + hex(seg->addr));
    if (seg->addr < previous_end) fail("segment " + hex(seg->addr) + " overlaps the previous one");
    if (seg->index != &AllocatorState::index_for(*seg->owner, seg->pool, seg->oversize))
      fail("segment " + hex(seg->addr) + " points to the wrong free index");
    previous_end = seg->end();
    check_segment(*seg, seams, rc, free_blocks);
  }
  source_->check(rc);  // reserved bytes and segments, mapping state
  // Free indexes: exactly the free mapped blocks, each in its own bin of its segment's index.
  std::size_t listed = 0;
  std::size_t pending_frees = 0;
  for (const auto& [stream, ss] : streams) {
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
    for (const auto& pf : ss->pending)
      if (pf.block->state != BlockState::pending_free) fail("pending free of a non-pending block");
    pending_frees += ss->pending.size();
  }
  if (listed != free_blocks)
    fail(std::to_string(free_blocks) + " free blocks but " + std::to_string(listed) + " listed");
  if (pending_frees != pending_total_) fail("pending free count is wrong");
  // Live map: exactly the allocated blocks.
  std::size_t live = 0;
  for (std::size_t i = 0; i < detail::kNumShards; ++i) {
    shards[i].live.for_each([&](Address a, const Block* b) {
      if (b->addr != a || b->state != BlockState::allocated) fail("live map entry " + hex(a) + " is stale");
      if (&shard_of(b->segment) != &shards[i]) fail("block " + hex(a) + " is mapped by another stream's shard");
      ++live;
    });
  }
  // Stats equal the recount, and the shards keep their peaks exact.
  shards.settle();
  shards.check();
  const Stats st = shards.merged(counters.stats());
  std::int64_t allocations = 0;
  for (int p = 0; p < kNumPools; ++p) {
    for (int m = 0; m < kNumMetrics; ++m) {
      const auto metric = static_cast<Metric>(m);
      const std::int64_t have = st.pool[p].metrics[m].current;
      if (have != rc.pool[p][m])
        fail(std::string("stat ") + to_string(metric) + " of pool " + to_string(static_cast<Pool>(p)) +
                         " is " + std::to_string(have) + ", recount " + std::to_string(rc.pool[p][m]));
      const std::int64_t sum = st.pool[0].metrics[m].current + st.pool[1].metrics[m].current;
      if (st.total.metrics[m].current != sum) fail(std::string("total ") + to_string(metric) + " is wrong");
      if (st.pool[p].metrics[m].peak < have) fail(std::string("peak of ") + to_string(metric) + " is below current");
      if (st.pool[p].metrics[m].freed < 0) fail(std::string("stat ") + to_string(metric) + " is above all it ever got");
    }
    allocations += rc.pool[p][static_cast<int>(Metric::allocations)];
  }
  if (static_cast<std::int64_t>(live) != allocations) fail("live map size differs from allocated blocks");
  check_graph_pools();
}

// Each graph pool's ranges are live blocks of the allocator (kept from the fast path) that no
// other pool claims; its live blocks and free space tile its ranges; its totals add up.
void Allocator::Impl::check_graph_pools() const {
  std::size_t captured = 0;
  graphs.for_each([&](const detail::GraphPoolRec& pool) {
    const std::string name = "graph pool " + std::to_string(pool.id);
    std::size_t reserved = 0;
    for (const auto& [addr, bytes] : pool.space.ranges()) {
      const Block* b = find_live(addr);
      if (b == nullptr || b->size != bytes || b->uses == nullptr || !b->uses->empty())
        fail(name + ": range " + hex(addr) + " is not a live block kept from the fast path");
      if (graphs.owner_of(addr) != &pool) fail(name + ": range " + hex(addr) + " is claimed by another pool");
      reserved += bytes;
    }
    std::size_t allocated = 0;
    for (const auto& [addr, bytes] : pool.live) {
      const auto range = pool.space.range_of(addr);
      if (!range || addr + bytes > range->first + range->second) fail(name + ": block " + hex(addr) + " outside its ranges");
      allocated += bytes;
    }
    if (reserved != pool.reserved || allocated != pool.allocated || pool.allocated > pool.peak_allocated ||
        allocated + pool.space.bytes() != reserved)
      fail(name + ": totals do not add up (reserved " + std::to_string(pool.reserved) + ", allocated " +
           std::to_string(pool.allocated) + ", free " + std::to_string(pool.space.bytes()) + ")");
    if (pool.released && pool.live.empty()) fail(name + ": released and empty, yet not given back");
    captured += pool.capturing.size();
  });
  if (captured != graphs.captures())
    fail("the captured streams and the graph pools' lists differ");
}

}  // namespace tensorpool

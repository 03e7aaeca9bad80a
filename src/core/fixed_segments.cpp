// fixed_segments.cpp: the fixed-segment source (mode:fixed). Each segment is one device
// allocation (DeviceBackend::allocate_segment), sized by the pool policy:
//   small pool: small_segment_size (2 MiB);
//   large pool: large_segment_size (20 MiB) for requests below half of it, else the request's
//   size rounded to the device granularity (oversize requests too: their segment is never split);
// falling back to a segment of exactly the request's size when the policy's does not fit. A
// segment goes back to the device only whole, when its one block is free.
//
// Invariants (check): every segment of the allocator is one of these (no heap), each block has
// memory behind it (mapped), and reserved bytes / segments per pool are the segments' sums.
#include "core/segment_source.hpp"
#include "core/util.hpp"

namespace tensorpool::detail {

namespace {

class FixedSegments final : public SegmentSource {
 public:
  explicit FixedSegments(AllocatorState& state) : st_(state) {}

  Block* grow(StreamState& ss, Pool pool, std::size_t size) override;
  std::size_t release(ReleaseGoal goal) override;
  void destroy() override;
  void check(Recount& rc) const override;

 private:
  std::size_t segment_size_for(Pool pool, std::size_t size, bool oversize) const noexcept;
  Block* try_segment(StreamState& ss, Pool pool, bool oversize, std::size_t bytes);
  void free_segment(Segment* seg);

  AllocatorState& st_;
};

std::size_t FixedSegments::segment_size_for(Pool pool, std::size_t size, bool oversize) const noexcept {
  const std::size_t g = st_.props.segment_granularity;
  if (pool == Pool::small) return round_up(st_.config.small_segment_size, g);
  if (!oversize && size < st_.config.large_segment_size / 2) return round_up(st_.config.large_segment_size, g);
  return round_up(size, g);
}

// A new segment whose one free block is in ss's index.
Block* FixedSegments::grow(StreamState& ss, Pool pool, std::size_t size) {
  const bool oversize = pool == Pool::large && st_.is_oversize_request(size);
  const std::size_t preferred = segment_size_for(pool, size, oversize);
  if (Block* b = try_segment(ss, pool, oversize, preferred)) return b;
  const std::size_t exact = round_up(size, st_.props.segment_granularity);
  if (exact < preferred) return try_segment(ss, pool, oversize, exact);
  return nullptr;
}

Block* FixedSegments::try_segment(StreamState& ss, Pool pool, bool oversize, std::size_t bytes) {
  if (!st_.within_limit(bytes)) return nullptr;
  st_.refuse_if_captured(ss.stream);
  void* ptr = st_.device->allocate_segment(bytes, ss.stream);  // DeviceError propagates, state intact
  if (ptr == nullptr) {
    st_.counters.count(&Stats::upstream_alloc_failures);
    return nullptr;
  }
  auto seg = std::make_unique<Segment>();
  seg->addr = reinterpret_cast<Address>(ptr);
  seg->size = bytes;
  seg->owner = &ss;
  seg->pool = pool;
  seg->oversize = oversize;
  seg->index = &AllocatorState::index_for(ss, pool, oversize);
  Block* b = ss.shard->blocks.acquire();
  b->addr = seg->addr;
  b->size = bytes;
  b->segment = seg.get();
  seg->first = b;
  seg->index->insert(b);
  st_.segments.emplace(seg->addr, std::move(seg));
  st_.counters.on_upstream_alloc(pool, bytes);
  if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_alloc, b->addr, 0, bytes, ss.stream);
  return b;
}

// Every entirely free segment, in address order. Nothing is kept back for empty_cache either.
std::size_t FixedSegments::release(ReleaseGoal) {
  std::size_t released = 0;
  for (auto it = st_.segments.begin(); it != st_.segments.end();) {
    Segment* seg = (it++)->second.get();  // advance first: free_segment erases
    if (seg->is_free()) {
      released += seg->size;
      free_segment(seg);
    }
  }
  return released;
}

void FixedSegments::free_segment(Segment* seg) {
  st_.device->free_segment(reinterpret_cast<void*>(seg->addr), seg->size, seg->owner->stream);
  Block* b = seg->first;
  seg->index->remove(b);
  AllocatorState::blocks_of(seg).release(b);
  st_.counters.on_upstream_free(seg->pool, seg->size);
  if (st_.hooks.observed())
    st_.hooks.notify(EventType::segment_free, seg->addr, 0, seg->size, seg->owner->stream);
  st_.segments.erase(seg->addr);
}

void FixedSegments::destroy() {
  for (const auto& [addr, seg] : st_.segments)
    st_.device->free_segment(reinterpret_cast<void*>(seg->addr), seg->size, seg->owner->stream);
}

void FixedSegments::check(Recount& rc) const {
  for (const auto& [addr, seg] : st_.segments) {
    if (seg->is_heap()) invariant_failed("segment " + hex(addr) + " is a heap, but the mode is fixed");
    for (const Block* b = seg->first; b != nullptr; b = b->next)
      if (!b->mapped) invariant_failed("block " + hex(b->addr) + " of a fixed segment has no pages");
    rc.add(seg->pool, Metric::reserved_bytes, static_cast<std::int64_t>(seg->size));
    rc.add(seg->pool, Metric::segments, 1);
  }
}

}  // namespace

std::unique_ptr<SegmentSource> make_fixed_segments(AllocatorState& state) {
  return std::make_unique<FixedSegments>(state);
}

}  // namespace tensorpool::detail

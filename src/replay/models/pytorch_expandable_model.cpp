// pytorch_expandable_model.cpp: the "pytorch-expandable" replay target, a model of PyTorch's CUDA
// caching allocator run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as its notes,
// public discussions and memory snapshots describe it. The model decides what PyTorch would do;
// its virtual-memory calls go to a SimulatedDevice of its own, whose counters (with the map and
// unmap operations counted here) are the target's upstream calls.
//
// The rules modelled:
//  - Rounding, pools and best fit are the native allocator's (pytorch_rules.hpp, and
//    pytorch_model.cpp for the rest): requests round up to 512 B (roundup_power2_divisions
//    honoured), rounded sizes <= 1 MiB use the small pool, and a request takes the smallest free
//    block of its pool and stream (ties: lowest address), under the max_split_size rules. One
//    difference: a free block at the edge of the mapped space (unmapped space after it) ranks by
//    the size it could grow to, so a larger interior block is taken first (the qwen3 snapshot
//    shows it; plain best fit diverges there).
//  - Memory comes from expandable segments instead of cudaMalloc: one per stream and pool, created
//    when first needed, which reserves address space for the whole device plus 1/8 and maps
//    physical memory into it page by page, one physical handle per page: 20 MiB pages in the
//    large pool, 2 MiB pages in the small pool. (2 MiB is the driver's granularity, which PyTorch's
//    notes mention; its large pool maps 20 MiB handles, as public discussions of the design say and
//    every large-pool segment_map of the qwen3 snapshot, a multiple of 20 MiB, shows.)
//  - No free block fits: the lowest-addressed run of available address space of the stream's
//    segments in that pool that is large enough (an unmapped range, with the free block just
//    before it, and whatever free and unmapped blocks follow) gets the missing pages mapped: the
//    shortfall rounded up to pages, one map operation per unmapped range used. The new pages join
//    the free block before them, so free space at the end of the mapping is used first. No such
//    run: a new segment for the stream and pool.
//  - A block is split whenever at least 512 B remain, in both pools (with expandable segments a
//    remainder never pins a segment, so max_split_size does not restrict splitting).
//  - A freed block merges with its free neighbours; free blocks never merge with unmapped space.
//  - A block used on other streams (record_stream) becomes free once each of them was
//    synchronized after the free, as in the native model.
//  - Mapping fails (the device is full): wait for pending frees, unmap every page entirely
//    covered by a free block (one unmap operation per free block, after a synchronization of the
//    segment's stream), release segments left with nothing mapped, and retry once; then throw
//    OutOfMemoryError. empty_cache() releases the same way.
//  - seed_segment() with kFlagExpandable: a mapped range at window start. The first range of a
//    stream and pool starts a segment there; later ranges of that stream and pool within the
//    segment's address space are mapped at the same distance from it (the holes between them stay
//    unmapped). A seed without the flag (a cudaMalloc segment from before expandable segments were
//    turned on) is adopted as a native segment: used by the best-fit search, cudaFree'd whole by a
//    release once entirely free. Seeding is not one of the window's upstream calls. seed_alloc()
//    places a live block at its recorded offset in its seeded range.
//
// Upstream calls (upstream()):
//  allocs, frees  physical pages created / released (cuMemCreate / cuMemRelease: one per page; a
//                 map operation that runs out of memory releases the pages it created), plus the
//                 cudaMalloc / cudaFree of native seeded segments;
//  maps, unmaps   map / unmap operations, each a contiguous range of pages: what PyTorch records
//                 as one segment_map / segment_unmap event, so they compare with baseline(). The
//                 driver maps and unmaps page by page: those calls number the pages created and
//                 released;
//  syncs          host waits: pending events completed by a release, the stream
//                 synchronization before each unmap operation, and the cudaFree of a native
//                 segment (it waits for the device).
// Reserving and releasing address space is not counted (it holds no memory).
//
// Not modelled: garbage_collection_threshold, the per-process memory fraction, CUDA graph private
// pools, the release of oversize native blocks under max_split_size (PyTorch skips expandable
// blocks there; only native seeds would qualify), and the placement of segments in the address
// space beyond "each segment apart, ascending" (it only matters for ties).
//
// Invariants (checked by the tests through the interface):
//  - the blocks of a segment tile its address range in address order (prev/next);
//  - an unmapped block starts and ends on pages of its segment, is in unmapped_[pool], and never
//    touches another unmapped block; a page is mapped iff no unmapped block covers it;
//  - a free block (mapped, not allocated, not pending) is in free_[pool] and never touches another
//    free block;
//  - reserved_ == bytes of mapped pages + bytes of native segments (the device's used bytes);
//    allocated_ == sum of the sizes of allocated blocks.

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/models/model_support.hpp"
#include "replay/models/models.hpp"
#include "replay/models/pytorch_common.hpp"
#include "replay/models/pytorch_rules.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::replay {

// An expandable segment, or a native segment seeded at window start (the blocks' Segment).
struct pytorch_common::Segment {
  Address base = 0;
  std::size_t size = 0;  // expandable: the address space reserved; native: the cudaMalloc size
  Stream stream = kDefaultStream;
  Pool pool = Pool::large;
  bool expandable = true;
  std::unordered_map<Address, PhysicalHandle> pages;  // expandable: the mapped pages, by address
  bool seeded = false;          // expandable, started by seed_segment() ...
  std::uint64_t trace_base = 0;  // ... at this trace address, which its base stands for
};

namespace {

using pytorch_common::Block;
using pytorch_common::Segment;
using pytorch_rules::kLargeBuffer;
using pytorch_rules::kMinBlockSize;
using pytorch_rules::kRoundLarge;
using pytorch_rules::kSmallBuffer;

constexpr const char* kName = "pytorch-expandable";

// The page of a pool: one physical handle each. PyTorch maps the large pool in 20 MiB handles
// (mapping costs per handle, so fewer, larger ones are cheaper) and the small pool in 2 MiB ones.
constexpr std::size_t page_size(Pool pool) noexcept {
  return pool == Pool::small ? kSmallBuffer : kLargeBuffer;
}

constexpr std::size_t round_down(std::size_t value, std::size_t multiple) noexcept {
  return value / multiple * multiple;
}

// Unmapped space is searched lowest address first, per stream.
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->addr < b->addr;
  }
};

class ExpandableModel final : public pytorch_common::CachingModel {
 public:
  explicit ExpandableModel(const TargetOptions& options)
      : CachingModel(options, kName, true, device_options(options)),
        // PyTorch reserves the device's memory plus 1/8 per segment (room to remap elsewhere).
        address_space_(round_up(std::max(options.capacity + options.capacity / 8, kLargeBuffer),
                                kLargeBuffer)) {}

  void seed_segment(const trace::TraceEvent& seed) override;
  void* seed_alloc(const trace::TraceEvent& seed) override;

  UpstreamCounts upstream() const override {
    UpstreamCounts u = CachingModel::upstream();  // syncs: with the pending events completed
    u.maps = map_ops_;  // operations, not the device's per-page calls (see the banner)
    u.unmaps = unmap_ops_;
    u.syncs += unmap_ops_;  // each unmap operation synchronizes its stream first
    return u;
  }

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    // Native seeds are multiples of 2 MiB, as every PyTorch segment.
    SimulatedDeviceOptions d = pytorch_common::device_options(o, "pytorch-expandable-model");
    d.supports_virtual_memory = true;
    d.vm_page_size = kSmallBuffer;  // both page sizes are multiples of it
    return d;
  }

  std::set<Block*, ByAddress>& unmapped_set(Pool p) { return unmapped_[static_cast<int>(p)]; }

  Block* grow(Pool pool, Stream stream, std::size_t size) override;
  Block* map_room(Pool pool, Stream stream, std::size_t size);
  Block* find_room(Pool pool, Stream stream, std::size_t size);
  Block* new_segment(Pool pool, Stream stream);
  Block* map_pages(Block* u, std::size_t bytes);
  bool should_split(const Block& b, std::size_t size) const noexcept override;
  Block* new_block(Segment* segment, Address addr, std::size_t size, bool mapped);
  void unindex(Block* b) override;
  void release_cached() override;
  void unmap_pages(Block* b);
  void join_unmapped(Block* u);
  void release_segment(Block* b);
  void seed_mapped_range(const trace::TraceEvent& seed, Pool pool);
  void seed_native_segment(const trace::TraceEvent& seed, Pool pool);
  Segment* seed_segment_for(const trace::TraceEvent& seed, Pool pool);
  Block* carve_unmapped(Segment& segment, Address at, std::size_t size);
  Block* block_at(Address x);
  Block* seeded_free_block(const trace::TraceEvent& seed);

  std::size_t address_space_;    // reserved per expandable segment
  std::uint64_t map_ops_ = 0;    // map operations of the window
  std::uint64_t unmap_ops_ = 0;  // unmap operations (each preceded by a stream sync)
  std::map<Address, std::unique_ptr<Segment>> segments_;  // by base address
  std::set<Block*, ByAddress> unmapped_[kNumPools];
};

// --- allocation ---------------------------------------------------------------------------

// Memory from the stream's segments, or a new one; when the device cannot back it, unmaps free
// pages (release_cached()) and retries once.
Block* ExpandableModel::grow(Pool pool, Stream stream, std::size_t size) {
  if (Block* b = map_room(pool, stream, size)) return b;
  release_cached();  // unmaps free pages, then the one retry
  return map_room(pool, stream, size);
}

// Maps pages until a free block of at least `size` bytes exists and returns it, out of its free
// set; nullptr when the device cannot back the pages (those already mapped stay, as free space).
Block* ExpandableModel::map_room(Pool pool, Stream stream, std::size_t size) {
  Block* b = find_room(pool, stream, size);
  if (b == nullptr) b = new_segment(pool, stream);
  // From b on, available blocks hold `size` bytes; free and unmapped ones alternate (neither kind
  // touches its own kind), so each step maps (part of) the unmapped block after a free one.
  if (!b->mapped) b = map_pages(b, std::min(b->size, size));
  while (b != nullptr && b->size < size)
    b = map_pages(b->next, std::min(b->next->size, size - b->size));
  if (b == nullptr) return nullptr;
  free_set(pool).erase(b);
  return b;
}

// The start of the lowest-addressed run of available space of `stream` in `pool` that holds
// `size` bytes: an unmapped block, or the free block just before it. nullptr: none.
Block* ExpandableModel::find_room(Pool pool, Stream stream, std::size_t size) {
  const auto& set = unmapped_set(pool);
  Block key;
  key.stream = stream;
  for (auto it = set.lower_bound(&key); it != set.end() && (*it)->stream == stream; ++it) {
    Block* start = (*it)->prev != nullptr && (*it)->prev->is_free() ? (*it)->prev : *it;
    std::size_t bytes = 0;
    for (const Block* b = start; b != nullptr && bytes < size && b->available(); b = b->next)
      bytes += b->size;
    if (bytes >= size) return start;
  }
  return nullptr;
}

// A new expandable segment for `stream` and `pool`: its whole address space, one unmapped block.
Block* ExpandableModel::new_segment(Pool pool, Stream stream) {
  const std::size_t page = page_size(pool);
  auto owned = std::make_unique<Segment>();
  Segment* s = owned.get();
  s->size = address_space_;  // a multiple of both page sizes
  s->base = device_.reserve_address_range(s->size, page);
  s->stream = stream;
  s->pool = pool;
  segments_.emplace(s->base, std::move(owned));
  Block* u = new_block(s, s->base, s->size, false);
  unmapped_set(pool).insert(u);
  return u;
}

// One map operation: creates and maps the pages covering the first `bytes` of the unmapped block
// `u` (a multiple of pages, so they fit), and returns the free block they became part of, in its
// free set. nullptr, and nothing changed but the calls, when the device cannot back them all.
Block* ExpandableModel::map_pages(Block* u, std::size_t bytes) {
  Segment& s = *u->segment;
  const std::size_t page = page_size(u->pool);
  const std::size_t count = (bytes + page - 1) / page;
  std::vector<PhysicalHandle> handles;
  for (std::size_t i = 0; i < count; ++i) {
    const PhysicalHandle h = device_.create_physical(page);
    if (h == 0) {
      for (const PhysicalHandle made : handles) device_.release_physical(made);
      return nullptr;
    }
    handles.push_back(h);
  }
  for (std::size_t i = 0; i < count; ++i) {
    device_.map(u->addr + i * page, page, handles[i]);
    s.pages.emplace(u->addr + i * page, handles[i]);
  }
  ++map_ops_;
  unmapped_set(u->pool).erase(u);
  if (count * page < u->size) unmapped_set(u->pool).insert(split_at(u, count * page));
  u->mapped = true;
  reserved_ += count * page;
  return free_block(u);
}

// Split off any remainder: rounded sizes are multiples of 512 B, so a remainder is either nothing
// or a block worth keeping.
bool ExpandableModel::should_split(const Block& b, std::size_t size) const noexcept {
  return b.size - size >= kMinBlockSize;
}

Block* ExpandableModel::new_block(Segment* segment, Address addr, std::size_t size, bool mapped) {
  return CachingModel::new_block(addr, size, segment->stream, segment->pool, segment, mapped);
}

// --- freeing ------------------------------------------------------------------------------

// Takes `b` out of the set of its kind, if it is there (keys are unique: addresses).
void ExpandableModel::unindex(Block* b) {
  if (b->mapped)
    free_set(b->pool).erase(b);
  else
    unmapped_set(b->pool).erase(b);
}

// --- releasing cached memory --------------------------------------------------------------

// Waits for pending frees, then unmaps the pages under every free block of both pools and
// cudaFrees the native segments that are entirely free.
void ExpandableModel::release_cached() {
  complete_all_pending();
  for (auto& set : free_) {
    // Unmapping splits and re-files free blocks: work on a copy. The free blocks never touch one
    // another, so releasing one leaves the others as they were.
    const std::vector<Block*> free(set.begin(), set.end());
    for (Block* b : free) {
      if (b->segment->expandable)
        unmap_pages(b);
      else if (b->whole_segment())
        release_segment(b);
    }
  }
}

// One unmap operation: the pages entirely covered by the free block `b` (in its free set). What
// is left of b on either side stays free; the unmapped range joins its unmapped neighbours.
void ExpandableModel::unmap_pages(Block* b) {
  Segment& s = *b->segment;
  const std::size_t page = page_size(b->pool);
  const Address lo = s.base + round_up(b->addr - s.base, page);
  const Address hi = s.base + round_down(b->addr + b->size - s.base, page);
  if (lo >= hi) return;  // no whole page under it
  auto& set = free_set(b->pool);
  set.erase(b);
  Block* mid = b;
  if (lo > b->addr) {
    mid = split_at(b, lo - b->addr);
    set.insert(b);
  }
  if (hi < mid->addr + mid->size) set.insert(split_at(mid, hi - mid->addr));
  for (Address a = lo; a < hi; a += page) {
    const auto h = s.pages.find(a);
    device_.unmap(a, page);
    device_.release_physical(h->second);
    s.pages.erase(h);
  }
  ++unmap_ops_;
  reserved_ -= mid->size;
  mid->mapped = false;
  join_unmapped(mid);
}

// Files the unmapped block `u` (in no set) after merging it with unmapped neighbours; a segment
// left with nothing mapped gives its address space back.
void ExpandableModel::join_unmapped(Block* u) {
  if (u->prev != nullptr && !u->prev->mapped) u = absorb(u->prev, u);
  if (u->next != nullptr && !u->next->mapped) u = absorb(u, u->next);
  if (u->whole_segment()) {
    release_segment(u);
    return;
  }
  unmapped_set(u->pool).insert(u);
}

// `b` covers its whole segment and is free (native: in its free set) or unmapped (in no set).
void ExpandableModel::release_segment(Block* b) {
  Segment* s = b->segment;
  if (s->expandable) {
    device_.release_address_range(s->base, s->size);
  } else {
    free_set(b->pool).erase(b);
    model::cuda_free(device_, reinterpret_cast<void*>(s->base), s->size, s->stream);
    reserved_ -= s->size;
  }
  blocks_.erase(b->addr);
  segments_.erase(s->base);
}

// --- seeding ------------------------------------------------------------------------------

void ExpandableModel::seed_segment(const trace::TraceEvent& seed) {
  const Pool pool = pytorch_common::seed_pool(seed);
  const UpstreamCounts before = upstream_of(device_);
  if ((seed.flags & trace::kFlagExpandable) != 0)
    seed_mapped_range(seed, pool);
  else
    seed_native_segment(seed, pool);
  exclude_from_window(before);
}

// Maps the pages of a seeded range as one free block of its stream's segment in `pool`.
void ExpandableModel::seed_mapped_range(const trace::TraceEvent& seed, Pool pool) {
  const std::size_t page = page_size(pool);
  Segment* s = seed_segment_for(seed, pool);
  const std::size_t offset = seed.addr - s->trace_base;
  const std::size_t lo = round_down(offset, page);
  const std::size_t hi = round_up(offset + std::max<std::size_t>(seed.size, 1), page);
  Block* u = carve_unmapped(*s, s->base + lo, hi - lo);
  if (u == nullptr)
    throw UsageError(std::string(kName) + ": seed_segment overlaps pages already mapped");
  const std::size_t maps = map_ops_;
  Block* b = map_pages(u, hi - lo);
  map_ops_ = maps;  // seeding is not one of the window's map operations
  if (b == nullptr) {
    join_unmapped(u);
    throw_oom(seed.size, hi - lo, seed.stream);
  }
  seeds_[seed.addr] = {s->base + offset, seed.size};
}

// The expandable segment of the seed's stream and pool whose address space holds the seed at its
// distance from the segment's first seed; a new one, starting at this seed, if none does.
Segment* ExpandableModel::seed_segment_for(const trace::TraceEvent& seed, Pool pool) {
  for (const auto& [base, owned] : segments_) {
    Segment* s = owned.get();
    if (!s->seeded || s->stream != seed.stream || s->pool != pool || seed.addr < s->trace_base)
      continue;
    if (seed.addr - s->trace_base + std::max<std::uint64_t>(seed.size, 1) <= s->size) return s;
  }
  Segment* s = new_segment(pool, seed.stream)->segment;
  s->seeded = true;
  s->trace_base = seed.addr;
  return s;
}

// The unmapped block that is exactly [at, at + size), cut out of the unmapped block holding it
// and in no set; nullptr when that range is not entirely unmapped.
Block* ExpandableModel::carve_unmapped(Segment& segment, Address at, std::size_t size) {
  if (at + size > segment.base + segment.size) return nullptr;
  Block* u = block_at(at);
  if (u == nullptr || u->mapped || at + size > u->addr + u->size) return nullptr;
  auto& set = unmapped_set(u->pool);
  set.erase(u);
  if (at > u->addr) {
    Block* mid = split_at(u, at - u->addr);
    set.insert(u);
    u = mid;
  }
  if (u->size > size) set.insert(split_at(u, size));
  return u;
}

// The block holding address `x`, or nullptr when no segment does.
Block* ExpandableModel::block_at(Address x) {
  auto it = segments_.upper_bound(x);
  if (it == segments_.begin()) return nullptr;
  const Segment& s = *std::prev(it)->second;
  if (x >= s.base + s.size) return nullptr;
  Block* b = blocks_.at(s.base).get();  // a segment's first block always starts at its base
  while (b != nullptr && b->addr + b->size <= x) b = b->next;
  return b;
}

// A cudaMalloc segment held at window start, adopted whole as one free block.
void ExpandableModel::seed_native_segment(const trace::TraceEvent& seed, Pool pool) {
  const std::size_t size = round_up(std::max<std::size_t>(seed.size, 1), kRoundLarge);
  void* p = device_.allocate_segment(size, seed.stream);
  if (p == nullptr) throw_oom(seed.size, size, seed.stream);
  auto owned = std::make_unique<Segment>();
  Segment* s = owned.get();
  s->base = reinterpret_cast<Address>(p);
  s->size = size;
  s->stream = seed.stream;
  s->pool = pool;
  s->expandable = false;
  segments_.emplace(s->base, std::move(owned));
  reserved_ += size;
  free_set(pool).insert(new_block(s, s->base, size, true));
  seeds_[seed.addr] = {s->base, size};
}

// Places a block live at window start where it was in the recording: at its offset in its seeded
// range. Falls back to allocate() when it lies in no seeded range or its place is not free.
void* ExpandableModel::seed_alloc(const trace::TraceEvent& seed) {
  Block* f = seeded_free_block(seed);
  if (f == nullptr) return allocate(seed.size, seed.stream);
  Block* b = take(f, round_size(seed.size));
  b->requested = seed.size;
  return reinterpret_cast<void*>(b->addr);
}

// The free block at the recorded address of `seed`, split there and out of its free set; nullptr
// when the address is in no seeded range or [addr, addr + size) is not free there.
Block* ExpandableModel::seeded_free_block(const trace::TraceEvent& seed) {
  const auto place = seeded_place(seed.addr);
  if (!place) return nullptr;
  const Address x = place->start + place->offset;
  return carve_free(block_at(x), x, round_size(seed.size));
}

}  // namespace

std::unique_ptr<ReplayTarget> make_pytorch_expandable_target(const TargetOptions& options) {
  return std::make_unique<ExpandableModel>(options);
}

TargetEntry pytorch_expandable_entry() {
  return {{kName, "the pytorch model with expandable_segments:True", pytorch_rules::settings_keys(),
           /*holds_memory_until_destroyed=*/false, /*exports=*/false, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) {
            pytorch_rules::parse_settings(conf, origin, true);
          },
          make_pytorch_expandable_target};
}

}  // namespace tensorpool::replay

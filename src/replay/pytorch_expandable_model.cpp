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
//  syncs          host waits: pending events completed by a release, and the stream
//                 synchronization before each unmap operation.
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

#include "replay/model_support.hpp"
#include "replay/models.hpp"
#include "replay/pytorch_rules.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::replay {

namespace {

using model::round_up;
using pytorch_rules::kLargeBuffer;
using pytorch_rules::kMinBlockSize;
using pytorch_rules::kRoundLarge;
using pytorch_rules::kSmallBuffer;
using pytorch_rules::Settings;

constexpr const char* kName = "pytorch-expandable";

// The page of a pool: one physical handle each. PyTorch maps the large pool in 20 MiB handles
// (mapping costs per handle, so fewer, larger ones are cheaper) and the small pool in 2 MiB ones.
constexpr std::size_t page_size(Pool pool) noexcept {
  return pool == Pool::small ? kSmallBuffer : kLargeBuffer;
}

constexpr std::size_t round_down(std::size_t value, std::size_t multiple) noexcept {
  return value / multiple * multiple;
}

struct Segment {
  Address base = 0;
  std::size_t size = 0;  // expandable: the address space reserved; native: the cudaMalloc size
  Stream stream = kDefaultStream;
  Pool pool = Pool::large;
  bool expandable = true;
  std::unordered_map<Address, PhysicalHandle> pages;  // expandable: the mapped pages, by address
  bool seeded = false;          // expandable, started by seed_segment() ...
  std::uint64_t trace_base = 0;  // ... at this trace address, which its base stands for
};

struct Block {
  Address addr = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;  // its segment's (blocks never change stream)
  Pool pool = Pool::large;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address neighbours inside the same segment (nullptr at its ends)
  Block* next = nullptr;
  bool mapped = true;  // false: address space of an expandable segment with no pages behind it
  bool allocated = false;
  bool pending = false;  // freed, waiting for the streams in `uses` to pass `marks`
  std::vector<Stream> uses;          // other streams it was used on (record_stream)
  std::vector<std::uint64_t> marks;  // StreamClock marks taken when it was freed

  bool whole_segment() const noexcept { return prev == nullptr && next == nullptr; }
  // Neither in use nor waiting: a free block, or unmapped space.
  bool available() const noexcept { return !allocated && !pending; }
  bool is_free() const noexcept { return mapped && available(); }
};

// What a free block can grow to: with unmapped space after it, its size plus that space.
std::size_t growable_size(const Block* b) noexcept {
  return b->next == nullptr || b->next->mapped ? b->size : b->size + b->next->size;
}

// Best fit: by stream, then size, then address (PyTorch's ordering of its free blocks).
struct BySize {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

// Unmapped space is searched lowest address first, per stream.
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->addr < b->addr;
  }
};

class ExpandableModel final : public ReplayTarget {
 public:
  explicit ExpandableModel(const TargetOptions& options)
      : settings_(pytorch_rules::parse_settings(options.conf, kName, true)),
        device_(device_options(options)),
        // PyTorch reserves the device's memory plus 1/8 per segment (room to remap elsewhere).
        address_space_(round_up(std::max(options.capacity + options.capacity / 8, kLargeBuffer),
                                kLargeBuffer)) {}

  std::string name() const override { return kName; }
  void seed_segment(const trace::Event& seed) override;
  void* seed_alloc(const trace::Event& seed) override;
  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  void stream_synchronized(Stream stream) override { clock_.synchronized(stream); }
  void empty_cache() override { release_cached(); }

  std::size_t reserved() const override { return reserved_; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override {
    UpstreamCounts u = model::minus(upstream_of(device_), baseline_);
    u.maps = map_ops_;  // operations, not the device's per-page calls (see the banner)
    u.unmaps = unmap_ops_;
    u.syncs += event_syncs_ + unmap_ops_;  // each unmap operation synchronizes its stream first
    return u;
  }

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    SimulatedDeviceOptions d;
    d.name = "pytorch-expandable-model";
    d.ordinal = o.device;
    d.capacity = o.capacity;
    d.segment_granularity = kRoundLarge;  // native seeds are multiples of 2 MiB
    d.supports_virtual_memory = true;
    d.vm_page_size = kSmallBuffer;  // both page sizes are multiples of it
    return d;
  }

  std::size_t round_size(std::size_t bytes) const noexcept {
    return pytorch_rules::round_size(bytes, settings_.divisions);
  }
  std::set<Block*, BySize>& free_set(Pool p) { return free_[static_cast<int>(p)]; }
  std::set<Block*, ByAddress>& unmapped_set(Pool p) { return unmapped_[static_cast<int>(p)]; }

  Block* find_free(Pool pool, Stream stream, std::size_t size);
  Block* grow(Pool pool, Stream stream, std::size_t size);
  Block* find_room(Pool pool, Stream stream, std::size_t size);
  Block* new_segment(Pool pool, Stream stream);
  Block* map_pages(Block* u, std::size_t bytes);
  Block* take(Block* b, std::size_t size);
  Block* new_block(Segment* segment, Address addr, std::size_t size, bool mapped);
  Block* split_at(Block* b, std::size_t offset);
  Block* free_block(Block* b);
  Block* absorb(Block* low, Block* high);
  void unindex(Block* b);
  void process_pending();
  void complete_all_pending();
  void release_cached();
  void unmap_pages(Block* b);
  void join_unmapped(Block* u);
  void release_segment(Block* b);
  void seed_mapped_range(const trace::Event& seed, Pool pool);
  void seed_native_segment(const trace::Event& seed, Pool pool);
  Segment* seed_segment_for(const trace::Event& seed, Pool pool);
  Block* carve_unmapped(Segment& segment, Address at, std::size_t size);
  Block* block_at(Address x);
  Block* seeded_free_block(const trace::Event& seed);
  void exclude_from_window(const UpstreamCounts& before);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);

  Settings settings_;
  SimulatedDevice device_;
  std::size_t address_space_;      // reserved per expandable segment
  UpstreamCounts baseline_;        // the device calls of seeding, not part of the window
  std::uint64_t map_ops_ = 0;      // map operations of the window
  std::uint64_t unmap_ops_ = 0;    // unmap operations (each preceded by a stream sync)
  std::uint64_t event_syncs_ = 0;  // host waits on pending frees (release_cached)
  model::StreamClock clock_;
  std::map<Address, std::unique_ptr<Segment>> segments_;          // by base address
  std::unordered_map<Address, std::unique_ptr<Block>> blocks_;  // every block, by address
  std::set<Block*, BySize> free_[kNumPools];
  std::set<Block*, ByAddress> unmapped_[kNumPools];
  std::vector<Block*> pending_;  // freed blocks waiting for other streams
  // Seeded ranges: trace address -> (model address, size), to place seed_alloc blocks exactly.
  std::map<std::uint64_t, std::pair<Address, std::size_t>> seeds_;
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
};

// --- allocation ---------------------------------------------------------------------------

void* ExpandableModel::allocate(std::size_t bytes, Stream stream) {
  process_pending();
  // Beyond any device: fail before the rounding arithmetic could overflow.
  if (bytes > device_.properties().capacity) throw_oom(bytes, bytes, stream);
  const std::size_t size = round_size(bytes);
  const Pool pool = pytorch_rules::pool_of(size);
  Block* b = find_free(pool, stream, size);
  if (b == nullptr) b = grow(pool, stream, size);
  if (b == nullptr) {
    release_cached();  // unmaps free pages, then the one retry
    b = grow(pool, stream, size);
  }
  if (b == nullptr) throw_oom(bytes, size, stream);
  return reinterpret_cast<void*>(take(b, size)->addr);
}

// The best-fit candidate, removed from the free set; nullptr when it is missing or ruled out by
// max_split_size. A free block at the edge of the mapped space ranks by what it can grow to: the
// search moves past it to the next larger free block of the stream that can grow less, so interior
// blocks are reused before the edge (qwen3-0.6b-varlen-expandable: an 11.75 MiB request took an
// interior 47 MiB block rather than the 12.6 MiB free edge).
Block* ExpandableModel::find_free(Pool pool, Stream stream, std::size_t size) {
  auto& set = free_set(pool);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  for (auto next = std::next(it); next != set.end() && (*next)->stream == stream &&
                                  growable_size(*next) < growable_size(*it);
       ++next)
    it = next;
  Block* b = *it;
  if (!pytorch_rules::may_serve(b->size, size, settings_.max_split_size)) return nullptr;
  set.erase(it);
  return b;
}

// Maps pages until a free block of at least `size` bytes exists and returns it, out of its free
// set; nullptr when the device cannot back the pages (those already mapped stay, as free space).
Block* ExpandableModel::grow(Pool pool, Stream stream, std::size_t size) {
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

// Marks `b` (in no set) allocated for `size` bytes, splitting off any remainder: rounded sizes are
// multiples of 512 B, so a remainder is either nothing or a block worth keeping.
Block* ExpandableModel::take(Block* b, std::size_t size) {
  if (b->size - size >= kMinBlockSize) free_set(b->pool).insert(split_at(b, size));
  b->allocated = true;
  allocated_ += b->size;
  return b;
}

Block* ExpandableModel::new_block(Segment* segment, Address addr, std::size_t size, bool mapped) {
  auto owned = std::make_unique<Block>();
  Block* b = owned.get();
  b->addr = addr;
  b->size = size;
  b->stream = segment->stream;
  b->pool = segment->pool;
  b->segment = segment;
  b->mapped = mapped;
  blocks_.emplace(addr, std::move(owned));
  return b;
}

// Cuts `b` (in no set) in two at `offset`; returns the new upper part (same kind, in no set).
Block* ExpandableModel::split_at(Block* b, std::size_t offset) {
  Block* rest = new_block(b->segment, b->addr + offset, b->size - offset, b->mapped);
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  return rest;
}

[[noreturn]] void ExpandableModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
  OutOfMemoryInfo info;
  info.requested = bytes;
  info.rounded = size;
  info.stream = stream;
  info.device = device_.properties().ordinal;
  info.capacity = device_.properties().capacity;
  info.device_free = device_.free_memory();
  info.reserved = reserved_;
  info.allocated = allocated_;
  info.reserved_unallocated = reserved_ - allocated_;
  for (const auto& set : free_)
    for (const Block* b : set) info.largest_free_block = std::max(info.largest_free_block, b->size);
  throw OutOfMemoryError(info);
}

// --- freeing ------------------------------------------------------------------------------

void ExpandableModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  const auto it = blocks_.find(reinterpret_cast<Address>(ptr));
  if (it == blocks_.end() || !it->second->allocated)
    throw UsageError(std::string(kName) + ": deallocate of a pointer that is not allocated");
  Block* b = it->second.get();
  b->allocated = false;
  allocated_ -= b->size;
  if (b->uses.empty()) {
    free_block(b);
    return;
  }
  // PyTorch records an event on each stream that used the block; the block is reusable once all
  // of them completed.
  b->pending = true;
  b->marks.clear();
  for (Stream s : b->uses) b->marks.push_back(clock_.mark(s));
  pending_.push_back(b);
}

void ExpandableModel::record_stream(void* ptr, Stream stream) {
  const auto it = blocks_.find(reinterpret_cast<Address>(ptr));
  if (it == blocks_.end() || !it->second->allocated)
    throw UsageError(std::string(kName) + ": record_stream on a pointer that is not allocated");
  Block* b = it->second.get();
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
}

// Merges the free block `b` (in no set) with its free neighbours (never with unmapped space) and
// returns the result, now in its free set.
Block* ExpandableModel::free_block(Block* b) {
  if (b->prev != nullptr && b->prev->is_free()) b = absorb(b->prev, b);
  if (b->next != nullptr && b->next->is_free()) b = absorb(b, b->next);
  free_set(b->pool).insert(b);
  return b;
}

// Merges `high` into its lower neighbour `low`, of the same kind; the survivor keeps its address
// (its key in blocks_) and is in no set: both are taken out first, as their keys change.
Block* ExpandableModel::absorb(Block* low, Block* high) {
  unindex(low);
  unindex(high);
  low->size += high->size;
  low->next = high->next;
  if (low->next != nullptr) low->next->prev = low;
  blocks_.erase(high->addr);
  return low;
}

// Takes `b` out of the set of its kind, if it is there (keys are unique: addresses).
void ExpandableModel::unindex(Block* b) {
  if (b->mapped)
    free_set(b->pool).erase(b);
  else
    unmapped_set(b->pool).erase(b);
}

// Frees the pending blocks whose other streams have all been synchronized since the free.
void ExpandableModel::process_pending() {
  if (pending_.empty()) return;
  std::vector<Block*> still;
  for (Block* b : pending_) {
    bool done = true;
    for (std::size_t i = 0; i < b->uses.size() && done; ++i)
      done = clock_.completed(b->uses[i], b->marks[i]);
    if (!done) {
      still.push_back(b);
      continue;
    }
    b->pending = false;
    b->uses.clear();
    b->marks.clear();
    free_block(b);
  }
  pending_.swap(still);
}

// The host waits for every outstanding event (PyTorch does before releasing cached memory).
void ExpandableModel::complete_all_pending() {
  std::vector<Block*> all;
  all.swap(pending_);
  for (Block* b : all) {
    event_syncs_ += b->uses.size();  // one event per stream that used the block
    b->pending = false;
    b->uses.clear();
    b->marks.clear();
    free_block(b);
  }
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
    device_.free_segment(reinterpret_cast<void*>(s->base), s->size, s->stream);
    reserved_ -= s->size;
  }
  blocks_.erase(b->addr);
  segments_.erase(s->base);
}

// --- seeding ------------------------------------------------------------------------------

void ExpandableModel::seed_segment(const trace::Event& seed) {
  const Pool pool = (seed.flags & trace::kFlagSmallPool) != 0 ? Pool::small : Pool::large;
  const UpstreamCounts before = upstream_of(device_);
  if ((seed.flags & trace::kFlagExpandable) != 0)
    seed_mapped_range(seed, pool);
  else
    seed_native_segment(seed, pool);
  exclude_from_window(before);
}

// Maps the pages of a seeded range as one free block of its stream's segment in `pool`.
void ExpandableModel::seed_mapped_range(const trace::Event& seed, Pool pool) {
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
Segment* ExpandableModel::seed_segment_for(const trace::Event& seed, Pool pool) {
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
void ExpandableModel::seed_native_segment(const trace::Event& seed, Pool pool) {
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

// Keeps the device calls made since `before` (seeding) out of upstream().
void ExpandableModel::exclude_from_window(const UpstreamCounts& before) {
  const UpstreamCounts cost = model::minus(upstream_of(device_), before);
  baseline_.allocs += cost.allocs;
  baseline_.frees += cost.frees;
  baseline_.maps += cost.maps;
  baseline_.unmaps += cost.unmaps;
  baseline_.syncs += cost.syncs;
  baseline_.modelled_ns += cost.modelled_ns;
}

// Places a block live at window start where it was in the recording: at its offset in its seeded
// range. Falls back to allocate() when it lies in no seeded range or its place is not free.
void* ExpandableModel::seed_alloc(const trace::Event& seed) {
  Block* f = seeded_free_block(seed);
  if (f == nullptr) return allocate(seed.size, seed.stream);
  return reinterpret_cast<void*>(take(f, round_size(seed.size))->addr);
}

// The free block at the recorded address of `seed`, split there and out of its free set; nullptr
// when the address is in no seeded range or [addr, addr + size) is not free there.
Block* ExpandableModel::seeded_free_block(const trace::Event& seed) {
  auto it = seeds_.upper_bound(seed.addr);
  if (it == seeds_.begin()) return nullptr;
  --it;
  const auto [start, length] = it->second;
  const std::uint64_t offset = seed.addr - it->first;
  const std::size_t size = round_size(seed.size);
  if (offset >= length) return nullptr;
  const Address x = start + offset;
  Block* f = block_at(x);
  if (f == nullptr || !f->is_free() || x + size > f->addr + f->size) return nullptr;
  auto& set = free_set(f->pool);
  set.erase(f);
  if (x == f->addr) return f;
  Block* at = split_at(f, x - f->addr);
  set.insert(f);
  return at;
}

}  // namespace

std::unique_ptr<ReplayTarget> make_pytorch_expandable_target(const TargetOptions& options) {
  return std::make_unique<ExpandableModel>(options);
}

}  // namespace tensorpool::replay

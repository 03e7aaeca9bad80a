// pytorch_model.cpp: the "pytorch" replay target, a model of PyTorch's native CUDA caching
// allocator (cudaMalloc segments, not expandable segments), as its documentation, public
// discussions and memory snapshots describe it. The model decides what PyTorch would do; its
// segment calls go to a SimulatedDevice of its own, whose counters are the target's upstream calls.
//
// The rules modelled (constants, rounding, pools and settings shared with "pytorch-expandable"
// live in pytorch_rules.hpp):
//  - Request sizes are rounded up to a multiple of 512 B (at least 512 B); with
//    roundup_power2_divisions:N, sizes above N * 512 B are rounded up to the next of N equal
//    divisions between two powers of two.
//  - Two pools: rounded sizes <= 1 MiB are "small" and live in 2 MiB segments; larger ones are
//    "large": a request < 10 MiB gets a 20 MiB segment, a larger one a segment of its size rounded
//    up to 2 MiB.
//  - A request takes the smallest free block of its pool and stream that fits (ties: lowest
//    address). With max_split_size set, a request below it never takes a block >= max_split_size,
//    and a request >= max_split_size takes a cached block only if it is < request + 20 MiB.
//  - The block is split when the remainder is worth keeping: small pool when the remainder is
//    >= 512 B; large pool when the request is below max_split_size and the remainder is > 1 MiB.
//    The allocation takes the front; otherwise it takes the whole block (and counts it all as
//    allocated, as PyTorch does).
//  - A freed block merges with its free address neighbours in the same segment only: segments
//    are separate cudaMalloc calls and never merge.
//  - A block used on other streams (record_stream) becomes free only after the host synchronized
//    each of those streams following the free (the replay's stand-in for CUDA events).
//  - No free block fits: cudaMalloc a new segment. If the device is full: with max_split_size set,
//    first release cached oversize segments of the stream (the smallest one big enough, else the
//    largest ones until enough is freed) and retry; then wait for pending frees, release every
//    fully free segment of both pools and retry; then throw OutOfMemoryError.
//  - seed_segment() adopts a segment PyTorch held at window start as a free segment (its pool from
//    kFlagSmallPool); its cudaMalloc is not one of the window's upstream calls. Blocks live at
//    window start come as allocate() calls (best fit, which packs them at the front of the seeded
//    segments) or, through seed_alloc(), at the very offset they had
//    in the recording, free gaps included.
//
// Not modelled: expandable segments (a seed flagged kFlagExpandable is adopted as a plain segment;
// the "pytorch-expandable" target models that mode, pytorch_expandable_model.cpp),
// garbage_collection_threshold, the per-process memory fraction, CUDA graph private pools, and
// the placement of new segments in the address space (the simulated device hands out ascending
// addresses, which only matters for ties between free blocks of equal size).
//
// Invariants (checked by the tests through the interface):
//  - reserved_ == sum of the sizes of live segments == sum of the sizes of all blocks;
//  - allocated_ == sum of the sizes of allocated blocks;
//  - every block in free_[p] is free (not allocated, not pending), and belongs to pool p;
//  - address neighbours (prev/next) are never both free after free_block(): they were merged.

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

using model::kUnlimited;
using model::round_up;

constexpr const char* kName = "pytorch";

using pytorch_rules::kLargeBuffer;
using pytorch_rules::kMinBlockSize;
using pytorch_rules::kMinLargeAlloc;
using pytorch_rules::kRoundLarge;
using pytorch_rules::kSmallBuffer;
using pytorch_rules::kSmallSize;
using pytorch_rules::Settings;

struct Block {
  Address addr = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;  // the stream of its segment (blocks never change stream)
  Pool pool = Pool::large;
  Block* prev = nullptr;  // address neighbours inside the same segment (nullptr at its ends)
  Block* next = nullptr;
  bool allocated = false;
  bool pending = false;  // freed, waiting for the streams in `uses` to pass `marks`
  std::vector<Stream> uses;           // other streams it was used on (record_stream)
  std::vector<std::uint64_t> marks;   // StreamClock marks taken when it was freed

  bool whole_segment() const noexcept { return prev == nullptr && next == nullptr; }
  bool is_free() const noexcept { return !allocated && !pending; }
};

// Best fit: by stream, then size, then address (PyTorch's own ordering of its free blocks).
struct BySize {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

class PyTorchModel final : public ReplayTarget {
 public:
  explicit PyTorchModel(const TargetOptions& options)
      : settings_(pytorch_rules::parse_settings(options.conf, kName, false)),
        device_(device_options(options)) {}

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
    u.syncs += event_syncs_;
    return u;
  }

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    SimulatedDeviceOptions d;
    d.name = "pytorch-model";
    d.ordinal = o.device;
    d.capacity = o.capacity;
    d.segment_granularity = kRoundLarge;  // every PyTorch segment is a multiple of 2 MiB
    d.supports_virtual_memory = false;
    return d;
  }

  std::size_t round_size(std::size_t bytes) const noexcept;
  static std::size_t segment_size(std::size_t size) noexcept;
  bool should_split(const Block& b, std::size_t size) const noexcept;

  Block* find_free(Pool pool, Stream stream, std::size_t size);
  Block* grow(Pool pool, Stream stream, std::size_t size);
  Block* new_segment(Pool pool, Stream stream, std::size_t segment);
  Block* take(Block* b, std::size_t size);
  Block* split_at(Block* b, std::size_t offset);
  Block* seeded_free_block(const trace::Event& seed);
  void give_gap_to_prev(Block* gap);
  void free_block(Block* b);
  Block* absorb(Block* low, Block* high);
  void process_pending();
  void complete_all_pending();
  bool release_oversize(Pool pool, Stream stream, std::size_t size);
  void release_cached();
  void release_segment(Block* b);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);

  Settings settings_;
  SimulatedDevice device_;
  UpstreamCounts baseline_;        // the device calls of seeding, not part of the window
  std::uint64_t event_syncs_ = 0;  // host waits on pending frees (release_cached)
  model::StreamClock clock_;
  std::unordered_map<Address, std::unique_ptr<Block>> blocks_;  // every block, by address
  std::set<Block*, BySize> free_[kNumPools];
  std::vector<Block*> pending_;  // freed blocks waiting for other streams
  // Seeded segments: trace address -> (model address, size), to place seed_alloc blocks exactly.
  std::map<std::uint64_t, std::pair<Address, std::size_t>> seeds_;
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
};

// --- sizes --------------------------------------------------------------------------------

std::size_t PyTorchModel::round_size(std::size_t bytes) const noexcept {
  return pytorch_rules::round_size(bytes, settings_.divisions);
}

std::size_t PyTorchModel::segment_size(std::size_t size) noexcept {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

bool PyTorchModel::should_split(const Block& b, std::size_t size) const noexcept {
  const std::size_t remaining = b.size - size;
  if (b.pool == Pool::small) return remaining >= kMinBlockSize;
  return size < settings_.max_split_size && remaining > kSmallSize;
}

// --- allocation ---------------------------------------------------------------------------

void* PyTorchModel::allocate(std::size_t bytes, Stream stream) {
  process_pending();
  // Beyond any device: fail before the rounding arithmetic could overflow.
  if (bytes > device_.properties().capacity) throw_oom(bytes, bytes, stream);
  const std::size_t size = round_size(bytes);
  const Pool pool = pytorch_rules::pool_of(size);
  Block* b = find_free(pool, stream, size);
  if (b == nullptr) b = grow(pool, stream, size);
  if (b == nullptr) throw_oom(bytes, size, stream);
  return reinterpret_cast<void*>(take(b, size)->addr);
}

// The best-fit candidate, removed from the free set; nullptr when it is missing or ruled out by
// max_split_size (every later candidate is larger, so only the first one matters).
Block* PyTorchModel::find_free(Pool pool, Stream stream, std::size_t size) {
  auto& set = free_[static_cast<int>(pool)];
  Block key;
  key.stream = stream;
  key.size = size;
  const auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  if (!pytorch_rules::may_serve(b->size, size, settings_.max_split_size)) return nullptr;
  set.erase(it);
  return b;
}

// A new segment for `size`, freeing cached memory when the device is full; nullptr: out of memory.
Block* PyTorchModel::grow(Pool pool, Stream stream, std::size_t size) {
  const std::size_t segment = segment_size(size);
  if (Block* b = new_segment(pool, stream, segment)) return b;
  if (release_oversize(pool, stream, size))
    if (Block* b = new_segment(pool, stream, segment)) return b;
  release_cached();
  return new_segment(pool, stream, segment);
}

Block* PyTorchModel::new_segment(Pool pool, Stream stream, std::size_t segment) {
  void* p = device_.allocate_segment(segment, stream);
  if (p == nullptr) return nullptr;
  auto owned = std::make_unique<Block>();
  Block* b = owned.get();
  b->addr = reinterpret_cast<Address>(p);
  b->size = segment;
  b->stream = stream;
  b->pool = pool;
  blocks_.emplace(b->addr, std::move(owned));
  reserved_ += segment;
  return b;
}

// Marks `b` (not in any free set) allocated for `size` bytes, splitting off the tail if worth it.
Block* PyTorchModel::take(Block* b, std::size_t size) {
  if (should_split(*b, size)) free_[static_cast<int>(b->pool)].insert(split_at(b, size));
  b->allocated = true;
  allocated_ += b->size;
  return b;
}

// Cuts `b` (in no free set) in two at `offset`; returns the new upper part (in no free set).
Block* PyTorchModel::split_at(Block* b, std::size_t offset) {
  auto owned = std::make_unique<Block>();
  Block* rest = owned.get();
  rest->addr = b->addr + offset;
  rest->size = b->size - offset;
  rest->stream = b->stream;
  rest->pool = b->pool;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  blocks_.emplace(rest->addr, std::move(owned));
  return rest;
}

[[noreturn]] void PyTorchModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
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

void PyTorchModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
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
  // PyTorch records an event on each stream that used the block; the block is reusable once
  // all of them completed.
  b->pending = true;
  b->marks.clear();
  for (Stream s : b->uses) b->marks.push_back(clock_.mark(s));
  pending_.push_back(b);
}

void PyTorchModel::record_stream(void* ptr, Stream stream) {
  const auto it = blocks_.find(reinterpret_cast<Address>(ptr));
  if (it == blocks_.end() || !it->second->allocated)
    throw UsageError(std::string(kName) + ": record_stream on a pointer that is not allocated");
  Block* b = it->second.get();
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
}

// Merges `b` (free, in no set) with its free neighbours and returns the result to its pool.
void PyTorchModel::free_block(Block* b) {
  if (b->prev != nullptr && b->prev->is_free()) b = absorb(b->prev, b);
  if (b->next != nullptr && b->next->is_free()) b = absorb(b, b->next);
  free_[static_cast<int>(b->pool)].insert(b);
}

// Merges `high` into its lower neighbour `low` (the survivor keeps its address, hence its key in
// blocks_). Whichever of the two is in a free set is taken out first: the set is keyed by size.
Block* PyTorchModel::absorb(Block* low, Block* high) {
  auto& set = free_[static_cast<int>(low->pool)];
  set.erase(low);
  set.erase(high);
  low->size += high->size;
  low->next = high->next;
  if (low->next != nullptr) low->next->prev = low;
  blocks_.erase(high->addr);
  return low;
}

// Frees the pending blocks whose other streams have all been synchronized since the free.
void PyTorchModel::process_pending() {
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
void PyTorchModel::complete_all_pending() {
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

// With max_split_size set: frees cached oversize segments of `stream` to make room for `size`:
// the smallest one that is large enough, else the largest ones until enough bytes were freed.
// True when enough was freed to be worth retrying.
bool PyTorchModel::release_oversize(Pool pool, Stream stream, std::size_t size) {
  const std::size_t max_split = settings_.max_split_size;
  if (max_split == kUnlimited) return false;
  auto& set = free_[static_cast<int>(pool)];
  Block key;
  key.stream = stream;
  key.size = std::max(size, max_split);
  auto it = set.lower_bound(&key);
  if (it != set.end() && (*it)->stream == stream) {
    Block* b = *it;
    if (!b->whole_segment()) return false;  // oversize blocks are never split: whole
    set.erase(it);
    release_segment(b);
    return true;
  }
  std::size_t released = 0;
  while (released < key.size && it != set.begin()) {
    Block* b = *--it;
    if (b->stream != stream || b->size < max_split) break;
    if (!b->whole_segment()) continue;
    released += b->size;
    it = set.erase(it);  // the element after b: --it reaches b's predecessor next time
    release_segment(b);
  }
  return released >= key.size;
}

// Waits for pending frees, then returns every fully free segment of both pools to the device.
void PyTorchModel::release_cached() {
  complete_all_pending();
  for (auto& set : free_) {
    std::vector<Block*> whole;
    for (Block* b : set)
      if (b->whole_segment()) whole.push_back(b);
    for (Block* b : whole) {
      set.erase(b);
      release_segment(b);
    }
  }
}

// `b` is a whole free segment, already out of its free set.
void PyTorchModel::release_segment(Block* b) {
  const std::size_t size = b->size;
  device_.free_segment(reinterpret_cast<void*>(b->addr), size, b->stream);
  reserved_ -= size;
  blocks_.erase(b->addr);
}

// --- seeding ------------------------------------------------------------------------------

void PyTorchModel::seed_segment(const trace::Event& seed) {
  const Pool pool = (seed.flags & trace::kFlagSmallPool) != 0 ? Pool::small : Pool::large;
  // PyTorch's segments are multiples of 2 MiB; an expandable-segment range need not be.
  const std::size_t size = round_up(std::max<std::size_t>(seed.size, 1), kRoundLarge);
  const UpstreamCounts before = upstream_of(device_);
  Block* b = new_segment(pool, seed.stream, size);
  if (b == nullptr) throw_oom(seed.size, size, seed.stream);
  // The seed's cudaMalloc happened before the window: keep it out of upstream().
  const UpstreamCounts cost = model::minus(upstream_of(device_), before);
  baseline_.allocs += cost.allocs;
  baseline_.frees += cost.frees;
  baseline_.maps += cost.maps;
  baseline_.unmaps += cost.unmaps;
  baseline_.syncs += cost.syncs;
  baseline_.modelled_ns += cost.modelled_ns;
  free_[static_cast<int>(pool)].insert(b);
  seeds_[seed.addr] = {b->addr, size};
}

// Places a block live at window start where it was in the recording: at its offset in its seeded
// segment. Falls back to allocate() when it lies in no seeded segment or its place is not free.
void* PyTorchModel::seed_alloc(const trace::Event& seed) {
  Block* f = seeded_free_block(seed);
  if (f == nullptr) return allocate(seed.size, seed.stream);
  // f is out of its free set and starts at the recorded place; what precedes it is a gap.
  if (f->prev != nullptr && !f->prev->allocated) give_gap_to_prev(f->prev);
  // The tail follows PyTorch's split rule: in the large pool a remainder of 1 MiB or less was
  // never split off (and no later seed can start in it: large-pool blocks are above 1 MiB).
  return reinterpret_cast<void*>(take(f, round_size(seed.size))->addr);
}

// The free block at the recorded address of `seed`, split there and taken out of its free set;
// nullptr when the address is in no seeded segment or [addr, addr + size) is not free there.
Block* PyTorchModel::seeded_free_block(const trace::Event& seed) {
  auto it = seeds_.upper_bound(seed.addr);
  if (it == seeds_.begin()) return nullptr;
  --it;
  const auto [base, segment] = it->second;
  const std::uint64_t offset = seed.addr - it->first;
  const std::size_t size = round_size(seed.size);
  if (offset >= segment || size > segment - offset) return nullptr;
  const auto head = blocks_.find(base);  // gone if the segment was released meanwhile
  if (head == blocks_.end()) return nullptr;
  const Address x = base + offset;
  Block* f = head->second.get();
  while (f != nullptr && f->addr + f->size <= x) f = f->next;
  if (f == nullptr || !f->is_free() || x + size > f->addr + f->size) return nullptr;
  auto& set = free_[static_cast<int>(f->pool)];
  set.erase(f);
  if (x == f->addr) return f;
  Block* at = split_at(f, x - f->addr);
  set.insert(f);
  return at;
}

// `gap` is the free block just before a seed placed by seed_alloc(). In the large pool a free
// block of 1 MiB or less cannot exist (splits leave more than 1 MiB): such a gap is the unsplit
// tail of the allocated block before it.
void PyTorchModel::give_gap_to_prev(Block* gap) {
  Block* owner = gap->prev;
  if (gap->pool != Pool::large || gap->size > kSmallSize || owner == nullptr || !owner->allocated)
    return;
  free_[static_cast<int>(gap->pool)].erase(gap);
  owner->size += gap->size;
  allocated_ += gap->size;
  owner->next = gap->next;
  if (owner->next != nullptr) owner->next->prev = owner;
  blocks_.erase(gap->addr);
}

}  // namespace

std::unique_ptr<ReplayTarget> make_pytorch_target(const TargetOptions& options) {
  return std::make_unique<PyTorchModel>(options);
}

}  // namespace tensorpool::replay

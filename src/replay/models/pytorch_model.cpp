// pytorch_model.cpp: the "pytorch" replay target, a model of PyTorch's native CUDA caching
// allocator (cudaMalloc segments, not expandable segments), as its documentation, public
// discussions and memory snapshots describe it. The model decides what PyTorch would do; its
// segment calls go to a SimulatedDevice of its own, whose counters are the target's upstream calls.
// Each cudaFree of a segment waits for the device and counts as a host synchronization.
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
//  - Snapshot export: record_history() records alloc, free and segment events; the blocks give
//    the segments (chains of neighbours).
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
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "replay/models/model_support.hpp"
#include "replay/models/models.hpp"
#include "replay/models/pytorch_common.hpp"
#include "replay/models/pytorch_rules.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::replay {

namespace {

using model::kUnlimited;

constexpr const char* kName = "pytorch";

using pytorch_common::Block;
using pytorch_rules::kLargeBuffer;
using pytorch_rules::kMinBlockSize;
using pytorch_rules::kMinLargeAlloc;
using pytorch_rules::kRoundLarge;
using pytorch_rules::kSmallBuffer;
using pytorch_rules::kSmallSize;

class PyTorchModel final : public pytorch_common::CachingModel {
 public:
  explicit PyTorchModel(const TargetOptions& options)
      : CachingModel(options, kName, false, device_options(options)) {}

  void seed_segment(const trace::TraceEvent& seed) override;
  void* seed_alloc(const trace::TraceEvent& seed) override;
  bool record_history() override {
    start_history();
    return true;
  }

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    SimulatedDeviceOptions d = pytorch_common::device_options(o, "pytorch-model");
    d.supports_virtual_memory = false;
    return d;
  }

  static std::size_t segment_size(std::size_t size) noexcept;
  bool should_split(const Block& b, std::size_t size) const noexcept override;

  Block* grow(Pool pool, Stream stream, std::size_t size) override;
  Block* new_segment(Pool pool, Stream stream, std::size_t segment);
  Block* seeded_free_block(const trace::TraceEvent& seed);
  void give_gap_to_prev(Block* gap);
  bool release_oversize(Pool pool, Stream stream, std::size_t size);
  void release_cached() override;
  void release_segment(Block* b);
};

// --- sizes --------------------------------------------------------------------------------

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
  Block* b = new_block(reinterpret_cast<Address>(p), segment, stream, pool, nullptr, true);
  reserved_ += segment;
  note(EventType::segment_alloc, b->addr, 0, segment, stream);
  return b;
}

// --- releasing cached memory --------------------------------------------------------------

// With max_split_size set: frees cached oversize segments of `stream` to make room for `size`:
// the smallest one that is large enough, else the largest ones until enough bytes were freed.
// True when enough was freed to be worth retrying.
bool PyTorchModel::release_oversize(Pool pool, Stream stream, std::size_t size) {
  const std::size_t max_split = settings_.max_split_size;
  if (max_split == kUnlimited) return false;
  auto& set = free_set(pool);
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
  model::cuda_free(device_, reinterpret_cast<void*>(b->addr), size, b->stream);
  note(EventType::segment_free, b->addr, 0, size, b->stream);
  reserved_ -= size;
  blocks_.erase(b->addr);
}

// --- seeding ------------------------------------------------------------------------------

void PyTorchModel::seed_segment(const trace::TraceEvent& seed) {
  const Pool pool = pytorch_common::seed_pool(seed);
  // PyTorch's segments are multiples of 2 MiB; an expandable-segment range need not be.
  const std::size_t size = round_up(std::max<std::size_t>(seed.size, 1), kRoundLarge);
  const UpstreamCounts before = upstream_of(device_);
  Block* b = new_segment(pool, seed.stream, size);
  if (b == nullptr) throw_oom(seed.size, size, seed.stream);
  // The seed's cudaMalloc happened before the window: keep it out of upstream().
  exclude_from_window(before);
  free_set(pool).insert(b);
  seeds_[seed.addr] = {b->addr, size};
}

// Places a block live at window start where it was in the recording: at its offset in its seeded
// segment. Falls back to allocate() when it lies in no seeded segment or its place is not free.
void* PyTorchModel::seed_alloc(const trace::TraceEvent& seed) {
  Block* f = seeded_free_block(seed);
  if (f == nullptr) return allocate(seed.size, seed.stream);
  // f is out of its free set and starts at the recorded place; what precedes it is a gap.
  if (f->prev != nullptr && !f->prev->allocated) give_gap_to_prev(f->prev);
  // The tail follows PyTorch's split rule: in the large pool a remainder of 1 MiB or less was
  // never split off (and no later seed can start in it: large-pool blocks are above 1 MiB).
  Block* b = take(f, round_size(seed.size));
  b->requested = seed.size;
  note(EventType::alloc, b->addr, seed.size, b->size, seed.stream);
  return reinterpret_cast<void*>(b->addr);
}

// The free block at the recorded address of `seed`, split there and taken out of its free set;
// nullptr when the address is in no seeded segment or [addr, addr + size) is not free there.
Block* PyTorchModel::seeded_free_block(const trace::TraceEvent& seed) {
  const auto place = seeded_place(seed.addr);
  const std::size_t size = round_size(seed.size);
  if (!place || size > place->length - place->offset) return nullptr;
  const auto head = blocks_.find(place->start);  // gone if the segment was released meanwhile
  if (head == blocks_.end()) return nullptr;
  const Address x = place->start + place->offset;
  Block* f = head->second.get();
  while (f != nullptr && f->addr + f->size <= x) f = f->next;
  return carve_free(f, x, size);
}

// `gap` is the free block just before a seed placed by seed_alloc(). In the large pool a free
// block of 1 MiB or less cannot exist (splits leave more than 1 MiB): such a gap is the unsplit
// tail of the allocated block before it.
void PyTorchModel::give_gap_to_prev(Block* gap) {
  Block* owner = gap->prev;
  if (gap->pool != Pool::large || gap->size > kSmallSize || owner == nullptr || !owner->allocated)
    return;
  free_set(gap->pool).erase(gap);
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

TargetEntry pytorch_entry() {
  return {{kName,
           "a model of PyTorch's native CUDA caching allocator, started from PyTorch's own "
           "segments at the window start",
           pytorch_rules::settings_keys(), /*holds_memory_until_destroyed=*/false,
           /*exports=*/true, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) {
            pytorch_rules::parse_settings(conf, origin, false);
          },
          make_pytorch_target};
}

}  // namespace tensorpool::replay

// allocator_state.hpp: what every part of one allocator shares: the device, the settings, the
// shards (locks, pointer maps, Blocks, counters), the streams with their free indexes, the
// segments, the device-level counters and the hooks.
//
// Allocator::Impl (allocator_impl.hpp) is the coordinator built on it; the segment sources
// (segment_source.hpp) get a reference to it. Locking (shards.hpp): a stream's free indexes and
// plan state, and its shard's pointer map, Blocks and counters, may change under that shard's
// lock (the fast path); everything else only in the exclusive mode (every in-use shard's lock), and
// every function here but the fast path's runs in it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/block.hpp"
#include "core/counters.hpp"
#include "core/free_index.hpp"
#include "core/graph_pools.hpp"
#include "core/hooks.hpp"
#include "core/plan_state.hpp"
#include "core/shards.hpp"
#include "core/step_finder.hpp"
#include "core/tags.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/device.hpp"

namespace tensorpool::detail {

/// A free waiting for a stream: the event recorded on a stream that may still use the block.
struct PendingFree {
  DeviceEvent event;
  Block* block;
};

/// What a StreamState stands for: a stream, and the tag its allocations were made under
/// (tagged blocks come from segments of their own, so that sleep(tag) can give them back alone).
struct StreamKey {
  Stream stream = kDefaultStream;
  TagId tag = 0;
  friend bool operator==(const StreamKey&, const StreamKey&) = default;
};
/// An untagged key hashes as its stream alone: the table's order, which the OOM ladder follows,
/// is the one it had before tags (replays stay put).
struct StreamKeyHash {
  std::size_t operator()(const StreamKey& k) const noexcept {
    return std::hash<Stream>{}(k.stream) ^ (static_cast<std::size_t>(k.tag) * 0x9e3779b97f4a7c15ULL);
  }
};

/// Per stream and tag: the free blocks of the segments it owns, and its pending frees.
struct alignas(64) StreamState {  // a cache line of its own: streams of other shards change side by side
  StreamState(StreamKey k, Shard& sh) : stream(k.stream), shard(&sh), tag(k.tag) {}
  Stream stream;  // the device's stream (two states share it when their tags differ)
  Shard* shard;  // never null: where this stream's blocks are counted and looked up
  FreeIndex index[kNumIndexKinds];
  std::deque<PendingFree> pending;  // FIFO: events on one stream complete in order
  /// Per pool: the plan state of this stream's vmm heap (owned by the heap's PlanCursor; null: no
  /// heap, or fixed segments). While it follows a plan (or waits to lay its pages out for one), an
  /// allocation asks the segment source for its planned block before the free index
  /// (SegmentSource::take_planned).
  std::array<const PlanState*, kNumPools> plan_state{};
  /// Per pool: this stream's vmm heap (vmm_heaps.hpp; null: none yet, or fixed segments).
  std::array<Heap*, kNumPools> vmm_heaps{};
  TagId tag;  // the fields the fast path reads first keep their places on the cache lines
  /// vmm_find_steps: what finds this stream's steps (step_finder.hpp; null: not looking), and
  /// whether it found a boundary that the stream's next allocation makes first (in the exclusive
  /// mode: the fast path declines while it is set).
  std::unique_ptr<StepFinder> step_finder;
  bool step_due = false;

  bool follows_plan(Pool pool) const noexcept {
    const PlanState* s = plan_state[static_cast<int>(pool)];
    return s != nullptr && plan_asks_source(*s);
  }
  /// Whether the heap of `pool` follows its plan with its pages in place (no device call needed).
  bool plan_ready(Pool pool) const noexcept {
    const PlanState* s = plan_state[static_cast<int>(pool)];
    return s != nullptr && *s == PlanState::following;
  }
};

/// The streams seen so far, with a one-entry cache in front of the hash map (the exclusive mode's
/// path; the fast path finds its stream through a thread-local cache, allocator.cpp). A
/// StreamState lives as long as the allocator (segments point to their owner's). Streams go to
/// the shards round robin, in the order they are first seen.
class StreamTable {
 public:
  using Map = std::unordered_map<StreamKey, std::unique_ptr<StreamState>, StreamKeyHash>;

  explicit StreamTable(Shards& shards) : shards_(shards) {}

  /// Whether the streams made from now on look for their steps (a StepFinder each).
  void find_steps(bool on) noexcept { find_steps_ = on; }
  /// No stream looks for steps any more (the program calls Allocator::step() itself).
  void stop_finding_steps() noexcept {
    find_steps_ = false;
    for (auto& [key, state] : map_) {
      state->step_finder.reset();
      state->step_due = false;
    }
  }

  TP_ALWAYS_INLINE StreamState& get(StreamKey key) {
    if (last_state_ != nullptr && last_key_ == key) return *last_state_;
    return get_slow(key);
  }
  // Iteration in the hash map's order (which decides, for instance, which stream's cached
  // block the OOM ladder takes first: keep the container if replay figures are to stay put).
  Map::iterator begin() noexcept { return map_.begin(); }
  Map::iterator end() noexcept { return map_.end(); }
  Map::const_iterator begin() const noexcept { return map_.begin(); }
  Map::const_iterator end() const noexcept { return map_.end(); }

 private:
  StreamState& get_slow(StreamKey key);  // allocator.cpp

  Shards& shards_;
  Map map_;
  StreamKey last_key_;  // last_state_ == map_[last_key_] unless null
  StreamState* last_state_ = nullptr;
  bool find_steps_ = false;
};

struct AllocatorState {
  /// Checks the device (not null) and the settings (Config::validate).
  AllocatorState(std::shared_ptr<DeviceBackend> device_backend, Config settings);

  std::shared_ptr<DeviceBackend> device;  // never null
  DeviceProperties props;                 // device->properties() at construction
  Config config;                          // validated (a source may narrow it: vmm has no oversize)
  std::size_t limit = 0;                  // cap on reserved bytes, 0: none
  mutable Shards shards;  // before `streams`, which hands them out
  std::map<Address, std::unique_ptr<Segment>> segments;  // every segment, by address; disjoint
  StreamTable streams{shards};
  Counters counters;  // what no shard counts: reserved bytes, segments, the slow paths' calls
  Hooks hooks;
  /// CUDA graph pools and the streams captured into them (graph_capture.cpp). While a capture is
  /// underway nothing queries or records events, synchronizes, or lays pages out for a plan (CUDA
  /// refuses such calls during a capture); the fast path asks too.
  GraphPools graphs;
  bool capture_underway() const noexcept { return graphs.captures() != 0; }

  /// In the exclusive mode: the allocated block at addr, in whichever shard maps it, or nullptr.
  Block* find_live(Address addr) const noexcept {
    for (std::size_t i = 0; i < shards.in_use(); ++i)
      if (Block* b = shards[i].live.find(addr)) return b;
    return nullptr;
  }
  /// The pool of the Blocks of segment `seg` (its owner's shard's).
  static BlockPool& blocks_of(const Segment* seg) noexcept { return seg->owner->shard->blocks; }
  /// The shard that counts the blocks of `seg` and maps their addresses.
  static Shard& shard_of(const Segment* seg) noexcept { return *seg->owner->shard; }

  /// Requests this large get oversize segments (never split, reused only with little slack).
  bool is_oversize_request(std::size_t size) const noexcept {
    return config.max_split_size != 0 && size >= config.max_split_size;
  }
  /// Before a source asks the device for memory for `stream`: UsageError when the device says the
  /// stream is being captured into a CUDA graph (the call would invalidate the capture; a stream
  /// captured into a graph pool never gets here). Defined in graph_capture.cpp.
  void refuse_if_captured(Stream stream) const;
  /// Whether `bytes` more of reserved memory stay within the memory limit.
  bool within_limit(std::size_t bytes) const noexcept {
    return limit == 0 || counters.reserved() + bytes <= limit;
  }
  /// What the allocator could still create: the device's free memory (a device call), and no
  /// more than the memory limit leaves.
  std::size_t room_left() const {
    const std::size_t device_free = device->free_memory();
    if (limit == 0) return device_free;
    const std::size_t reserved = counters.reserved();
    return std::min(device_free, reserved >= limit ? 0 : limit - reserved);
  }
  /// vmm: the share of a pool exposing `exposed` bytes that a growth maps at least (before the
  /// page bounds of VmmHeaps::growth_step()): 1/vmm_growth_divisor of it, at most vmm_max_growth.
  std::size_t growth_share(std::size_t exposed) const noexcept {
    return std::min(exposed / config.vmm_growth_divisor, config.vmm_max_growth);
  }
  /// The free index of `ss` that a segment of this kind puts its free blocks in.
  static FreeIndex& index_for(StreamState& ss, Pool pool, bool oversize) noexcept {
    return ss.index[pool == Pool::small ? kSmallIndex : oversize ? kOversizeIndex : kLargeIndex];
  }

  /// Whether free block b merges with its neighbour x: x is free, of the same mapping, and not
  /// held (a vmm heap's held pages, in no index, stay apart).
  TP_ALWAYS_INLINE static bool merges_with(const Block* x, const Block* b) noexcept {
    return x != nullptr && x->state == BlockState::free && x->mapped == b->mapped && !x->held;
  }
  /// Merges free block b (in no index) with its free neighbours of the same mapping, taking them
  /// out of their index; returns the merged block (in no index).
  TP_ALWAYS_INLINE static Block* coalesce(Block* b) {
    Segment* seg = b->segment;
    BlockPool& blocks = blocks_of(seg);
    if (Block* p = b->prev; merges_with(p, b)) {
      seg->index->remove(p);
      b = p;
      blocks.absorb_next(b);
    }
    if (Block* n = b->next; merges_with(n, b)) {
      seg->index->remove(n);
      blocks.absorb_next(b);
    }
    return b;
  }
  /// coalesce() with its answers known: whether b merges with the block below it and above it.
  TP_ALWAYS_INLINE static Block* merge_neighbours(Block* b, bool below, bool above) {
    Segment* seg = b->segment;
    BlockPool& blocks = blocks_of(seg);
    if (below) {
      seg->index->remove(b->prev);
      b = b->prev;
      blocks.absorb_next(b);
    }
    if (above) {
      seg->index->remove(b->next);
      blocks.absorb_next(b);
    }
    return b;
  }
};

}  // namespace tensorpool::detail

// allocator_impl.hpp: the state of one device's caching allocator (Allocator::Impl).
//
// Layers inside: PointerMap (live blocks by address) and per-stream FreeIndex (free blocks by
// size) over Segments tiled by Blocks, over the DeviceBackend. allocator.cpp holds the hot paths
// (a cached allocate and a deallocate), allocator_slow.cpp everything that talks to the device
// (new segments, events, the OOM ladder, empty_cache), inspect.cpp the read-only views
// (stats, fragmentation, snapshot, check_invariants).
//
// Every member runs with mutex_ held unless its name ends in _unlocked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "core/free_index.hpp"
#include "core/lock.hpp"
#include "core/pointer_map.hpp"
#include "tensorpool/allocator.hpp"

#ifndef TENSORPOOL_DEBUG_INVARIANTS
#define TENSORPOOL_DEBUG_INVARIANTS 0
#endif

namespace tensorpool::detail {

/// A free waiting for a stream: the event recorded on a stream that may still use the block.
struct PendingFree {
  DeviceEvent event;
  Block* block;
};

/// Per stream: the free blocks of the segments it owns, and the events recorded on it.
struct StreamState {
  explicit StreamState(Stream s) : stream(s) {}
  Stream stream;
  FreeIndex index[kNumIndexKinds];
  Segment* heaps[kNumPools] = {nullptr, nullptr};  // virtual-memory mode: one heap per pool
  std::deque<PendingFree> pending;  // FIFO: events on one stream complete in order
};

}  // namespace tensorpool::detail

namespace tensorpool {

class Allocator::Impl {
 public:
  Impl(std::shared_ptr<DeviceBackend> device, Config config);
  ~Impl();

  // Hot paths (allocator.cpp).
  void* allocate(std::size_t bytes, Stream stream);
  void deallocate(void* ptr);
  void record_stream(void* ptr, Stream stream);

  // Device-facing paths (allocator_slow.cpp).
  void empty_cache();
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;
  HookId add_observer(std::shared_ptr<Observer> observer);
  HookId add_oom_observer(OomObserver observer);
  HookId add_free_memory_callback(FreeMemoryCallback callback);
  bool remove_hook(HookId id);

  // Views (inspect.cpp).
  Stats stats() const;
  MemoryUsage usage() const;
  void reset_peaks();
  FragmentationReport fragmentation() const;
  Snapshot snapshot() const;
  void check_invariants() const;

  const Config& config() const noexcept { return config_; }
  DeviceBackend& device() const noexcept { return *device_; }

 private:
  using Block = detail::Block;
  using Segment = detail::Segment;
  using StreamState = detail::StreamState;
  using Lock = std::unique_lock<detail::FutexLock>;

  // --- hot-path helpers (allocator.cpp) ---
  StreamState& state_for(Stream stream);
  StreamState& state_for_slow(Stream stream);
  bool is_oversize_request(std::size_t size) const noexcept {
    return config_.max_split_size != 0 && size >= config_.max_split_size;
  }
  Block* find_cached(StreamState& ss, Pool pool, std::size_t size) const noexcept;
  Block* take(Block* b, std::size_t size, std::size_t requested);
  void split(Block* b, std::size_t size);
  Block* split_raw(Block* b, std::size_t offset);
  void absorb_next(Block* b) noexcept;
  void release_block(Block* b);
  Block* coalesce(Block* b);
  void add_stat(Metric m, Pool p, std::int64_t delta) noexcept;
  void account_alloc(Pool p, std::int64_t size, std::int64_t requested) noexcept;
  void account_free(Pool p, std::int64_t size, std::int64_t requested) noexcept;
  void account_inactive(Pool p, std::int64_t size) noexcept;
  void notify(EventType type, Address addr, std::size_t requested, std::size_t size, Stream stream);

  // --- slow paths (allocator_slow.cpp) ---
  Block* allocate_slow(StreamState& ss, Pool pool, std::size_t size, std::size_t bytes, Lock& lock);
  Block* find_or_grow(StreamState& ss, Pool pool, std::size_t size);
  Block* new_segment(StreamState& ss, Pool pool, std::size_t size);
  Block* try_segment(StreamState& ss, Pool pool, bool oversize, std::size_t bytes);
  std::size_t segment_size_for(Pool pool, std::size_t size, bool oversize) const noexcept;
  Block* steal_from_other_stream(StreamState& ss, Pool pool, std::size_t size);
  void add_use(Block* b, Stream stream);
  bool run_free_memory_callbacks(std::size_t size, Lock& lock);
  [[noreturn]] void throw_oom(Stream stream, std::size_t bytes, std::size_t size, Lock& lock);
  void defer_free(Block* b);
  void process_events();
  void synchronize_pending();
  std::size_t release_free_segments();
  void free_segment(Segment* seg);
  DeviceEvent acquire_event();
  void release_event(DeviceEvent e) { event_pool_.push_back(e); }
  [[noreturn]] void throw_bad_pointer(Address addr, const char* operation) const;
  std::size_t largest_free_block() const noexcept;

  // --- virtual-memory mode (vmm.cpp) ---
  bool vmm() const noexcept { return config_.mode == Mode::vmm; }
  Segment& heap_for(StreamState& ss, Pool pool);
  Block* grow_heap(StreamState& ss, Pool pool, std::size_t size);
  std::size_t growth_step(Pool pool) const noexcept;
  std::size_t idle_limit(Pool pool) const noexcept;
  struct Placement {
    Block* hole;        // an unmapped free block
    std::size_t bytes;  // to map at its start (a growth step)
    std::size_t need;   // of which the request needs at least this much
  };
  Placement place(const Segment& heap, std::size_t size) const;
  Block* map_into(Segment& heap, const Placement& where, Pool pool, bool& complete);
  bool create_chunk(std::size_t bytes, Pool pool, detail::Chunk& out);
  std::ptrdiff_t pick_cached(Pool pool, std::size_t want, std::size_t room) const;
  std::size_t idle_physical(Pool pool) const;
  std::size_t reclaim_free_chunks(Pool pool, std::size_t& keep);
  Block* unmap_chunk(Segment& heap, Block* free_block, const detail::Chunk& chunk);
  void mark_unmapped(Segment& heap, Block* b);
  std::size_t release_cached_chunks();
  void destroy_heaps() noexcept;
  void check_heap(const Segment& heap) const;

  // --- views (inspect.cpp) ---
  void check_invariants_locked() const;
  void debug_check() const {
    if constexpr (TENSORPOOL_DEBUG_INVARIANTS) check_invariants_locked();
  }

  std::shared_ptr<DeviceBackend> device_;
  VirtualMemory* vm_ = nullptr;        // vmm: the device's virtual-memory calls
  DeviceProperties props_;
  Config config_;
  std::size_t limit_ = 0;  // cap on reserved bytes, 0: none

  mutable detail::FutexLock mutex_;
  detail::PointerMap live_;            // allocated blocks (not pending_free) by address
  detail::BlockPool block_pool_;
  std::map<Address, std::unique_ptr<Segment>> segments_;
  std::unordered_map<Stream, std::unique_ptr<StreamState>> streams_;
  Stream last_stream_ = kDefaultStream;  // one-entry cache in front of streams_
  StreamState* last_state_ = nullptr;
  std::size_t pending_total_ = 0;      // outstanding PendingFrees over all streams
  std::vector<DeviceEvent> event_pool_;      // created events not in use
  std::vector<detail::Chunk> cached_chunks_;  // vmm: physical chunks mapped nowhere
  std::size_t page_ = 0;               // vmm: the device's physical page size

  std::array<PoolStats, kNumPools> pool_stats_{};
  PoolStats total_stats_{};
  Stats counters_{};                   // only the counter fields are used

  bool has_observers_ = false;         // == !observers_.empty(); read on the hot path
  HookId next_hook_ = 1;
  std::vector<std::pair<HookId, std::shared_ptr<Observer>>> observers_;
  std::vector<std::pair<HookId, OomObserver>> oom_observers_;
  std::vector<std::pair<HookId, FreeMemoryCallback>> free_callbacks_;
};

#define TP_ALWAYS_INLINE inline __attribute__((always_inline))

// --- the block list: inline, every split and merge of the hot path goes through them -----------

// Cuts b after `offset` bytes; the new block has b's state and mapping. No index is touched.
TP_ALWAYS_INLINE detail::Block* Allocator::Impl::split_raw(detail::Block* b, std::size_t offset) {
  detail::Block* rest = block_pool_.acquire();
  rest->addr = b->addr + offset;
  rest->size = b->size - offset;
  rest->segment = b->segment;
  rest->state = b->state;
  rest->mapped = b->mapped;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  ++b->segment->blocks;
  return rest;
}

// b swallows its successor (adjacent in b's segment, in no index, no free set): the successor's
// bytes join b and its Block goes back to the pool.
TP_ALWAYS_INLINE void Allocator::Impl::absorb_next(detail::Block* b) noexcept {
  detail::Block* n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  --b->segment->blocks;
  block_pool_.release(n);
}

// --- statistics: inline, they run several times per operation ---------------------------------

namespace detail {
TP_ALWAYS_INLINE void stat_up(Stat& s, std::int64_t d) noexcept {
  s.current += d;
  s.allocated += d;
  s.peak = s.current > s.peak ? s.current : s.peak;
}
TP_ALWAYS_INLINE void stat_down(Stat& s, std::int64_t d) noexcept {
  s.current -= d;
  s.freed += d;
}
}  // namespace detail

TP_ALWAYS_INLINE void Allocator::Impl::add_stat(Metric m, Pool p, std::int64_t delta) noexcept {
  Stat& a = pool_stats_[static_cast<int>(p)][m];
  Stat& b = total_stats_[m];
  if (delta >= 0) {
    detail::stat_up(a, delta);
    detail::stat_up(b, delta);
  } else {
    detail::stat_down(a, -delta);
    detail::stat_down(b, -delta);
  }
}

TP_ALWAYS_INLINE void Allocator::Impl::account_alloc(Pool p, std::int64_t size,
                                                     std::int64_t requested) noexcept {
  for (PoolStats* s : {&pool_stats_[static_cast<int>(p)], &total_stats_}) {
    detail::stat_up((*s)[Metric::allocated_bytes], size);
    detail::stat_up((*s)[Metric::requested_bytes], requested);
    detail::stat_up((*s)[Metric::allocations], 1);
    detail::stat_up((*s)[Metric::active_bytes], size);
    detail::stat_up((*s)[Metric::active_blocks], 1);
  }
}

TP_ALWAYS_INLINE void Allocator::Impl::account_free(Pool p, std::int64_t size,
                                                    std::int64_t requested) noexcept {
  for (PoolStats* s : {&pool_stats_[static_cast<int>(p)], &total_stats_}) {
    detail::stat_down((*s)[Metric::allocated_bytes], size);
    detail::stat_down((*s)[Metric::requested_bytes], requested);
    detail::stat_down((*s)[Metric::allocations], 1);
  }
}

// The block is no longer active (freed and its stream events done).
TP_ALWAYS_INLINE void Allocator::Impl::account_inactive(Pool p, std::int64_t size) noexcept {
  for (PoolStats* s : {&pool_stats_[static_cast<int>(p)], &total_stats_}) {
    detail::stat_down((*s)[Metric::active_bytes], size);
    detail::stat_down((*s)[Metric::active_blocks], 1);
  }
}

}  // namespace tensorpool

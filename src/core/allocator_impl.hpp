// allocator_impl.hpp: Allocator::Impl, the coordinator of one device's caching allocator.
//
// It owns the shared state (AllocatorState: device, settings, shards with their pointer maps,
// Blocks and counters, streams with their free indexes, segments, hooks), the pending frees, and
// one SegmentSource that says where segments come from (fixed segments or vmm heaps). Nothing here
// depends on the mode: the source is the only part that does. One file per concern:
//
//   allocator.cpp       the public API and the fast path (cached allocate, deallocate)
//   lifecycle.cpp       construction (the source is chosen there), teardown, empty_cache, limit
//   oom_ladder.cpp      what an allocation the cache cannot serve goes through
//   stream_events.cpp   frees that wait for other streams (events), cross-stream uses
//   graph_capture.cpp   CUDA graph capture: the streams served from graph pools (graph_pools.hpp)
//   hooks.cpp           the hook registry and the allocator's hook API
//   inspect.cpp         stats, fragmentation, snapshot, check_invariants, bad-pointer messages
//   fixed_segments.cpp  the fixed-segment source
//   vmm_heaps.cpp       the virtual-memory source
//
// Locking (shards.hpp): allocate and deallocate try the fast path under their stream's shard's
// lock (allocate_cached, free_cached: when they decline they change nothing but merge the shard's
// seam, which the exclusive mode would merge anyway) and otherwise take
// the exclusive mode (every shard's lock), as every other public function does (but state(),
// whose config and device do not change after construction). Every private member function but
// those of the fast path runs in the exclusive mode.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator_state.hpp"
#include "core/shards.hpp"
#include "core/segment_source.hpp"
#include "tensorpool/allocator.hpp"

#ifndef TENSORPOOL_DEBUG_INVARIANTS
#define TENSORPOOL_DEBUG_INVARIANTS 0
#endif

namespace tensorpool {

class Allocator::Impl : private detail::AllocatorState {
 public:
  Impl(std::shared_ptr<DeviceBackend> device, Config config);
  ~Impl();

  // The fast path (allocator.cpp).
  void* allocate(std::size_t bytes, Stream stream);
  void deallocate(void* ptr);
  void record_stream(void* ptr, Stream stream);

  // Life (lifecycle.cpp).
  void empty_cache();
  void step();
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;
  SleepReport sleep(detail::Sleepers who, Contents contents);
  void wake(detail::Sleepers who);
  SleepReport asleep() const;
  bool is_asleep(const void* ptr) const;

  // CUDA graphs (graph_capture.cpp).
  GraphPool begin_capture(Stream stream, std::size_t reserve);
  void begin_capture(Stream stream, GraphPool pool, std::size_t more);
  void end_capture(Stream stream);
  void release_graph(GraphPool pool);
  std::vector<GraphPoolInfo> graph_pools() const;

  // Hooks (hooks.cpp).
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

  /// For Allocator::config() and device().
  const detail::AllocatorState& state() const noexcept { return *this; }

 private:
  using Block = detail::Block;
  using Segment = detail::Segment;
  using StreamState = detail::StreamState;
  using Lock = std::unique_lock<detail::Shards>;

  // --- fast path (allocator.cpp) ---
  Block* allocate_cached(StreamState& ss, std::size_t size, std::size_t bytes);
  Block* take_from_seam(StreamState& ss, Pool pool, std::size_t size, std::size_t bytes);
  bool free_cached(detail::Shard& shard, Address addr);
  void release_cached(detail::Shard& shard, Block* b);
  bool mark_free(Block* b);
  static bool keeps_apart(const Block* b, const Block* twin) noexcept;
  bool epoch_ends_in_heap(detail::EpochLog& log, const Block* b) const;
  void* allocate_exclusive(std::size_t bytes, Stream stream);
  /// In the exclusive mode: an allocation for `key` / the free of allocated block b (out of line,
  /// for graph_capture.cpp; allocator.cpp inlines allocate_in and free_block into its own paths).
  void* allocate_locked(std::size_t bytes, detail::StreamKey key, Lock& lock);
  void* allocate_in(std::size_t bytes, detail::StreamKey key, Lock& lock);
  void deallocate_exclusive(Address addr);
  void deallocate_locked(Block* b);
  void free_block(Block* b);
  StreamState* cached_stream(Stream stream) const noexcept;  // with the thread's tag
  StreamState* cached_stream(detail::StreamKey key) const noexcept;
  StreamState* last_stream() const noexcept;
  void remember_stream(StreamState& ss) const noexcept;
  Block* find_cached(StreamState& ss, Pool pool, std::size_t size) const noexcept;
  /// Where the free block a request is served from came from: the free index, or a growth (or
  /// the OOM ladder's other sources), whose pages were mapped for the request at their start.
  enum class FreeFrom { index, growth };
  Block* take(Block* b, std::size_t handed, std::size_t requested, FreeFrom from);
  bool replaces_kept_neighbour(const Block* b, std::size_t handed) const noexcept;
  std::size_t least_kept_output() const noexcept;
  std::size_t handed_size(const Block* b, std::size_t size) const noexcept;
  void hand_out(Block* b, std::size_t requested);
  void release_block(Block* b);
  /// A boundary that ss's StepFinder found (vmm_find_steps): the step() the program did not call.
  void step_found(StreamState& ss);

  // --- the OOM ladder (oom_ladder.cpp) ---
  Block* allocate_slow(StreamState& ss, Pool pool, std::size_t size, std::size_t bytes, Lock& lock);
  Block* find_or_grow(StreamState& ss, Pool pool, std::size_t size);
  Block* steal_from_other_stream(StreamState& ss, Pool pool, std::size_t size);
  Block* waited_for_instead_of_sync(StreamState& ss, Pool pool, std::size_t size);
  bool run_free_memory_callbacks(std::size_t size, Lock& lock);
  [[noreturn]] void throw_oom(Stream stream, std::size_t bytes, std::size_t size, Lock& lock);
  bool out_of_reach(Stream stream, std::size_t size) const;
  std::size_t allocated_with_pages() const;
  std::size_t largest_free_block() const noexcept;
  std::vector<StreamCachedBytes> cached_per_stream() const;

  // --- CUDA graphs (graph_capture.cpp) ---
  void* allocate_captured(detail::GraphPoolRec& pool, std::size_t bytes, Stream stream);
  [[noreturn]] void throw_graph_pool_exhausted(const detail::GraphPoolRec& pool, std::size_t bytes,
                                               std::size_t size, Stream stream);
  /// Frees addr if it is a block of a graph pool (true); UsageError if it lies in a pool's range
  /// without being one of its live blocks; false if no pool has it.
  bool free_captured(Address addr);
  /// Whether addr lies in a graph pool's range (then record_stream and is_asleep treat it).
  bool in_graph_pool(Address addr) const noexcept { return !graphs.empty() && graphs.owner_of(addr) != nullptr; }
  void reserve_range(detail::GraphPoolRec& pool, Stream stream, std::size_t bytes, Lock& lock);
  void give_back_if_done(detail::GraphPoolRec& pool);
  /// UsageError naming a capture underway: `operation` would call the device or synchronize.
  void refuse_while_capturing(const char* operation) const;
  /// Once no capture is underway: events for the frees that waited without one meanwhile.
  void record_deferred_events();

  // --- stream events (stream_events.cpp) ---
  void add_use(Block* b, Stream stream);
  void defer_free(Block* b);
  DeviceEvent record_free_event(Stream s);
  void forget_asleep(Block* b);
  /// b's free has completed (no stream event outstanding): no longer active; observers hear so.
  TP_ALWAYS_INLINE void count_free_completed(const Block* b) {
    const detail::Segment* seg = b->segment;
    shard_of(seg).counters.on_inactive(seg->pool, static_cast<std::int64_t>(b->size));
    if (TP_UNLIKELY(hooks.observed()))
      hooks.notify(EventType::free_completed, b->addr, b->requested, b->size, seg->owner->stream);
  }
  void process_events();
  void synchronize_pending();
  void pending_done(const detail::PendingFree& done);  // its event has completed
  Block* reuse_pending(StreamState& ss, Pool pool, std::size_t size);
  DeviceEvent acquire_event();
  void release_event(DeviceEvent e) { event_pool_.push_back(e); }

  // --- inspection (inspect.cpp) ---
  void check_invariants_locked() const;
  void check_graph_pools() const;
  void debug_check() const {
    if constexpr (TENSORPOOL_DEBUG_INVARIANTS) check_invariants_locked();
  }
  /// After a fast path, without a lock held.
  void debug_check_unlocked() const {
    if constexpr (TENSORPOOL_DEBUG_INVARIANTS) check_invariants();
  }
  [[noreturn]] void throw_bad_pointer(Address addr, const char* operation) const;

  static std::uint64_t new_id() noexcept;
  const std::uint64_t id_ = new_id();                       // unique over the process: keys the thread-local stream cache
  std::unique_ptr<detail::SegmentSource> source_;  // never null after construction
  std::size_t pending_total_ = 0;                // == sum of every stream's pending.size()
  std::vector<DeviceEvent> event_pool_;          // created events not in use
  /// vmm_find_steps: the stream whose found steps are the allocator's (the first to find one;
  /// the others stop looking), or null.
  StreamState* stepping_ = nullptr;
};

}  // namespace tensorpool

// tensorpool/allocator.hpp: the caching allocator of one device.
//
// Blocks are carved from segments obtained through a DeviceBackend, cached when freed, split and
// coalesced within their segment, and reused in stream order. See docs/architecture.md.
//
//   auto device = std::make_shared<tensorpool::SimulatedDevice>();
//   tensorpool::Allocator alloc(device);
//   void* p = alloc.allocate(64 << 20, stream);
//   alloc.record_stream(p, other_stream);  // p is also used on other_stream
//   alloc.deallocate(p);                   // reusable once other_stream's work completes
//
// Thread safety: every member function may be called from any thread. Threads on different
// streams run cached allocations and frees side by side (each stream's shard has its own lock;
// up to eight streams never share one); threads on one stream, and everything that is not a
// cached allocation or free (growth, stream events, observers, stats, empty_cache ...), are
// serialized. Statistics and their peaks stay exact. See docs/architecture.md, "Threads".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "tensorpool/config.hpp"
#include "tensorpool/device.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/hooks.hpp"
#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

/// A scope in which the calling thread's allocations carry the tag `name` (the innermost scope's),
/// from every Allocator. Tagged blocks come from memory of their own (their own heaps, or
/// segments), so that Allocator::sleep(name) can give back their memory alone: a KV cache, a
/// model that will sleep. Scopes end in the reverse order of their start, on their thread.
class Tag {
 public:
  explicit Tag(std::string_view name);
  ~Tag();
  Tag(const Tag&) = delete;
  Tag& operator=(const Tag&) = delete;

 private:
  std::uint16_t previous_;
};

class Allocator {
 public:
  /// Uses Config::from_env() (TENSORPOOL_CONF).
  explicit Allocator(std::shared_ptr<DeviceBackend> device);
  Allocator(std::shared_ptr<DeviceBackend> device, Config config);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  /// A block of at least `bytes` for use on `stream`. 0 bytes gives nullptr.
  /// Throws OutOfMemoryError when nothing can be freed to make room.
  void* allocate(std::size_t bytes, Stream stream = kDefaultStream);
  /// Returns a block; nullptr is ignored. Throws UsageError (state untouched) for a double free or
  /// a pointer this allocator did not hand out.
  void deallocate(void* ptr);
  /// Marks `ptr` as used on `stream` too: when freed, it is reused only after that stream's work
  /// submitted before the free has completed.
  void record_stream(void* ptr, Stream stream);
  /// Waits for pending frees and returns every fully free segment to the device.
  void empty_cache();
  /// Marks the boundary between two steps of a program that repeats itself (a training step:
  /// call it after optimizer.step() and zero_grad()). mode:vmm: a heap that holds blocks over a
  /// whole step (weights, optimizer states) plans the allocations each step makes and frees
  /// around them, and serves the next step that makes the same ones at the planned places
  /// (docs/vmm.md, "Steps"); fixed segments: nothing. It never synchronizes; its device calls are
  /// an event per planned heap and, once a plan repeats, giving back the pages above it. The
  /// planning runs where vmm_planner says, but for a step whose kept outputs replaced the last
  /// step's (a loop's logits): that step and its mirror, which the next step follows, are
  /// planned in this call. Ignored while a graph capture is underway.
  void step();

  /// mode:vmm: gives the physical memory under every block back to the device while each live
  /// block keeps its address (asleep: its memory must not be used until wake()); the device is
  /// synchronized first. Allocations made meanwhile get other memory; a block freed while asleep
  /// is forgotten; a second sleep does nothing. Throws UsageError in fixed-segment mode.
  /// With Contents::keep, each live block's requested bytes are first copied to host memory
  /// (DeviceBackend::allocate_host: pinned on a GPU) and copied back by wake(); if the host
  /// memory is refused, nothing sleeps and DeviceError says how much was needed.
  SleepReport sleep(Contents contents = Contents::discard);
  /// The same for the blocks allocated under Tag `tag` alone (and the free memory of their
  /// heaps). UsageError when nothing was ever allocated under that tag.
  SleepReport sleep(std::string_view tag, Contents contents = Contents::discard);
  /// Maps new pages under every asleep block, at the same addresses, and copies back the kept
  /// contents.
  /// Throws UsageError when no sleep() (of every tag, or of this one) came since the last wake()
  /// (after one, never: even when it found nothing to put to sleep), and DeviceError, with
  /// nothing changed, when the device cannot give the pages.
  void wake();
  /// The same for the blocks of `tag` that sleep.
  void wake(std::string_view tag);
  /// What sleeps now (all zero while awake).
  SleepReport asleep() const;
  /// Whether `ptr`, a live block of this allocator, is asleep (UsageError if it is not one).
  bool is_asleep(const void* ptr) const;

  // --- CUDA graphs (docs/graphs.md) -----------------------------------------------------------
  /// Reserves `reserve` bytes for a new graph pool (device calls happen here: call it before
  /// cudaStreamBeginCapture) and serves every allocation on `stream` from that pool until
  /// end_capture(stream), with no device call and no synchronization; a request the pool cannot
  /// serve throws GraphPoolExhaustedError (how much to reserve). The pool's blocks are reused only
  /// by the pool's captures, freed blocks included, until release_graph(). While any capture is
  /// underway, empty_cache, sleep and wake throw UsageError, and frees that need stream events
  /// get them when the last capture ends. UsageError for a reserve of 0 or a stream already
  /// captured into a pool (nothing changes).
  GraphPool begin_capture(Stream stream, std::size_t reserve);
  /// Serves `stream` from an existing pool: another graph that shares it, or a stream forked
  /// into the same capture; `more` bytes are reserved for it first (0: no device call, so it may
  /// be called while `stream` is being captured already).
  void begin_capture(Stream stream, GraphPool pool, std::size_t more = 0);
  /// Stops serving `stream` from its graph pool (UsageError when it was not captured).
  void end_capture(Stream stream);
  /// The graph is gone (after cudaGraphExecDestroy): once its pool's last block is freed, its
  /// ranges return to the allocator's cache. UsageError if a stream is still captured into it.
  void release_graph(GraphPool pool);
  /// What each graph pool not yet given back holds, by id.
  std::vector<GraphPoolInfo> graph_pools() const;

  /// Changes the cap on reserved bytes (0: none). Cached memory above it is not released until
  /// the next empty_cache() or OOM retry.
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;

  Stats stats() const;
  /// Current reserved/allocated/requested/active bytes; O(1).
  MemoryUsage usage() const;
  void reset_peaks();
  FragmentationReport fragmentation() const;
  Snapshot snapshot() const;
  /// Throws InvariantError describing the first inconsistency found. O(blocks + segments).
  void check_invariants() const;

  HookId add_observer(std::shared_ptr<Observer> observer);
  HookId add_oom_observer(OomObserver observer);
  HookId add_free_memory_callback(FreeMemoryCallback callback);
  /// Removes a hook added by any of the three add_* calls; false if the id is unknown.
  bool remove_hook(HookId id);

  const Config& config() const noexcept;
  DeviceBackend& device() const noexcept;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorpool

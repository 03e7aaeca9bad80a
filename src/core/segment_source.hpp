// segment_source.hpp: where an allocator's segments come from. The one interface between the
// mode-independent allocator (fast path, OOM ladder, stream events, hooks, inspection) and its
// two sources of memory, chosen once by Config::mode when the allocator is made:
//
//   fixed segments (fixed_segments.cpp, mode:fixed): each segment is one device allocation
//     (allocate_segment), sized by the pool policy, returned whole when entirely free;
//   vmm heaps (vmm_heaps.cpp, mode:vmm): per stream and pool one heap, a reserved address range
//     into which physical chunks are mapped as requests need them (docs/vmm.md).
//
// A source is called with the allocator's mutex held, from slow paths only, but for
// take_planned(), which the fast path calls while a stream's heap follows a planned layout. It
// works on the shared AllocatorState (blocks, segments, indexes, counters, hooks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/allocator_state.hpp"
#include "core/epoch_log.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::detail {

/// Whether take_planned() may map pages where the plan puts a block and none are mapped (after
/// empty_cache() or a reclaim left holes below the plan's height): a device call, so only from the
/// exclusive path; the fast path asks without, and the exclusive path then asks again with.
enum class PlannedPages : std::uint8_t {
  mapped_only,  // nullptr without departing when the step's range needs pages
  map_holes,    // map the holes the step's range lies in (up to the plan's height), then serve it
};

/// What release() is for.
enum class ReleaseGoal : std::uint8_t {
  everything,   // the OOM ladder: give back every cached byte the device could use again
  empty_cache,  // Allocator::empty_cache(): the same, but keep what the settings say to keep
};

/// The per-pool quantities check_invariants recomputes from the blocks and the sources.
struct Recount {
  std::array<std::int64_t, kNumMetrics> pool[kNumPools] = {};
  void add(Pool p, Metric m, std::int64_t v) { pool[static_cast<int>(p)][static_cast<int>(m)] += v; }
};

/// Throws InvariantError("tensorpool invariant violated: " + what).
[[noreturn]] void invariant_failed(const std::string& what);

inline constexpr const char* kSleepNeedsVmm =
    "tensorpool: sleep() and wake() need mode:vmm (fixed segments cannot give back the memory under "
    "live blocks and keep their addresses)";

/// Which blocks a sleep or a wake is for: all, or those allocated under one tag.
struct Sleepers {
  bool all = true;
  TagId tag = 0;
  bool cover(TagId t) const noexcept { return all || t == tag; }
};

/// How soon memory a source gives back (SegmentSource::release()) is free on the device.
enum class Release : std::uint8_t {
  at_once,  // when the call returns (vmm: cuMemRelease of a chunk no range maps)
  later,    // perhaps only once a stream reaches the free (fixed segments on a stream-ordered pool)
};

/// Who says where a step ends (SegmentSource::step_boundary()).
enum class StepBoundary : std::uint8_t {
  called,  // the program: Allocator::step()
  found,   // the step finder, from the requests (vmm_find_steps)
};

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;

  /// Makes room for a request of `size` bytes (rounded) in `pool` for stream ss: returns a
  /// free block of at least `size` bytes, in ss's free index; nullptr when the device or the
  /// memory limit says no. A DeviceError propagates with the state consistent.
  virtual Block* grow(StreamState& ss, Pool pool, std::size_t size) = 0;
  /// Whether grow(ss, pool, size) would synchronize a stream by choice, to move idle memory
  /// rather than create more (vmm: a growth that remaps idle pages): the allocator first tries a
  /// block whose free waits for another stream, after a wait on the device instead
  /// (oom_ladder.cpp). Asks the device nothing.
  virtual bool growth_synchronizes(const StreamState& ss, Pool pool, std::size_t size) const {
    (void)ss, (void)pool, (void)size;
    return false;
  }
  /// Gives cached memory (entirely free segments or chunks) back to the device; returns the
  /// bytes given back. Pending frees have been synchronized by the caller.
  virtual std::size_t release(ReleaseGoal goal) = 0;
  /// How soon what release() gives back is free on the device (for the ladder's early refusal,
  /// oom_ladder.cpp).
  virtual Release releases() const noexcept { return Release::later; }
  /// The unit memory is mapped and moved in (vmm: a page); 0: whole segments.
  virtual std::size_t page_size() const noexcept { return 0; }
  /// Teardown, once, while the device is alive: gives everything back to the device, live
  /// blocks included. The caller then recycles the Blocks and forgets the segments.
  virtual void destroy() = 0;
  /// check_invariants, the source's part: its own structures, the mapping state of its
  /// segments' blocks, and its recount of reserved bytes and segments per pool (into rc).
  virtual void check(Recount& rc) const = 0;
  // Epochs of a heap segment (vmm; fixed segments have none): the allocator records what it
  // hands out of a heap and frees in the heap's EpochLog (Segment::epoch, inline), and calls
  // these when a heap is left empty or follows a planned layout (vmm_heaps.cpp).
  /// b, free and coalesced (in no index), is in a heap with nothing allocated: returns b for the
  /// free index, or nullptr when the source keeps it (held).
  virtual Block* end_epoch(Block* b) { return b; }
  /// How freeing b, the last block allocated in its heap, ends the epoch: anything but
  /// `elsewhere` makes no device call and touches nothing outside the heap (then the fast path
  /// may free it under its shard's lock; shards.hpp). The fast path leaves such an answer in the
  /// heap's EpochLog::end_known for end_epoch(), which so does not ask again.
  virtual EpochEnd epoch_end_of(const Block* b) const noexcept {
    (void)b;
    return EpochEnd::elsewhere;
  }
  /// Called before the free index while ss.follows_plan(pool): the block of exactly `size` bytes
  /// the heap's plan puts next (free, mapped, in no index), or nullptr when the request departs
  /// from the plan (which is then dropped until the heap's next epoch) or, with
  /// PlannedPages::mapped_only, when its range needs pages mapped (the plan is kept).
  virtual Block* take_planned(StreamState& ss, Pool pool, std::size_t size, PlannedPages pages) {
    (void)ss, (void)pool, (void)size, (void)pages;
    return nullptr;
  }
  /// Allocator::step(), or a boundary the step finder found: a training step ends here (vmm: the
  /// heaps that do not empty end their epoch at the boundary, vmm_steps.cpp; fixed segments:
  /// nothing).
  virtual void step_boundary(StepBoundary boundary) { (void)boundary; }
  /// Calls f(block) for every held block (free, mapped, in no index).
  virtual void for_each_held(const std::function<void(const Block*)>& f) const { (void)f; }
  // Sleep and wake (vmm; fixed segments refuse): the caller holds every shard and has
  // synchronized the device and completed the pending frees.
  /// Releases the physical memory of the heaps of the streams `who` covers, live blocks'
  /// included; the blocks keep their addresses (asleep). Heaps asleep already are left alone.
  virtual bool supports_sleep() const noexcept { return false; }
  virtual SleepReport sleep(Sleepers who, Contents contents) {
    (void)who, (void)contents;
    throw UsageError(kSleepNeedsVmm);
  }
  /// Maps pages back under every asleep block of those heaps, or changes nothing and throws
  /// (UsageError when none of them sleeps).
  virtual void wake(Sleepers who) {
    (void)who;
    throw UsageError(kSleepNeedsVmm);
  }
  /// b, allocated and asleep, is freed: forgotten (its range stays without pages until wake()).
  virtual void forget_asleep(Block* b) { (void)b; }
  /// What sleeps now.
  virtual SleepReport asleep() const { return {}; }
};

/// The source Config::mode asks for (the only place that looks at the mode). May narrow the
/// settings in `state` (vmm: no oversize segments); throws ConfigError when the device cannot
/// serve the mode.
std::unique_ptr<SegmentSource> make_segment_source(AllocatorState& state);

std::unique_ptr<SegmentSource> make_fixed_segments(AllocatorState& state);
std::unique_ptr<SegmentSource> make_vmm_heaps(AllocatorState& state);

}  // namespace tensorpool::detail

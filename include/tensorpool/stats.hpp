// tensorpool/stats.hpp: statistics, the fragmentation view and snapshots.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensorpool/types.hpp"

namespace tensorpool {

/// One tracked quantity: its value now, its peak since the last reset_peaks(), and the cumulative
/// amounts added and removed since the allocator was created.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // cumulative increase
  std::int64_t freed = 0;      // cumulative decrease
};

/// Every quantity tracked per pool and in total.
enum class Metric : std::uint8_t {
  allocated_bytes,       // blocks handed to the user (rounded sizes)
  requested_bytes,       // the sizes the user asked for, of those blocks
  active_bytes,          // allocated + freed blocks still waiting for stream events
  reserved_bytes,        // segments held from the device
  allocations,           // count of allocated blocks
  active_blocks,
  segments,
};
inline constexpr int kNumMetrics = 7;
const char* to_string(Metric metric) noexcept;

struct PoolStats {
  std::array<Stat, kNumMetrics> metrics{};
  Stat& operator[](Metric m) noexcept { return metrics[static_cast<int>(m)]; }
  const Stat& operator[](Metric m) const noexcept { return metrics[static_cast<int>(m)]; }
};

struct Stats {
  std::array<PoolStats, kNumPools> pool{};  // indexed by Pool
  PoolStats total;

  std::uint64_t alloc_calls = 0;
  std::uint64_t free_calls = 0;
  std::uint64_t upstream_allocs = 0;          // segments obtained from the device
  std::uint64_t upstream_alloc_failures = 0;  // device answered out of memory
  std::uint64_t upstream_frees = 0;           // segments returned to the device
  std::uint64_t syncs = 0;                    // host synchronizations the allocator made
  std::uint64_t stream_waits = 0;             // waits on the device: cross-stream reuse, pending frees
  std::uint64_t events_recorded = 0;
  std::uint64_t vm_maps = 0;                  // virtual-memory mode: chunks mapped
  std::uint64_t vm_unmaps = 0;                // virtual-memory mode: chunks unmapped
  std::uint64_t retries = 0;                  // allocations that had to free cached memory
  std::uint64_t ooms = 0;                     // OutOfMemoryError thrown
  std::uint64_t steps_found = 0;              // vmm_find_steps: step boundaries found from the requests
  std::uint64_t planned_epochs = 0;           // vmm: epochs of a heap that followed a planned layout to their end
  std::uint64_t mirrored_steps = 0;           // vmm: steps also planned as their mirror (kept outputs in turn)
  std::uint64_t predicted_steps = 0;          // vmm: steps also planned as their prediction (kept outputs in a row)
  std::uint64_t plans_on_caller = 0;          // vmm: plans made on the program's thread, not the planner's
  std::uint64_t stitches = 0;                 // vmm_stitch: growths served from free pages mapped again
  std::uint64_t asleep_bytes = 0;             // sleep(): physical bytes wake() maps back
  std::uint64_t asleep_allocated = 0;         // sleep(): bytes of live blocks without pages
  std::uint64_t graph_pools = 0;              // CUDA graph pools not yet given back
  std::uint64_t graph_reserved_bytes = 0;     // their ranges (counted as allocated above)
  std::uint64_t graph_allocated_bytes = 0;    // their live blocks' bytes (rounded)

  const PoolStats& of(Pool p) const noexcept { return pool[static_cast<int>(p)]; }
};

/// What Allocator::sleep() does with the bytes of the live blocks it puts to sleep.
enum class Contents : std::uint8_t {
  discard,  // woken blocks hold what their new pages hold
  keep,     // copied to host memory (pinned on a GPU) first, and back at wake()
};

/// What Allocator::sleep() released, or what sleeps now (Allocator::asleep()).
struct SleepReport {
  std::size_t released_bytes = 0;    // physical memory given back to the device (sleep(): the
                                     // sleeping pages and the free memory released on the way)
  std::size_t asleep_bytes = 0;      // physical memory wake() maps back
  std::size_t asleep_blocks = 0;     // live blocks without pages until wake()
  std::size_t asleep_allocated = 0;  // their bytes (still counted as allocated)
  std::size_t kept_bytes = 0;        // their requested bytes held in host memory until wake()
                                     // (0 on a device that holds no contents)
};

/// A CUDA graph's private pool (Allocator::begin_capture); ids are never reused by one allocator.
struct GraphPool {
  std::uint64_t id = 0;
  friend bool operator==(GraphPool, GraphPool) = default;
};

/// What a graph pool holds (Allocator::graph_pools(), Snapshot::graph_pools).
struct GraphPoolInfo {
  std::uint64_t id = 0;
  std::vector<Stream> capturing;   // the streams it serves now (between begin_ and end_capture)
  std::size_t reserved = 0;        // its ranges: device memory kept for the graph
  std::size_t allocated = 0;       // its live blocks (rounded)
  std::size_t peak_allocated = 0;  // the most they ever held
  std::size_t blocks = 0;          // live blocks
  std::size_t largest_free = 0;    // the largest request it can serve now
  std::vector<std::pair<Address, std::size_t>> ranges;  // (start, bytes), by address
  bool released = false;           // release_graph() was called: given back once empty
};

/// The current totals, cheap to read (no copy of every statistic).
struct MemoryUsage {
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::size_t requested = 0;
  std::size_t active = 0;
};

/// The fragmentation view, computed on demand from the current state.
struct FragmentationReport {
  std::size_t reserved = 0;
  std::size_t allocated = 0;             // rounded
  std::size_t requested = 0;
  std::size_t pending_free = 0;          // freed, waiting for events
  std::size_t internal_waste = 0;        // allocated - requested (rounding)
  std::size_t reserved_unallocated = 0;  // reserved - allocated
  std::size_t total_free = 0;            // bytes in free blocks
  std::size_t largest_free = 0;
  std::size_t free_blocks = 0;
  std::size_t inactive_split = 0;        // free bytes in segments that also hold used blocks
  std::size_t inactive_split_blocks = 0;
  double utilization = 1.0;              // allocated / reserved (1 when nothing is reserved)
  double external_fragmentation = 0.0;   // 1 - largest_free / total_free (0 when nothing free)
};

enum class BlockState : std::uint8_t { free, allocated, pending_free };
const char* to_string(BlockState state) noexcept;

struct BlockInfo {
  Address address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // 0 unless allocated or pending_free
  BlockState state = BlockState::free;
  bool mapped = true;         // false: free address space with no physical pages (vmm mode)
  bool asleep = false;        // its pages were given back by Allocator::sleep() (vmm mode); an
                              // allocated one must not be used until wake()
  std::uint64_t graph_pool = 0;  // an allocated range of that graph pool (its blocks are inside)
};

struct SegmentInfo {
  Address address = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  Pool pool = Pool::large;
  bool oversize = false;
  bool heap = false;              // vmm mode: a reserved address range, partly mapped
  std::vector<BlockInfo> blocks;  // in address order, tiling the segment
};

struct Snapshot {
  std::vector<SegmentInfo> segments;  // in address order
  std::vector<GraphPoolInfo> graph_pools;  // by id
};

}  // namespace tensorpool

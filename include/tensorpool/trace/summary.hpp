// tensorpool/trace/summary.hpp: what a trace holds, at a glance (what `tensorpool info` shows):
// events per operation, devices, allocating streams, size and lifetime histograms, allocations
// never freed, the peak of requested bytes and the allocation sites holding the most bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorpool/trace/event.hpp"

namespace tensorpool::trace {

/// Counts and bytes per bucket: bucket i holds values <= bounds[i] (and above bounds[i-1]); the
/// last bucket, past every bound, is open.
struct Histogram {
  std::vector<std::uint64_t> bounds;
  std::vector<std::uint64_t> counts;  // bounds.size() + 1 buckets
  std::vector<std::uint64_t> bytes;

  explicit Histogram(std::vector<std::uint64_t> upper_bounds);
  void add(std::uint64_t value, std::uint64_t weight);
};

struct LabelBytes {
  std::string label;
  std::uint64_t bytes = 0;
};

struct TraceSummary {
  std::uint64_t events = 0;
  std::array<std::uint64_t, kNumOps> ops{};  // events per Op
  std::vector<std::uint16_t> devices;        // every device an event names, ascending
  std::uint64_t streams = 0;                 // distinct (device, stream) pairs that allocate
  /// Allocations (alloc and seed_alloc) by requested size: 512 B, 4 KiB, 64 KiB, 1 MiB, 10 MiB,
  /// 100 MiB, 1 GiB, more.
  Histogram sizes{{}};
  /// Freed allocations by lifetime in events (alloc to free_requested): 1, 10, ..., 100000, more;
  /// weighted by their bytes.
  Histogram lifetimes{{}};
  std::uint64_t never_freed = 0;  // allocations without a free_requested in the window
  /// The sum over devices of each device's peak of live requested bytes (a block lives from its
  /// alloc or seed_alloc to its free_requested or free_completed; an allocation at a live
  /// address replaces the old block), as the replay engine measures it.
  std::uint64_t peak_requested = 0;
  /// Allocation sites (labels) by allocated bytes, most first (ties: the later label first).
  std::vector<LabelBytes> top_labels;
};

/// Summarizes `trace`; top_labels keeps at most `top` sites.
TraceSummary summarize(const Trace& trace, std::size_t top = 8);

}  // namespace tensorpool::trace

// What the registry, the C API and the PyTorch library report about an allocator: PyTorch's
// memory_stats layout as JSON, the figures only a walk of the snapshot gives, and the OOM
// explanation with the free cached bytes of each stream.
#include <fmt/format.h>

#include <map>
#include <string>

#include "capi/device_allocator.hpp"
#include "capi/stats_figures.hpp"

namespace tensorpool::capi {

SnapshotFigures snapshot_figures(const Snapshot& snapshot) {
  SnapshotFigures f;
  for (const SegmentInfo& s : snapshot.segments) {
    bool used = false;
    std::int64_t free_bytes = 0, free_blocks = 0, live = 0;
    for (const BlockInfo& b : s.blocks) {
      if (b.state != BlockState::free) {
        used = true;
        if (b.state == BlockState::allocated) ++live;
        continue;
      }
      if (!b.mapped) continue;
      free_bytes += static_cast<std::int64_t>(b.size);
      ++free_blocks;
      f.cached_by_stream[s.stream].bytes += b.size;
      ++f.cached_by_stream[s.stream].blocks;
    }
    if (used) {
      for (auto* split : {&f.inactive_split[static_cast<int>(s.pool)], &f.inactive_split_all}) {
        split->bytes += static_cast<std::size_t>(free_bytes);
        split->blocks += static_cast<std::size_t>(free_blocks);
      }
    }
    if (s.oversize) {
      ++f.oversize_segments;
      f.oversize_allocations += live;
    }
  }
  return f;
}

std::string describe_oom(const Allocator& allocator, const OutOfMemoryError& error) {
  std::string out = error.what();
  const SnapshotFigures f = snapshot_figures(allocator.snapshot());
  out += " Free cached memory by stream:";
  if (f.cached_by_stream.empty()) out += " none";
  bool first = true;
  for (const auto& [stream, cached] : f.cached_by_stream) {
    out += fmt::format("{} stream {:#x}: {} in {} blocks", first ? "" : ";", stream,
                       format_bytes(cached.bytes), cached.blocks);
    first = false;
  }
  return out + ".";
}

namespace {

void stat_json(std::string& out, const Stat& s) {
  out += fmt::format(R"({{"current": {}, "peak": {}, "allocated": {}, "freed": {}}})", s.current,
                     s.peak, s.allocated, s.freed);
}

// A statistic PyTorch keeps per pool that tensorpool only knows the current value of.
Stat current_only(std::size_t v) { return Stat{static_cast<std::int64_t>(v), 0, 0, 0}; }

template <class PerPool>
void pools_json(std::string& out, const char* key, PerPool&& of) {
  out += fmt::format(R"("{}": {{"all": )", key);
  stat_json(out, of(-1));
  out += R"(, "small_pool": )";
  stat_json(out, of(static_cast<int>(Pool::small)));
  out += R"(, "large_pool": )";
  stat_json(out, of(static_cast<int>(Pool::large)));
  out += "}, ";
}

}  // namespace

std::string stats_json(const Allocator& allocator) {
  const Stats stats = allocator.stats();
  const SnapshotFigures f = snapshot_figures(allocator.snapshot());
  std::string out = "{";
  auto metric = [&](const char* key, Metric m) {
    pools_json(out, key, [&](int pool) { return pool < 0 ? stats.total[m] : stats.pool[pool][m]; });
  };
  metric("allocation", Metric::allocations);
  metric("segment", Metric::segments);
  metric("active", Metric::active_blocks);
  metric("allocated_bytes", Metric::allocated_bytes);
  metric("reserved_bytes", Metric::reserved_bytes);
  metric("active_bytes", Metric::active_bytes);
  metric("requested_bytes", Metric::requested_bytes);
  pools_json(out, "inactive_split", [&](int pool) {
    return current_only(pool < 0 ? f.inactive_split_all.blocks : f.inactive_split[pool].blocks);
  });
  pools_json(out, "inactive_split_bytes", [&](int pool) {
    return current_only(pool < 0 ? f.inactive_split_all.bytes : f.inactive_split[pool].bytes);
  });
  out += R"("oversize_allocations": )";
  stat_json(out, current_only(static_cast<std::size_t>(f.oversize_allocations)));
  out += R"(, "oversize_segments": )";
  stat_json(out, current_only(static_cast<std::size_t>(f.oversize_segments)));
  const std::size_t max_split = allocator.config().max_split_size;
  out += fmt::format(
      R"(, "num_alloc_retries": {}, "num_ooms": {}, "max_split_size": {}, "num_sync_all_streams": {}, )"
      R"("num_device_alloc": {}, "num_device_free": {}, "num_steps_found": {}, "num_planned_epochs": {}, )"
      R"("num_mirrored_steps": {}, "num_predicted_steps": {}, "num_plans_on_caller": {}, "num_stitches": {}}})",
      stats.retries, stats.ooms, max_split == 0 ? -1 : static_cast<std::int64_t>(max_split),
      stats.syncs, stats.upstream_allocs + stats.vm_maps, stats.upstream_frees + stats.vm_unmaps, stats.steps_found,
      stats.planned_epochs, stats.mirrored_steps, stats.predicted_steps, stats.plans_on_caller, stats.stitches);
  return out;
}

}  // namespace tensorpool::capi

// counters.hpp: the allocator's statistics and counters, kept up to date as it works (what
// Allocator::stats() returns). Inline: the hot path updates them several times per operation.
//
// Invariants (checked by Allocator::check_invariants):
//  - per pool, every current value equals a recount from the blocks (allocated, requested,
//    active) and from the segment source (reserved bytes, segments);
//  - stats.total[m] is the sum of the two pools' values; no peak is below its current value;
//    no current value is above its cumulative increase (the merged `freed` is not negative).
// Stat::freed stays 0 here: merged statistics derive it (Shards::merged()).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/util.hpp"
#include "tensorpool/stats.hpp"

namespace tensorpool::detail {

TP_ALWAYS_INLINE void stat_up(Stat& s, std::int64_t d) noexcept {
  s.current += d;
  s.allocated += d;
  if (TP_UNLIKELY(s.current > s.peak)) s.peak = s.current;  // a new peak is rare: a branch, no store
}
// Stat::freed is not kept here: it is allocated - current, which Shards::merged() writes into
// every statistic it hands out (one add fewer per statistic in the hot path's frees).
TP_ALWAYS_INLINE void stat_down(Stat& s, std::int64_t d) noexcept { s.current -= d; }

class Counters {
 public:
  /// The statistics (pool, total) and the call counters (alloc_calls ... ooms) in one.
  const Stats& stats() const noexcept { return stats_; }
  /// Counts one more of a call counter: count(&Stats::syncs).
  TP_ALWAYS_INLINE void count(std::uint64_t Stats::*counter) noexcept { ++(stats_.*counter); }

  std::size_t reserved() const noexcept { return current(stats_.total, Metric::reserved_bytes); }
  std::size_t reserved(Pool p) const noexcept { return current(pool(p), Metric::reserved_bytes); }

  /// A block of `size` bytes (the user asked for `requested`) was handed out.
  TP_ALWAYS_INLINE void on_alloc(Pool p, std::int64_t size, std::int64_t requested) noexcept {
    alloc_in(pool(p), size, requested);
    alloc_in(stats_.total, size, requested);
  }
  /// The user freed it (it stays active until its stream events are done).
  TP_ALWAYS_INLINE void on_free(Pool p, std::int64_t size, std::int64_t requested) noexcept {
    free_in(pool(p), size, requested);
    free_in(stats_.total, size, requested);
  }
  /// It is no longer active (freed and its stream events done).
  TP_ALWAYS_INLINE void on_inactive(Pool p, std::int64_t size) noexcept {
    inactive_in(pool(p), size);
    inactive_in(stats_.total, size);
  }
  /// A segment (fixed) or a chunk (vmm) of `bytes` was obtained from the device.
  void on_upstream_alloc(Pool p, std::size_t bytes) noexcept {
    ++stats_.upstream_allocs;
    add(Metric::reserved_bytes, p, static_cast<std::int64_t>(bytes));
    add(Metric::segments, p, 1);
  }
  /// ... and given back.
  void on_upstream_free(Pool p, std::size_t bytes) noexcept {
    ++stats_.upstream_frees;
    add(Metric::reserved_bytes, p, -static_cast<std::int64_t>(bytes));
    add(Metric::segments, p, -1);
  }

  void reset_peaks() noexcept {
    auto reset = [](PoolStats& ps) {
      for (auto& stat : ps.metrics) stat.peak = stat.current;
    };
    for (auto& ps : stats_.pool) reset(ps);
    reset(stats_.total);
  }

 private:
  // One PoolStats' part of on_alloc(), on_free() and on_inactive() (each called for the pool and
  // the total, written out: a loop over the two was not unrolled).
  static TP_ALWAYS_INLINE void alloc_in(PoolStats& s, std::int64_t size, std::int64_t requested) noexcept {
    stat_up(s[Metric::allocated_bytes], size);
    stat_up(s[Metric::requested_bytes], requested);
    stat_up(s[Metric::allocations], 1);
    stat_up(s[Metric::active_bytes], size);
    stat_up(s[Metric::active_blocks], 1);
  }
  static TP_ALWAYS_INLINE void free_in(PoolStats& s, std::int64_t size, std::int64_t requested) noexcept {
    stat_down(s[Metric::allocated_bytes], size);
    stat_down(s[Metric::requested_bytes], requested);
    stat_down(s[Metric::allocations], 1);
  }
  static TP_ALWAYS_INLINE void inactive_in(PoolStats& s, std::int64_t size) noexcept {
    stat_down(s[Metric::active_bytes], size);
    stat_down(s[Metric::active_blocks], 1);
  }
  PoolStats& pool(Pool p) noexcept { return stats_.pool[static_cast<int>(p)]; }
  const PoolStats& pool(Pool p) const noexcept { return stats_.pool[static_cast<int>(p)]; }
  static std::size_t current(const PoolStats& ps, Metric m) noexcept {
    return static_cast<std::size_t>(ps[m].current);
  }
  void add(Metric m, Pool p, std::int64_t delta) noexcept {
    for (PoolStats* s : {&pool(p), &stats_.total}) {
      if (delta >= 0) {
        stat_up((*s)[m], delta);
      } else {
        stat_down((*s)[m], -delta);
      }
    }
  }

  Stats stats_;
};

}  // namespace tensorpool::detail

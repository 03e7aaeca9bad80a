// shards.cpp: the exclusive mode's bookkeeping of shards.hpp: merged statistics, exact peaks
// and the ceilings that keep them exact.
#include "core/shards.hpp"

#include <algorithm>
#include <string>

#include "core/segment_source.hpp"

namespace tensorpool::detail {

namespace {

PoolStats& row_of(Stats& s, int row) noexcept { return row == kTotalRow ? s.total : s.pool[row]; }
const PoolStats& row_of(const Stats& s, int row) noexcept { return row == kTotalRow ? s.total : s.pool[row]; }

void add_row(PoolStats& to, const PoolStats& from) noexcept {
  for (int m = 0; m < kNumMetrics; ++m) {
    to.metrics[m].current += from.metrics[m].current;
    to.metrics[m].allocated += from.metrics[m].allocated;
  }
}

void add_calls(Stats& to, const Stats& from) noexcept {
  to.alloc_calls += from.alloc_calls;
  to.free_calls += from.free_calls;
  to.upstream_allocs += from.upstream_allocs;
  to.upstream_alloc_failures += from.upstream_alloc_failures;
  to.upstream_frees += from.upstream_frees;
  to.syncs += from.syncs;
  to.stream_waits += from.stream_waits;
  to.events_recorded += from.events_recorded;
  to.vm_maps += from.vm_maps;
  to.vm_unmaps += from.vm_unmaps;
  to.retries += from.retries;
  to.ooms += from.ooms;
  to.steps_found += from.steps_found;
  to.planned_epochs += from.planned_epochs;
  to.mirrored_steps += from.mirrored_steps;
  to.predicted_steps += from.predicted_steps;
  to.plans_on_caller += from.plans_on_caller;
  to.stitches += from.stitches;
}

}  // namespace

Shard& Shards::next_for_stream() noexcept {
  const std::size_t i = streams_ % kNumShards;
  const bool joins = streams_ > 0 && streams_ < kNumShards;  // a shard's first stream (not shard 0's)
  if (joins) {
    if (alone()) {
      // Shard 0's own peaks were the peaks; from now on the recorded ones, with ceilings.
      for (int row = 0; row < kNumRows; ++row)
        for (const Metric m : kShardMetrics)
          peak_[row][static_cast<int>(m)] = row_of(shards_[0].counters.stats(), row)[m].peak;
      shards_[0].ceiling = peak_;
      shards_[0].bounded = true;
    }
    shards_[i].bounded = true;  // its ceilings are still 0: it gets room from settle()
    shards_[i].lock.lock();  // the exclusive mode holds every shard in use
    ++locked_;
  }
  ++streams_;
  return shards_[i];
}

TP_ALWAYS_INLINE std::int64_t Shards::current(std::size_t shard, int row, Metric m) const noexcept {
  return row_of(shards_[shard].counters.stats(), row)[m].current;
}

Stats Shards::merged(const Stats& device_level) const noexcept {
  Stats s = device_level;
  for (std::size_t i = 0; i < in_use(); ++i) {
    const Shard& sh = shards_[i];
    for (int row = 0; row < kNumRows; ++row) add_row(row_of(s, row), row_of(sh.counters.stats(), row));
    add_calls(s, sh.counters.stats());
  }
  for (int row = 0; row < kNumRows; ++row)
    for (const Metric m : kShardMetrics)
      row_of(s, row)[m].peak =
          alone() ? row_of(shards_[0].counters.stats(), row)[m].peak : peak_[row][static_cast<int>(m)];
  // What went is what came less what is there: the counters keep no `freed` (counters.hpp).
  for (int row = 0; row < kNumRows; ++row)
    for (Stat& stat : row_of(s, row).metrics) stat.freed = stat.allocated - stat.current;
  return s;
}

// Per statistic: the peak rises to the sum of the shards' current values; the favoured shard
// gets the room below the peak that the others' ceilings leave, or, if that is less than it
// holds or another shard is above its ceiling (the exclusive mode handed it a block), every
// other ceiling comes down to its current value first.
void Shards::settle() noexcept {
  if (alone()) return;  // shard 0's counters keep the peaks; no ceiling applies
  const std::size_t n = in_use();
  const auto favoured = favoured_ == nullptr ? kNumShards : static_cast<std::size_t>(favoured_ - shards_.data());
  for (int row = 0; row < kNumRows; ++row) {
    for (const Metric metric : kShardMetrics) {
      const int m = static_cast<int>(metric);
      std::int64_t total = 0;
      for (std::size_t i = 0; i < n; ++i) total += current(i, row, metric);
      std::int64_t& peak = peak_[row][m];
      peak = std::max(peak, total);
      std::int64_t others = 0;
      bool keep = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (i == favoured) continue;
        keep = keep && current(i, row, metric) <= shards_[i].ceiling[row][m];
        others += shards_[i].ceiling[row][m];
      }
      const std::int64_t mine = favoured < kNumShards ? current(favoured, row, metric) : 0;
      if (!keep || others + mine > peak) {
        others = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (i == favoured) continue;
          shards_[i].ceiling[row][m] = current(i, row, metric);
          others += shards_[i].ceiling[row][m];
        }
      }
      if (favoured < kNumShards) shards_[favoured].ceiling[row][m] = peak - others;
    }
  }
}

void Shards::reset_peaks() noexcept {
  for (std::size_t i = 0; i < in_use(); ++i) shards_[i].counters.reset_peaks();
  if (alone()) return;
  for (int row = 0; row < kNumRows; ++row) {
    for (const Metric metric : kShardMetrics) {
      const int m = static_cast<int>(metric);
      peak_[row][m] = 0;
      for (std::size_t i = 0; i < in_use(); ++i) {
        shards_[i].ceiling[row][m] = current(i, row, metric);
        peak_[row][m] += shards_[i].ceiling[row][m];
      }
    }
  }
}

void Shards::check() const {
  if (alone()) return;  // no ceilings: shard 0's counters check their own peaks
  for (int row = 0; row < kNumRows; ++row) {
    for (const Metric metric : kShardMetrics) {
      const int m = static_cast<int>(metric);
      std::int64_t total = 0;
      std::int64_t ceilings = 0;
      for (std::size_t i = 0; i < in_use(); ++i) {
        const std::int64_t c = current(i, row, metric);
        if (c > shards_[i].ceiling[row][m])
          invariant_failed(std::string("shard ") + std::to_string(i) + "'s " + to_string(metric) + " (" +
                           std::to_string(c) + ") is above its ceiling (" +
                           std::to_string(shards_[i].ceiling[row][m]) + ")");
        total += c;
        ceilings += shards_[i].ceiling[row][m];
      }
      if (ceilings > peak_[row][m] || total > peak_[row][m])
        invariant_failed(std::string("the shards' ") + to_string(metric) + " (current " + std::to_string(total) +
                         ", ceilings " + std::to_string(ceilings) + ") pass the peak " +
                         std::to_string(peak_[row][m]));
    }
  }
}

}  // namespace tensorpool::detail

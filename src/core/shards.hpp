// shards.hpp: the allocator's state that threads on different streams change side by side.
//
// Each stream belongs to one of kNumShards shards (round robin, in the order streams are first
// seen: up to eight streams never share one). A shard has its own lock, the live blocks of its
// streams' segments (pointer map), the Block objects of those segments, and the counters its
// fast path moves. The fast path (a cached allocate; a free that ends no epoch, or ends one that
// repeats its plan in place) takes only its shard's lock; everything else (growth, the OOM ladder,
// stream events, other epoch ends, hooks, stats, snapshots, invariants) takes the lock of every
// shard in use, in index order: the exclusive mode, `Shards` used as a mutex. A thread holding
// one shard's lock never takes another's, so the two modes cannot deadlock. State written only
// in the exclusive mode may be read under any shard's lock.
//
// Exact peaks without a shared counter per call. While one shard is in use (one stream, the
// common case) its own counters' peaks are the peaks and no ceiling applies. From the
// second on, every shard may raise its current values up to its ceilings, and the ceilings of
// all shards sum to at most the recorded peak, so no interleaving of fast paths can pass it. An
// allocation that would pass a ceiling takes the exclusive mode, whose unlock (settle()) sums
// the shards, raises the peak to the total if it is higher and hands the room below the peak to
// the shard that asked (taking back the others' room only when it must). A call in the exclusive
// mode that changes no counter (usage(), fragmentation(), snapshot(), record_stream()) leaves it
// without settling (Shards::View): there is nothing to settle. Invariants
// (check_invariants()): every current value at or below its shard's ceiling; per statistic, the
// ceilings sum to at most the peak, and the peak is at least the sum of the current values.
//
// Seams. Threads on one stream share its shard, and their blocks of one size often lie side by
// side. Once one thread's block has been freed, the other's free would merge the two, and the
// next request of that size would split them again: a split and a merge per pair while one thread
// runs alone (about 190 instructions; docs/benchmarks.md, "Threads"). So a fast-path free whose
// block has a free neighbour of its size that another thread freed (or whose block came from a
// seam) leaves the two apart in the free index and records them as its shard's seam (at most one
// a shard; never the free that empties a vmm heap, which ends its epoch). The shard's next
// fast-path allocation takes the lower twin whole if it asks for that size on that stream, else
// merges the two first (close_seam()), as does its next fast-path free; the exclusive mode merges
// every seam when it begins, so everything outside the fast path (growth, reclaim, epoch ends,
// plans, views) sees coalesced blocks. Invariants: `seam` and its next block are free, of equal
// size, mapped and not held, both in their segment's free index, and neither block beside the
// pair merges with it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/block.hpp"
#include "core/counters.hpp"
#include "core/free_index.hpp"
#include "core/lock.hpp"
#include "core/pointer_map.hpp"

namespace tensorpool::detail {

inline constexpr std::size_t kNumShards = 8;

/// The statistics the fast path raises: per pool and in total, their peaks are kept by ceilings.
inline constexpr std::array<Metric, 5> kShardMetrics = {Metric::allocated_bytes, Metric::requested_bytes,
                                                        Metric::active_bytes, Metric::allocations,
                                                        Metric::active_blocks};
/// Rows of the ceilings and peaks: one per pool, then the total.
inline constexpr int kTotalRow = kNumPools;
inline constexpr int kNumRows = kNumPools + 1;

struct alignas(64) Shard {
  FutexLock lock;
  PointerMap live;   // the allocated blocks of this shard's streams' segments, by address
  BlockPool blocks;  // the Blocks of those segments
  Counters counters; // the shard metrics of those blocks and this shard's calls (nothing reserved)
  std::array<std::array<std::int64_t, kNumMetrics>, kNumRows> ceiling{};
  bool bounded = false;  // whether `ceiling` applies (false: shard 0 while alone, and unused shards)
  std::array<std::uint64_t, kNumPools> handed_out{};  // per pool, blocks handed out so far: Block::born
  Block* seam = nullptr;  // the lower of two free twins kept apart (file comment), or null

  /// Merges the seam's two blocks, as the free that made it would have (file comment).
  void close_seam() noexcept {
    Block* lower = seam;
    seam = nullptr;
    FreeIndex& index = *lower->segment->index;
    index.remove(lower);
    index.remove(lower->next);
    blocks.absorb_next(lower);
    index.insert(lower);
  }

  /// Whether handing out a block of `size` bytes (`requested` asked for) keeps every counter of
  /// `pool` and of the total at or below its ceiling.
  TP_ALWAYS_INLINE bool fits(Pool pool, std::int64_t size, std::int64_t requested) const noexcept {
    if (!bounded) return true;
    const Stats& s = counters.stats();
    return row_fits(s.pool[static_cast<int>(pool)], ceiling[static_cast<int>(pool)], size, requested) &&
           row_fits(s.total, ceiling[kTotalRow], size, requested);
  }

 private:
  TP_ALWAYS_INLINE static bool row_fits(const PoolStats& s, const std::array<std::int64_t, kNumMetrics>& u,
                                        std::int64_t size, std::int64_t requested) noexcept {
    const auto at = [](Metric m) { return static_cast<int>(m); };
    return s[Metric::allocated_bytes].current + size <= u[at(Metric::allocated_bytes)] &&
           s[Metric::requested_bytes].current + requested <= u[at(Metric::requested_bytes)] &&
           s[Metric::active_bytes].current + size <= u[at(Metric::active_bytes)] &&
           s[Metric::allocations].current < u[at(Metric::allocations)] &&
           s[Metric::active_blocks].current < u[at(Metric::active_blocks)];
  }
};

class Shards {
 public:
  Shard& operator[](std::size_t i) noexcept { return shards_[i]; }
  const Shard& operator[](std::size_t i) const noexcept { return shards_[i]; }
  auto begin() noexcept { return shards_.begin(); }
  auto end() noexcept { return shards_.end(); }
  auto begin() const noexcept { return shards_.begin(); }
  auto end() const noexcept { return shards_.end(); }

  /// The exclusive mode: the lock of every shard in use, in index order (a shard no stream has
  /// runs no fast path; streams are only handed out in this mode, which holds shard 0, so the
  /// count read after taking shard 0's lock stays put).
  /// It begins with every seam merged.
  void lock() noexcept {
    lock_as_is();
    for (std::size_t i = 0; i < locked_; ++i)
      if (shards_[i].seam != nullptr) shards_[i].close_seam();
  }
  /// The exclusive mode with the seams left as they are, for check_invariants() (which checks
  /// them): the mode the fast paths left behind.
  void lock_as_is() noexcept {
    shards_[0].lock.lock();
    locked_ = in_use();
    for (std::size_t i = 1; i < locked_; ++i) shards_[i].lock.lock();
  }
  /// Settles peaks and ceilings, then leaves the exclusive mode.
  void unlock() noexcept {
    settle();
    favoured_ = nullptr;
    unlock_unchanged();
  }
  /// Leaves an exclusive mode that changed no counter, ceiling or favour (a view: usage(),
  /// snapshot()): nothing to settle, since the exclusive mode before it settled at its end and
  /// fast paths stay within their ceilings (the peaks and ceilings are as settle() would leave
  /// them). Saves a view the O(shards x metrics) settle().
  void unlock_unchanged() noexcept {
    for (std::size_t i = locked_; i-- > 0;) shards_[i].lock.unlock();
  }
  /// What a view does with the seams as it enters: merge them (lock(), what every view but one
  /// wants), or leave them as the fast paths left them (check_invariants(), which checks them
  /// and settles before it reads the peaks).
  enum class Seams { merged, as_left };
  /// The exclusive mode for such a view, as a scope.
  class View {
   public:
    explicit View(Shards& shards, Seams seams = Seams::merged) noexcept : shards_(shards) {
      if (seams == Seams::merged) shards_.lock();
      else shards_.lock_as_is();
    }
    ~View() { shards_.unlock_unchanged(); }
    View(const View&) = delete;
    View& operator=(const View&) = delete;

   private:
    Shards& shards_;
  };
  /// In the exclusive mode: the shard for the next new stream (round robin; its lock is taken
  /// at once, as the exclusive mode holds every shard in use).
  Shard& next_for_stream() noexcept;
  /// In the exclusive mode: the shard whose fast path asked for room (it gets the room below the
  /// peak when the mode ends).
  void favour(Shard* s) noexcept { favoured_ = s; }

  /// In the exclusive mode: raises the peaks to the shards' sums and shares out the room below
  /// them (unlock() does it; a view that reads peaks mid-way calls it first).
  void settle() noexcept;
  /// In the exclusive mode: `device_level` (what no shard counts: reserved bytes, segments,
  /// upstream calls ...) plus every shard's counters, with the exact peaks.
  Stats merged(const Stats& device_level) const noexcept;
  /// In the exclusive mode: the sum of the shards' current total of `m` (cheaper than merged()).
  std::int64_t total_current(Metric m) const noexcept {
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < in_use(); ++i) sum += shards_[i].counters.stats().total[m].current;
    return sum;
  }
  /// In the exclusive mode: every peak (and ceiling) down to the current value.
  void reset_peaks() noexcept;
  /// In the exclusive mode: the invariants of the file comment (InvariantError otherwise).
  void check() const;

  /// In the exclusive mode: the shards some stream has been given, the first in_use() (the others
  /// count and map nothing, so the exclusive mode's sums and searches need only look at these).
  std::size_t in_use() const noexcept { return streams_ == 0 ? 1 : streams_ < kNumShards ? streams_ : kNumShards; }

 private:
  std::int64_t current(std::size_t shard, int row, Metric m) const noexcept;
  bool alone() const noexcept { return in_use() == 1; }

  std::array<Shard, kNumShards> shards_;
  std::array<std::array<std::int64_t, kNumMetrics>, kNumRows> peak_{};  // of the shard metrics' sums
  Shard* favoured_ = nullptr;
  std::size_t streams_ = 0;  // streams handed a shard so far
  std::size_t locked_ = 0;   // shards the exclusive mode holds (the first locked_)
};

}  // namespace tensorpool::detail

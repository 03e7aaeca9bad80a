// step_finder.hpp: finds the steps of a program that repeats itself from its requests alone, for a
// program that never calls Allocator::step() (vmm_find_steps, docs/vmm.md "Steps").
//
// A training loop makes the same allocations in the same order every step, and every step begins
// with the same memory in use (weights, optimizer states): so the pair (size, bytes allocated)
// that each allocation makes repeats with the step's period, and within a step it does not, even
// where the layers of a model repeat the same sizes (each layer's activations add to what is in
// use). The finder keeps a rolling hash of the last 64 such pairs (a gear hash: shift and add, no
// window to store) and, at the allocations whose hash has its top kSampleBits bits clear (a choice
// made by the content, so the same places are sampled in every step), looks up where it saw that
// hash last.
//
// When every sample over a whole period found its hash one period back, the period is confirmed,
// and a boundary goes before the allocation that found the least memory in use over that period
// (the low point between two steps: after the optimizer, before the next forward pass; where a
// program would call step()), and a period after each boundary, while the samples keep agreeing.
// A sample that breaks the period drops it (the loop changed; it is found again once it repeats).
// A sample that finds its hash at most half a period back is a loop inside the step (the
// optimizer's update of each layer in turn, where the bytes in use come back to the same count):
// it neither confirms nor breaks the period, while the period's own samples keep agreeing. And a
// period is a step only if it makes at least a quarter as many allocations as there are blocks
// alive: a training step makes a gradient for each of its weights, which are at least a quarter
// of the live blocks (weights, gradients, two optimizer states), where the optimizer's loop over
// the layers makes far fewer. That bound also makes the boundary's walk over the heaps (O(their
// blocks)) cost O(1) per allocation.
//
// Cost per allocation: a multiply, a shift and an add, three compares; a sample (out of line)
// probes a small table. Periods under kMinPeriod allocations are not steps (an allocate + free
// pair in a loop repeats with period 1): a hash seen again that soon is marked, and a sample of a
// marked hash makes the finder sample exponentially less often (up to one in kMaxBackoff), so that
// such a loop costs the samples nothing. Periods whose samples the table cannot hold are not found.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/util.hpp"

namespace tensorpool::detail {

class StepFinder {
 public:
  static constexpr std::uint64_t kMinPeriod = 64;  // allocations
  static constexpr unsigned kSampleBits = 4;       // one allocation in 16 is sampled
  static constexpr unsigned kTableBits = 12;       // 4096 samples remembered (64 KiB): periods to ~32k allocations
  static constexpr std::size_t kTableSize = std::size_t{1} << kTableBits;
  static constexpr std::size_t kProbe = 8;                      // slots tried per sample
  static constexpr std::uint64_t kLiveBlocksPerAllocation = 4;  // a step: period >= live blocks / 4
  static constexpr std::uint64_t kMaxBackoff = 1u << 10;        // at most one sample in 1024 in a tiny loop

  /// An allocation of `size` bytes was handed out; `in_use` bytes in `live` blocks are allocated
  /// after it (the stream's shard's counts). True when a step boundary belongs right after it.
  TP_ALWAYS_INLINE bool on_alloc(std::uint64_t size, std::uint64_t in_use, std::uint64_t live) noexcept {
    hash_ = (hash_ << 1) + mixed(size, in_use);
    ++count_;
    if (const std::uint64_t before = in_use - size; TP_UNLIKELY(before < low_in_use_)) {
      low_in_use_ = before;
      low_at_ = count_;
    }
    if (TP_UNLIKELY((hash_ >> (64 - kSampleBits)) == 0 && count_ >= next_sample_)) sample(live);
    return count_ == boundary_at_ && next_boundary();
  }

  /// The period confirmed (allocations per step), or 0 while none is.
  std::uint64_t period() const noexcept { return confirmed_ ? period_ : 0; }
  /// The samples taken so far (what the finder cost beyond its few instructions per allocation).
  std::uint64_t samples() const noexcept { return samples_; }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    static constexpr std::uint64_t kAtMask = (std::uint64_t{1} << 63) - 1;  // count_ stays below 2^63
    std::uint64_t at : 63 = 0;        // count_ when it was sampled last (0: empty)
    std::uint64_t in_short_loop : 1 = 0;  // it was seen again fewer than kMinPeriod allocations later
  };
  struct Sighting {
    std::uint64_t at = 0;  // 0: never, or forgotten
    bool in_short_loop = false;
  };

  static TP_ALWAYS_INLINE std::uint64_t mixed(std::uint64_t size, std::uint64_t in_use) noexcept {
    return (size ^ (in_use * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
  }
  /// The sample at count_ tests the period (and sets boundary_at_ when it confirms one).
  void sample(std::uint64_t live) noexcept;
  /// At boundary_at_: the next one a period later; true.
  bool next_boundary() noexcept {
    boundary_at_ += period_;
    return true;
  }
  /// Where hash_ was sampled last, and remembers it at count_ (in a short loop if it is one).
  Sighting exchange_last_sighting() noexcept;
  void drop_period() noexcept;

  std::uint64_t hash_ = 0;
  std::uint64_t count_ = 0;        // allocations seen
  std::uint64_t next_sample_ = 0;  // no sample before this count (tiny loops back off)
  std::uint64_t backoff_ = 0;
  std::uint64_t samples_ = 0;
  // The period under test: every sample since agreed_since_ found its hash period_ back.
  std::uint64_t period_ = 0;
  std::uint64_t agreed_since_ = 0;
  std::uint64_t last_agreed_ = 0;  // the last sample that found its hash period_ back
  std::uint64_t low_in_use_ = UINT64_MAX;  // the least bytes in use before an allocation since agreed_since_ ...
  std::uint64_t low_at_ = 0;               // ... and that allocation (the first so low)
  bool confirmed_ = false;  // the period held over a whole period: a boundary comes before each low point
  std::uint64_t boundary_at_ = 0;  // while confirmed_: the count after which the next boundary belongs (0: none)
  std::array<Slot, kTableSize> table_{};
};

}  // namespace tensorpool::detail

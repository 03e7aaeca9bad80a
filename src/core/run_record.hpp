// run_record.hpp: a vmm heap's record of a whole run of step epochs, from an empty heap to the
// step that empties it again, joined from the steps' records as each ends (vmm_steps.cpp).
//
// With step() a heap that holds a model never empties inside a step: its epochs run from one
// boundary to the next, each planned around its base. A program that frees its model and builds
// it again (or a replay's warm pass) empties the heap at a step, and its next run makes the same
// requests from an empty heap. Step by step, that run follows only the plans of the steps that
// were planned (a server's decode steps, each like none before it, are not), and the pages above
// what it reached stay or cycle. Joined, the steps' records are one epoch from an empty heap to
// an empty heap, whose plan the next run follows over its boundaries (EpochPlan::boundaries), as
// a program that never calls step() follows the plan of its whole run.
//
// Joining is off the fast path: at a step boundary (step(); the first reserves room for
// vmm_plan_max_blocks allocations, 40 bytes each, address space that is touched as the record
// fills, as an EpochLog's), or in the free that empties the heap (no allocation there). The
// record keeps that room when the planner thread takes it (a spare buffer of the same room comes
// back): the heap's epoch records into such buffers from its fast path. O(the step's allocations
// and the base blocks it freed, and log of the blocks live over its boundary).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/epoch_log.hpp"
#include "core/layout_plan.hpp"

namespace tensorpool::detail {

class RunRecord {
 public:
  /// The run's allocations in order, each with its lifetime on the run's clock (end 0 while it is
  /// live over the last boundary joined).
  const std::vector<RecordedBlock>& entries() const noexcept { return entries_; }
  /// The step boundaries the run went over (those its epochs went on over, and those that ended
  /// them).
  std::uint32_t boundaries() const noexcept { return boundaries_; }
  /// Every step since the heap was empty is joined, and every block the run allocated is freed:
  /// the whole run, ready to plan.
  bool whole() const noexcept { return joinable_ && boundaries_ != 0 && open_.empty() && !entries_.empty(); }

  /// The record, for EpochPlanner::try_hand_over(), which swaps it for a spare buffer (empty,
  /// with room): the run is over then (restart()).
  std::vector<RecordedBlock>& record_to_hand_over() noexcept { return entries_; }

  /// The heap is empty: a new run begins.
  void restart() noexcept {
    entries_.clear();
    open_.clear();
    clock_ = 0;
    boundaries_ = 0;
    joinable_ = true;
  }
  /// A step could not be joined (its record is incomplete, or the heap was asleep): the run is
  /// not planned as a whole.
  void drop() noexcept { joinable_ = false; }

  /// Where an epoch joined ended.
  enum class EpochEnded : std::uint8_t { at_boundary, emptied };
  /// Joins the record of the epoch that just ended, as VmmHeaps::end_step_epoch() leaves it: its
  /// allocations first, those live at its end pinned; the base blocks it freed in
  /// `log.freed_base`. `capacity`: the most allocations a run may have (vmm_plan_max_blocks):
  /// past it, or with a record that is not whole (`log.full`), the run is dropped.
  void join(const EpochLog& log, std::size_t capacity, EpochEnded ended) {
    if (!joinable_) return;
    if (log.full) return drop();
    const bool at_boundary = ended == EpochEnded::at_boundary;
    if (entries_.capacity() < capacity) {
      if (!at_boundary) return drop();  // no allocation in a free
      entries_.reserve(capacity);
    }
    if (entries_.size() + log.allocations() > capacity) return drop();
    const std::uint64_t start = clock_;
    // Each freed block closed where it lies, then the closed ones removed in one pass: erased one
    // by one, the free that empties a heap moved the open blocks once per freed one (200 us for
    // a GPT-2 1.5B step's 2,000 weights and states).
    constexpr std::size_t kClosed = SIZE_MAX;
    for (const RecordedBlock& freed : log.freed_base) {
      const auto it = std::lower_bound(open_.begin(), open_.end(), std::pair{freed.recorded, std::size_t{0}});
      if (it == open_.end() || it->first != freed.recorded || it->second == kClosed) return drop();
      entries_[it->second].end = start + freed.end;
      it->second = kClosed;
    }
    if (!log.freed_base.empty())
      std::erase_if(open_, [](const std::pair<std::size_t, std::size_t>& o) { return o.second == kClosed; });
    const std::size_t opened = open_.size();
    for (std::size_t i = 0; i < log.allocations(); ++i) {
      const RecordedBlock& e = log.entries[i];
      if (e.pinned) open_.emplace_back(e.recorded, entries_.size());
      entries_.push_back(RecordedBlock{e.size, start + e.start, e.pinned ? 0 : start + e.end, e.recorded});
    }
    const auto middle = open_.begin() + static_cast<std::ptrdiff_t>(opened);
    std::sort(middle, open_.end());
    std::inplace_merge(open_.begin(), middle, open_.end());
    clock_ = start + log.clock;
    boundaries_ += log.boundaries + (at_boundary ? 1 : 0);  // those it went on over, and its own
  }

 private:
  std::vector<RecordedBlock> entries_;
  std::vector<std::pair<std::size_t, std::size_t>> open_;  // (offset, index in entries_) by offset
  std::uint64_t clock_ = 0;
  std::uint32_t boundaries_ = 0;
  bool joinable_ = true;
};

}  // namespace tensorpool::detail

// vmm_plans.hpp: the planned layouts of a vmm heap, as data: the plan of one epoch (EpochPlan),
// the plans a heap keeps (PlanCache), and where the current epoch stands with its plan
// (PlanCursor). What they are for, and the flow that uses them: vmm_epochs.cpp.
//
// The record the plans come from is the heap's EpochLog (epoch_log.hpp); the planner that makes
// a layout from it is plan_layout() (layout_plan.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/block.hpp"
#include "core/layout_plan.hpp"
#include "core/plan_state.hpp"

namespace tensorpool::detail {

/// The planned layout of one recorded epoch, as a heap follows it: step i is the epoch's i-th
/// allocation. Immutable once made, shared by the cache keys it is stored under.
struct EpochPlan {
  struct Step {
    std::size_t size = 0;
    std::size_t offset = 0;  // from the heap's start
    /// The step whose block ends closest below this one's while it lives (PlannedLayout::kNone:
    /// none): where the search for its free block starts.
    std::uint32_t below = PlannedLayout::kNone;
  };
  std::vector<Step> steps;
  std::size_t height = 0;  // the mapped bytes from the heap's start it needs (whole pages)
};

/// The plans of a heap, each stored under the signature of the epoch that came before it (a heap
/// that empties several times per iteration runs the same chain of epochs each iteration), at
/// most `max_steps` steps in all; the least recently used go first.
/// Invariant: steps() == the sum of the stored plans' steps.
class PlanCache {
 public:
  explicit PlanCache(std::size_t max_steps) : max_steps_(max_steps) {}

  /// The plan stored under `key`, now the most recently used; null if none.
  std::shared_ptr<const EpochPlan> find(std::uint64_t key);
  /// Stores `plan` under `key` (replacing what was there), then evicts the least recently used
  /// plans but those under `key` and `spare` while the cache holds more than max_steps steps.
  void store(std::uint64_t key, std::shared_ptr<const EpochPlan> plan, std::uint64_t spare);

  std::size_t steps() const noexcept { return steps_; }
  std::size_t recount_steps() const;  // for check_invariants

 private:
  struct Entry {
    std::shared_ptr<const EpochPlan> plan;
    std::uint64_t used = 0;  // the value of clock_ when last stored or found
  };
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::size_t steps_ = 0;
  std::uint64_t clock_ = 0;
  std::size_t max_steps_;
};

/// Where a heap's current epoch stands with its plan (PlanState), and the blocks the plan's steps
/// got so far. Invariants (VmmHeaps::check_epoch): state() == following implies a plan with
/// next() < its number of steps; placed(i) is defined for i < next().
class PlanCursor {
 public:
  PlanState state() const noexcept { return state_; }
  /// Read by the fast path through StreamState::plan_state: the one copy of the state.
  const PlanState* state_address() const noexcept { return &state_; }

  /// The plan of the current epoch (null while recording without one) and its cache key.
  const std::shared_ptr<const EpochPlan>& plan() const noexcept { return plan_; }
  std::uint64_t key() const noexcept { return key_; }

  /// A new epoch follows `plan` (stored under `key`) from its first step.
  void follow(std::shared_ptr<const EpochPlan> plan, std::uint64_t key);
  /// A new epoch follows the plan the last one followed to the end (matched()), from its first
  /// step.
  void follow_again() noexcept;
  /// Hands over the plan (the cursor then has none: record() or follow() next).
  std::shared_ptr<const EpochPlan> release_plan() noexcept { return std::move(plan_); }
  /// A new epoch without a plan.
  void record() noexcept;

  /// The index and the step to serve next (state() == following).
  std::size_t next() const noexcept { return next_; }
  const EpochPlan::Step& next_step() const noexcept { return plan_->steps[next_]; }
  /// The next step got block b; the plan is completed after its last step.
  void served(Block* b);
  /// A request the plan did not foresee: the rest of the epoch is online.
  void depart() noexcept { state_ = PlanState::departed; }

  /// The block step i got (i < next()), as it was handed out: the Block may have been freed and
  /// recycled since, so check it before use.
  const Block* placed(std::size_t i) const noexcept { return placed_[i]; }
  /// The epoch that just ended made exactly the plan's requests, in order, and nothing more.
  bool matched(std::size_t recorded_allocations) const noexcept {
    return plan_ != nullptr && state_ == PlanState::completed && recorded_allocations == plan_->steps.size();
  }

 private:
  PlanState state_ = PlanState::recording;
  std::shared_ptr<const EpochPlan> plan_;
  std::uint64_t key_ = 0;
  std::vector<Block*> placed_;  // per step served so far
  std::size_t next_ = 0;
};

}  // namespace tensorpool::detail

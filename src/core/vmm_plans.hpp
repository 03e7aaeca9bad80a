// vmm_plans.hpp: the planned layouts of a vmm heap, as data: the plan of one epoch (EpochPlan),
// the plans a heap keeps (PlanCache), and where the current epoch stands with its plan
// (PlanCursor). What they are for, and the flow that uses them: vmm_epochs.cpp.
//
// The record the plans come from is the heap's EpochLog (epoch_log.hpp); the planner that makes
// a layout from it is plan_layout() (layout_plan.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
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
    /// The block that ends closest below this one's while it lives, where the search for its
    /// free block starts: a step (below < steps.size()), a block live before the epoch began
    /// (fixed_anchors[below - steps.size()]) or none (PlannedLayout::kNone).
    std::uint32_t below = PlannedLayout::kNone;
  };
  std::vector<Step> steps;
  /// The offsets of the fixed blocks (live throughout the epoch: a step's weights) that steps
  /// start their search from: without them, a step placed above the base would walk the heap's
  /// blocks from its start.
  std::vector<std::size_t> fixed_anchors;
  std::size_t height = 0;  // the mapped bytes from the heap's start it needs (whole pages)
  /// The step boundaries its epoch went on over (a whole run of steps, RunRecord); an epoch that
  /// follows it goes on over as many while it keeps to it (VmmHeaps::step_boundary()).
  std::uint32_t boundaries = 0;
  EpochPlan* buried_next = nullptr;  // PlanGraveyard's list (vmm_planner.hpp), once released
};

/// The plans of a heap, each stored under the signature of the epoch that came before it (a heap
/// that empties several times per iteration runs the same chain of epochs each iteration), at
/// most `max_steps` steps in all; the least recently used go first. Every operation is O(1) but
/// for the plans it evicts: a store at the end of an epoch never scans the cache.
/// Invariants: steps() == the sum of the stored plans' steps; lru_ lists every key once.
class PlanCache {
 public:
  explicit PlanCache(std::size_t max_steps) : max_steps_(max_steps) {}

  /// The plan stored under `key`, now the most recently used; null if none.
  std::shared_ptr<const EpochPlan> find(std::uint64_t key);
  /// Stores `plan` (of an epoch whose own signature is `signature`) under `key`, replacing what
  /// was there, then evicts the least recently used plans but those under `key` and `spare` while
  /// the cache holds more than max_steps steps.
  void store(std::uint64_t key, std::shared_ptr<const EpochPlan> plan, std::uint64_t spare,
             std::uint64_t signature);

  /// The plan of an epoch whose own signature is `signature` stored last, and the key it is
  /// stored under, while it is cached; null if none (not a use: the order of eviction does not
  /// change).
  struct Found {
    std::shared_ptr<const EpochPlan> plan;
    std::uint64_t key = 0;
  };
  Found latest_of(std::uint64_t signature) const;
  /// The plan stored under `key` and those stored after it in turn (the plan for the epoch after
  /// one with the plan's own signature, and so on), at most `links` of them, up to the plan of an
  /// epoch whose own signature is `last`: the highest of them, and whether that one was reached.
  struct Chain {
    std::size_t height = 0;
    bool closed = false;
  };
  Chain chain(std::uint64_t key, std::size_t links, std::uint64_t last) const;

  std::size_t steps() const noexcept { return steps_; }
  std::size_t recount_steps() const;  // for check_invariants

 private:
  struct Entry {
    std::shared_ptr<const EpochPlan> plan;
    std::uint64_t signature = 0;           // the planned epoch's own
    std::list<std::uint64_t>::iterator lru;  // its key in lru_
  };
  void erase(std::unordered_map<std::uint64_t, Entry>::iterator it);

  std::unordered_map<std::uint64_t, Entry> entries_;
  std::list<std::uint64_t> lru_;                         // keys, least recently used first
  std::unordered_map<std::uint64_t, std::uint64_t> latest_;  // signature -> key stored last with it
  std::size_t steps_ = 0;
  std::size_t max_steps_;
};

/// Where a heap's current epoch stands with its plan (PlanState), and the blocks the plan's steps
/// got so far. Invariants (VmmHeaps::check_epoch): state() == following implies a plan with
/// next() < its number of steps; laying_out implies a plan and the heap's layout event;
/// placed(i) is defined for i < next().
class PlanCursor {
 public:
  PlanState state() const noexcept { return state_; }
  /// Read by the fast path through StreamState::plan_state: the one copy of the state.
  const PlanState* state_address() const noexcept { return &state_; }

  /// The plan of the current epoch (null while recording without one) and its cache key.
  const std::shared_ptr<const EpochPlan>& plan() const noexcept { return plan_; }
  std::uint64_t key() const noexcept { return key_; }

  /// Room for plans of up to `steps` steps, so that following one allocates nothing.
  void reserve(std::size_t steps) { placed_.reserve(steps); }
  /// A new epoch follows `plan` (stored under `key`) from its first step.
  void follow(std::shared_ptr<const EpochPlan> plan, std::uint64_t key);
  /// A new epoch follows the plan the last one followed to the end (matched()), or the plan it
  /// waited to lay out, from its first step.
  void follow_again() noexcept;
  /// A new epoch will follow `plan` once its pages are laid out (PlanState::laying_out).
  void wait_for_layout(std::shared_ptr<const EpochPlan> plan, std::uint64_t key);
  /// ... the plan the last epoch followed to the end.
  void wait_for_layout_again() noexcept { state_ = PlanState::laying_out; }
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
  std::vector<Block*, CacheLineAllocator<Block*>> placed_;  // per step; those below next() are the blocks served (the rest: stale)
  std::size_t next_ = 0;
};

}  // namespace tensorpool::detail

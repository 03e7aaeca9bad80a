// vmm_plans.cpp: the plan cache and the plan cursor of vmm_plans.hpp.
#include "core/vmm_plans.hpp"

#include <algorithm>
#include <utility>

namespace tensorpool::detail {

std::shared_ptr<const EpochPlan> PlanCache::find(std::uint64_t key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  it->second.used = ++clock_;
  return it->second.plan;
}

void PlanCache::store(std::uint64_t key, std::shared_ptr<const EpochPlan> plan, std::uint64_t spare) {
  auto [it, inserted] = entries_.try_emplace(key);
  if (!inserted) steps_ -= it->second.plan->steps.size();
  steps_ += plan->steps.size();
  it->second = Entry{std::move(plan), ++clock_};
  // Eviction scans the entries: a few per heap (one per distinct epoch of an iteration).
  while (steps_ > max_steps_ && entries_.size() > 1) {
    auto oldest = entries_.end();
    for (auto e = entries_.begin(); e != entries_.end(); ++e)
      if (e->first != spare && e->first != key && (oldest == entries_.end() || e->second.used < oldest->second.used))
        oldest = e;
    if (oldest == entries_.end()) break;
    steps_ -= oldest->second.plan->steps.size();
    entries_.erase(oldest);
  }
}

std::size_t PlanCache::recount_steps() const {
  std::size_t steps = 0;
  for (const auto& [key, e] : entries_) steps += e.plan->steps.size();
  return steps;
}

void PlanCursor::follow(std::shared_ptr<const EpochPlan> plan, std::uint64_t key) {
  plan_ = std::move(plan);
  key_ = key;
  placed_.assign(plan_->steps.size(), nullptr);
  next_ = 0;
  state_ = plan_->steps.empty() ? PlanState::completed : PlanState::following;
}

void PlanCursor::follow_again() noexcept {
  std::fill(placed_.begin(), placed_.end(), nullptr);
  next_ = 0;
  state_ = PlanState::following;
}

void PlanCursor::record() noexcept {
  plan_ = nullptr;
  state_ = PlanState::recording;
  next_ = 0;
}

void PlanCursor::served(Block* b) {
  placed_[next_] = b;
  if (++next_ == plan_->steps.size()) state_ = PlanState::completed;
}

}  // namespace tensorpool::detail

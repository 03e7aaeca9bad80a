// vmm_plans.cpp: the plan cache and the plan cursor of vmm_plans.hpp.
#include "core/vmm_plans.hpp"

#include <algorithm>
#include <utility>

namespace tensorpool::detail {

std::shared_ptr<const EpochPlan> PlanCache::find(std::uint64_t key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.plan;
}

PlanCache::Found PlanCache::latest_of(std::uint64_t signature) const {
  const auto latest = latest_.find(signature);
  if (latest == latest_.end()) return {};
  return Found{entries_.at(latest->second).plan, latest->second};
}

PlanCache::Chain PlanCache::chain(std::uint64_t key, std::size_t links, std::uint64_t last) const {
  Chain c;
  for (auto it = entries_.find(key); it != entries_.end() && links > 0; --links) {
    c.height = std::max(c.height, it->second.plan->height);
    if (it->second.signature == last) {
      c.closed = true;
      break;
    }
    it = entries_.find(it->second.signature);
  }
  return c;
}

void PlanCache::erase(std::unordered_map<std::uint64_t, Entry>::iterator it) {
  const auto latest = latest_.find(it->second.signature);
  if (latest != latest_.end() && latest->second == it->first) latest_.erase(latest);
  steps_ -= it->second.plan->steps.size();
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void PlanCache::store(std::uint64_t key, std::shared_ptr<const EpochPlan> plan, std::uint64_t spare,
                      std::uint64_t signature) {
  if (auto old = entries_.find(key); old != entries_.end()) erase(old);
  steps_ += plan->steps.size();
  lru_.push_back(key);
  entries_.emplace(key, Entry{std::move(plan), signature, std::prev(lru_.end())});
  latest_[signature] = key;
  while (steps_ > max_steps_ && entries_.size() > 1) {
    auto oldest = lru_.begin();
    while (oldest != lru_.end() && (*oldest == spare || *oldest == key)) ++oldest;
    if (oldest == lru_.end()) break;
    erase(entries_.find(*oldest));
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
  if (placed_.size() < plan_->steps.size()) placed_.resize(plan_->steps.size());
  next_ = 0;
  state_ = plan_->steps.empty() ? PlanState::completed : PlanState::following;
}

void PlanCursor::wait_for_layout(std::shared_ptr<const EpochPlan> plan, std::uint64_t key) {
  follow(std::move(plan), key);
  state_ = PlanState::laying_out;
}

void PlanCursor::follow_again() noexcept {
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

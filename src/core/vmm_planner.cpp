// vmm_planner.cpp: the planner of vmm_planner.hpp: the plan of an epoch, and the thread that
// makes them off the caller's path.
#include "core/vmm_planner.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "core/logging.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::detail {

namespace {

std::unique_ptr<EpochPlan> plan_of(std::span<const RecordedBlock> record, std::size_t page, std::uint32_t boundaries) {
  if (record.empty()) return nullptr;
  try {
    const PlannedLayout layout = plan_layout(record);
    auto plan = std::make_unique<EpochPlan>();
    // A step per allocation of the epoch (the fixed blocks, live throughout, come after them in
    // the record: they are no step, but a step placed above one starts its search there).
    const std::size_t steps = allocations_in(record);
    if (steps == 0) return nullptr;
    plan->steps.resize(steps);
    std::vector<std::uint32_t> anchor_of(record.size() - steps, PlannedLayout::kNone);  // per fixed block
    for (std::size_t i = 0; i < steps; ++i) {
      std::uint32_t below = layout.below[i];
      if (below != PlannedLayout::kNone && below >= steps) {
        std::uint32_t& anchor = anchor_of[below - steps];
        if (anchor == PlannedLayout::kNone) {
          anchor = static_cast<std::uint32_t>(steps + plan->fixed_anchors.size());
          plan->fixed_anchors.push_back(layout.offsets[below]);
        }
        below = anchor;
      }
      plan->steps[i] = EpochPlan::Step{.size = record[i].size, .offset = layout.offsets[i], .below = below};
    }
    plan->height = round_up(layout.height, page);
    plan->boundaries = boundaries;
    return plan;
  } catch (const std::exception& e) {
    log().error("vmm: planning an epoch of {} allocations failed: {}", record.size(), e.what());
    return nullptr;
  }
}

}  // namespace

std::shared_ptr<const EpochPlan> make_epoch_plan(std::span<const RecordedBlock> record, std::size_t page,
                                                 std::uint32_t boundaries) {
  return plan_of(record, page, boundaries);
}

void PlanGraveyard::bury(EpochPlan* plan) noexcept {
  if (closed_.load(std::memory_order_acquire)) {
    delete plan;
    return;
  }
  buried_.fetch_add(1, std::memory_order_relaxed);
  plan->buried_next = head_.load(std::memory_order_relaxed);
  while (!head_.compare_exchange_weak(plan->buried_next, plan, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

std::size_t PlanGraveyard::delete_all() noexcept {
  std::size_t deleted = 0;
  for (EpochPlan* p = head_.exchange(nullptr, std::memory_order_acquire); p != nullptr; ++deleted) {
    EpochPlan* next = p->buried_next;
    delete p;
    p = next;
  }
  buried_.fetch_sub(deleted, std::memory_order_relaxed);
  deleted_.fetch_add(deleted, std::memory_order_relaxed);
  return deleted;
}

void PlanGraveyard::close() noexcept {
  closed_.store(true, std::memory_order_release);
  delete_all();
}

void EpochPlanner::prepare(PlanMailbox& mailbox, std::size_t spares, std::size_t capacity) {
  std::vector<std::vector<RecordedBlock>> buffers(spares);
  for (auto& b : buffers) b.reserve(capacity);
  std::lock_guard lock(mutex_);
  for (auto& b : buffers)
    queue_.push_back(Job{.mailbox = &mailbox, .key = 0, .signature = 0, .record = std::move(b), .boundaries = 0,
                         .work = Work::deliver_spare, .pages = Pages::fresh});
  last_job_ = Clock::now();  // a new heap's first epochs are near: the thread looks often
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
}

bool EpochPlanner::try_hand_over(PlanMailbox& mailbox, std::uint64_t key, std::uint64_t signature,
                                 std::vector<RecordedBlock>& record, std::uint32_t boundaries) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || stopping_ || mailbox.buffers.empty()) return false;
  std::vector<RecordedBlock> spare = std::move(mailbox.buffers.back());
  mailbox.buffers.pop_back();
  // The heap's first buffer was only reserved; the spares it gets have been written. A whole
  // run's record (boundaries != 0: RunRecord) was written only as far as the run went.
  const Pages pages = mailbox.handed_over && boundaries == 0 ? Pages::written : Pages::fresh;
  mailbox.handed_over = true;
  queue_.push_back(Job{.mailbox = &mailbox, .key = key, .signature = signature,
                       .record = std::exchange(record, std::move(spare)), .boundaries = boundaries,
                       .work = Work::plan, .pages = pages});
  return true;  // no wake-up: the thread finds the job at its next look (run())
}

bool EpochPlanner::try_hand_over_made(PlanMailbox& mailbox, std::uint64_t key, std::uint64_t signature,
                                      std::vector<RecordedBlock>&& record) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || stopping_) return false;
  queue_.push_back(Job{.mailbox = &mailbox, .key = key, .signature = signature, .record = std::move(record),
                       .boundaries = 0, .work = Work::plan_and_return, .pages = Pages::written});
  return true;
}

std::vector<FinishedPlan> EpochPlanner::try_collect(PlanMailbox& mailbox) {
  std::vector<std::vector<RecordedBlock>> made;  // freed here, once the mutex is released
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return {};
  made = std::exchange(mailbox.made_records, {});
  std::vector<FinishedPlan> finished = std::exchange(mailbox.finished, {});
  lock.unlock();
  return finished;
}

std::size_t EpochPlanner::spare_buffers(const PlanMailbox& mailbox) {
  std::lock_guard lock(mutex_);
  return mailbox.buffers.size();
}

void EpochPlanner::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  graveyard_->close();
}

// The thread runs only where a core would idle (Linux: SCHED_IDLE): waking from its sleep on the
// caller's core, it would otherwise preempt the caller, tens of microseconds inside a call. Where
// the policy cannot be set the thread runs at the default priority.
namespace {
void lower_priority_of_this_thread() {
#if defined(__linux__)
  sched_param param{};
  param.sched_priority = 0;
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) != 0)
    log().debug("vmm planner: SCHED_IDLE refused; the planner thread runs at the default priority");
#endif
}
}  // namespace

// How long the thread sleeps before it looks at its queue again: kLookBusy while jobs came in the
// last kBusyFor, else kLookIdle.
std::chrono::milliseconds EpochPlanner::look_interval(Clock::time_point now) const noexcept {
  return now - last_job_ < kBusyFor ? kLookBusy : kLookIdle;
}

void EpochPlanner::run() {
  lower_priority_of_this_thread();
  std::unique_lock lock(mutex_);
  for (;;) {
    if (queue_.empty()) wake_.wait_for(lock, look_interval(Clock::now()), [this] { return stopping_; });
    if (stopping_) return;
    if (graveyard_->buried() != 0) {
      lock.unlock();
      graveyard_->delete_all();
      lock.lock();
    }
    if (queue_.empty()) continue;
    last_job_ = Clock::now();
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::shared_ptr<const EpochPlan> plan;
    if (job.work != Work::deliver_spare) {
      if (std::unique_ptr<EpochPlan> made = plan_of(job.record, page_, job.boundaries))
        plan = std::shared_ptr<const EpochPlan>(made.release(), [graveyard = graveyard_](EpochPlan* p) { graveyard->bury(p); });
    }
    const bool spare = job.work != Work::plan_and_return;
    if (spare) {
      job.record.clear();
      if (job.pages == Pages::fresh)  // the fast path appends to it
        reserve_resident(job.record, std::min(job.record.capacity(), kResidentBlocks));
    }
    lock.lock();
    if (plan) job.mailbox->finished.push_back(FinishedPlan{job.key, job.signature, std::move(plan)});
    (spare ? job.mailbox->buffers : job.mailbox->made_records).push_back(std::move(job.record));
  }
}

}  // namespace tensorpool::detail

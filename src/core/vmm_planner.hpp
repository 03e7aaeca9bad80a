// vmm_planner.hpp: where the epochs of the vmm heaps are planned (vmm_epochs.cpp hands them over).
//
// vmm_planner:background (the default): a thread of the allocator's own plans each recorded
// epoch off the caller's path; the free that ends an epoch only hands its record over (a swap of
// buffers), and the plan is stored in the heap's PlanCache when the heap collects it, at one of
// its next epoch ends (a plan is one epoch late at worst when the thread keeps up).
// vmm_planner:synchronous: the free that ends the epoch plans it at once, so the next epoch may
// follow it: deterministic, what the replay targets use (a replay's epochs last microseconds).
//
// Thread safety: the thread touches only its queue, the job it plans and the heaps' mailboxes,
// each under the planner's mutex (a leaf lock: nothing else is taken while it is held). The
// allocator's side only tries the mutex (try_hand_over, try_collect): the thread runs at
// SCHED_IDLE and may be preempted holding it, and a free must not wait for it. A heap outlives
// the planner (VmmHeaps stops it first).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "core/layout_plan.hpp"
#include "core/vmm_plans.hpp"

namespace tensorpool::detail {

/// The plan of a recorded epoch as a heap follows it, its height in whole pages; null when the
/// record is empty or planning fails (logged: a free must not fail for want of a plan).
/// The plan of a recorded epoch: a step per allocation, in order; the record's fixed blocks (the
/// base of a step epoch, RecordedBlock::fixed) come last and are no step. Null when the record has
/// no allocation or planning fails.
std::shared_ptr<const EpochPlan> make_epoch_plan(std::span<const RecordedBlock> record, std::size_t page);

/// A finished plan on its way to its heap's PlanCache: stored under `key` (the signature of the
/// epoch before the planned one), the planned epoch's own signature `signature`.
struct FinishedPlan {
  std::uint64_t key = 0;
  std::uint64_t signature = 0;
  std::shared_ptr<const EpochPlan> plan;
};

/// What the planner thread and one heap exchange, under the planner's mutex.
struct PlanMailbox {
  std::vector<FinishedPlan> finished;                 // in the order they were planned
  std::vector<std::vector<RecordedBlock>> buffers;    // planned records, cleared, for reuse
};

class EpochPlanner {
 public:
  explicit EpochPlanner(std::size_t page) : page_(page) {}
  ~EpochPlanner() { stop(); }
  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  /// Starts the thread, if not yet, and gives `mailbox` `spares` empty record buffers of
  /// `capacity` entries: called when a heap is made (a call that maps memory anyway), so that the
  /// frees that end its epochs neither start a thread nor allocate a buffer.
  void prepare(PlanMailbox& mailbox, std::size_t spares, std::size_t capacity);
  /// Hands the epoch recorded in `record` over to the thread prepare() started, and gives
  /// `record` a spare buffer in its place (empty, with capacity). O(1), and the caller never
  /// waits: when the thread holds the mutex (it may be preempted there, at SCHED_IDLE), or every
  /// spare of the mailbox is queued or being planned, nothing happens and it returns false.
  bool try_hand_over(PlanMailbox& mailbox, std::uint64_t key, std::uint64_t signature,
                     std::vector<RecordedBlock>& record);
  /// The plans finished for `mailbox` since the last call, in order; none when the thread holds
  /// the mutex (they are collected next time): the caller never waits.
  std::vector<FinishedPlan> try_collect(PlanMailbox& mailbox);
  /// Stops the thread (after the job it is planning); the jobs still queued are dropped.
  void stop();

 private:
  struct Job {
    PlanMailbox* mailbox;
    std::uint64_t key;
    std::uint64_t signature;
    std::vector<RecordedBlock> record;
  };
  void run();

  const std::size_t page_;
  std::mutex mutex_;
  std::condition_variable wake_;  // the thread: a job came, or stop
  std::deque<Job> queue_;
  bool waiting_ = false; // the thread waits for a job: only then does submit() wake it
  bool stopping_ = false;
  std::thread thread_;   // started by prepare()
};

}  // namespace tensorpool::detail

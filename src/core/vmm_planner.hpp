// vmm_planner.hpp: where the epochs of the vmm heaps are planned (vmm_epochs.cpp and
// vmm_steps.cpp hand them over).
//
// vmm_planner:background (the default): a thread of the allocator's own plans each recorded
// epoch off the caller's path; the free that ends an epoch only hands its record over (a swap of
// buffers), and the plan is stored in the heap's PlanCache when the heap collects it, at one of
// its next epoch ends (a plan is one epoch late at worst when the thread keeps up).
// The free never wakes the thread: waking a sleeping thread is a system call that interrupts
// another CPU, 4-20 us on the KVM guests this is measured on, inside the free. The thread looks at
// its queue instead, every kLookBusy while jobs keep coming and every kLookIdle after a quiet
// kBusyFor: a plan comes at most kLookBusy after its epoch ends (plus its planning), well within
// a training step, and an idle allocator's thread wakes 20 times a second.
// vmm_planner:synchronous: the free that ends the epoch plans it at once, so the next epoch may
// follow it: deterministic, what the replay targets use (a replay's epochs last microseconds).
//
// Thread safety: the thread touches only its queue, the job it plans and the heaps' mailboxes,
// each under the planner's mutex (a leaf lock: nothing else is taken while it is held). The
// allocator's side only tries the mutex (try_hand_over, try_collect): the thread runs at
// SCHED_IDLE and may be preempted holding it, and a free must not wait for it. A heap outlives
// the planner (VmmHeaps stops it first).
#pragma once

#include <atomic>
#include <chrono>
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
/// no allocation or planning fails. `boundaries`: the step boundaries the epoch went on over
/// (EpochPlan::boundaries).
std::shared_ptr<const EpochPlan> make_epoch_plan(std::span<const RecordedBlock> record, std::size_t page,
                                                 std::uint32_t boundaries = 0);

/// Where the plans the thread made go to be deleted. Their memory comes from the thread's malloc
/// arena, and freeing a large block of it takes that arena's lock, which the thread (at
/// SCHED_IDLE, preemptible anywhere, inside malloc while it plans) may hold: on the caller's path
/// that would wait for the thread to run again. So the release of a plan's last reference only
/// pushes it here (lock-free, O(1)), and the thread deletes what it finds at each look; once the
/// thread has stopped (close()), plans are deleted where they are released (teardown).
class PlanGraveyard {
 public:
  ~PlanGraveyard() { delete_all(); }
  void bury(EpochPlan* plan) noexcept;
  /// Deletes every plan buried so far; how many.
  std::size_t delete_all() noexcept;
  void close() noexcept;
  /// Plans buried and not yet deleted.
  std::size_t buried() const noexcept { return buried_.load(std::memory_order_relaxed); }
  /// Plans delete_all() has deleted so far (tests).
  std::size_t deleted() const noexcept { return deleted_.load(std::memory_order_relaxed); }

 private:
  std::atomic<EpochPlan*> head_{nullptr};
  std::atomic<std::size_t> buried_{0};
  std::atomic<std::size_t> deleted_{0};
  std::atomic<bool> closed_{false};
};

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
  /// Records of try_hand_over_made(), planned: freed by the heap's side (try_collect()), whose
  /// malloc arena they came from (the thread, preemptible at SCHED_IDLE, must not hold it).
  std::vector<std::vector<RecordedBlock>> made_records;
  bool handed_over = false;                           // the heap's own first buffer is gone
};

class EpochPlanner {
 public:
  explicit EpochPlanner(std::size_t page) : page_(page) {}
  ~EpochPlanner() { stop(); }
  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  /// Starts the thread, if not yet, and gives `mailbox` `spares` empty record buffers of
  /// `capacity` entries: called when a heap is made (a call that maps memory anyway), so that the
  /// frees that end its epochs neither start a thread nor allocate a buffer. The thread writes
  /// every page of each buffer once before it lands in the mailbox, as it does for the heap's own
  /// first buffer when that comes back planned: the allocations that later fill them take no page
  /// fault, and the call that makes the heap does not write 640 KiB (5 ms of faults measured on
  /// a KVM guest). Until the spares land, an epoch that ends is not handed over.
  void prepare(PlanMailbox& mailbox, std::size_t spares, std::size_t capacity);
  /// Hands the epoch recorded in `record` over to the thread prepare() started, and gives
  /// `record` a spare buffer in its place (empty, with capacity). O(1), and the caller never
  /// waits: when the thread holds the mutex (it may be preempted there, at SCHED_IDLE), or every
  /// spare of the mailbox is queued or being planned, nothing happens and it returns false.
  /// `boundaries`: the step boundaries the epoch went on over (EpochPlan::boundaries; not 0 for
  /// a whole run's record, whose buffer the thread writes before it goes back, as a fresh one).
  bool try_hand_over(PlanMailbox& mailbox, std::uint64_t key, std::uint64_t signature,
                     std::vector<RecordedBlock>& record, std::uint32_t boundaries = 0);
  /// Hands over a record made for the purpose (a step's mirror, step_turns.hpp), taken whole:
  /// the thread plans it, and the record comes back to be freed by try_collect(); no spare
  /// buffer changes hands. O(1), never a wait; false (the record left to the caller) when the
  /// thread holds the mutex.
  bool try_hand_over_made(PlanMailbox& mailbox, std::uint64_t key, std::uint64_t signature,
                          std::vector<RecordedBlock>&& record);
  /// The plans finished for `mailbox` since the last call, in order; none when the thread holds
  /// the mutex (they are collected next time): the caller never waits. Frees the made records
  /// the thread has planned.
  std::vector<FinishedPlan> try_collect(PlanMailbox& mailbox);
  /// The places of a spare buffer the thread writes before a heap gets it (the fast path then
  /// takes no page fault filling them): 2.5 MiB, whatever vmm_plan_max_blocks. An epoch longer
  /// than that faults in the rest of a buffer once, the first time it reaches there (1-3 us a
  /// page of about 100 places); writing all of a large capacity would hold the heap's first plans
  /// back on a busy host, where the thread (SCHED_IDLE) gets little time.
  static constexpr std::size_t kResidentBlocks = 65536;
  /// How many spare buffers `mailbox` holds now (tests: the thread puts them there).
  std::size_t spare_buffers(const PlanMailbox& mailbox);
  /// Stops the thread (after the job it is planning); the jobs still queued are dropped, and the
  /// plans released from now on are deleted where they are released.
  void stop();
  /// The plans released on the caller's side that the thread has not deleted yet, and those it
  /// has (tests).
  std::size_t plans_to_delete() const noexcept { return graveyard_->buried(); }
  std::size_t plans_deleted_by_thread() const noexcept { return graveyard_->deleted(); }

 private:
  enum class Work : std::uint8_t {
    plan,           // plan the record, then leave its buffer, cleared, in the mailbox
    plan_and_return,  // plan the record (try_hand_over_made()), then leave it in made_records
    deliver_spare,  // only leave the (empty) buffer in the mailbox
  };
  enum class Pages : std::uint8_t {
    written,  // the pages of the buffer's first kResidentBlocks places have been written
    fresh,    // some may never have been: the thread writes them before the buffer goes back
  };
  struct Job {
    PlanMailbox* mailbox;
    std::uint64_t key;
    std::uint64_t signature;
    std::vector<RecordedBlock> record;
    std::uint32_t boundaries;
    Work work;
    Pages pages;
  };
  void run();

  const std::size_t page_;
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kLookBusy{2};
  static constexpr std::chrono::milliseconds kLookIdle{50};
  static constexpr std::chrono::seconds kBusyFor{1};
  std::chrono::milliseconds look_interval(Clock::time_point now) const noexcept;

  std::mutex mutex_;
  std::condition_variable wake_;  // the thread: stop (only stop() notifies it)
  std::deque<Job> queue_;
  Clock::time_point last_job_{};  // when the thread last took a job
  bool stopping_ = false;
  std::thread thread_;   // started by prepare()
  std::shared_ptr<PlanGraveyard> graveyard_ = std::make_shared<PlanGraveyard>();  // plans hold it too
};

}  // namespace tensorpool::detail

// The background planner (vmm_planner:background, the default): epochs are planned by a thread of
// the allocator's own, and a repeated epoch follows its plan once the plan has arrived, with no
// device call; the free that ends an epoch plans nothing. The synchronous planner's behaviour is
// what test_vmm.cpp's "[plan]" tests pin down (tests/support/deterministic.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "core/util.hpp"
#include "core/vmm_planner.hpp"
#include "support/skip.hpp"
#include "tensorpool/tensorpool.hpp"

#if defined(__linux__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

using namespace tensorpool;

namespace {

Address addr(void* p) { return reinterpret_cast<Address>(p); }

#if defined(__linux__)
// How many of the pages under `bytes` bytes at `p` are not in memory (mincore).
template <class T>
std::size_t pages_not_resident(const T* p, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in_core((end - begin) / page);
  REQUIRE(mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) == 0);
  return static_cast<std::size_t>(std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return (c & 1) == 0; }));
}
#endif

// Waits for the planner thread (which looks at its queue every few milliseconds, at SCHED_IDLE:
// on a host whose cores are busy it may wait long for its turn) until done().
template <class Done>
void wait_until(Done done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done()) {
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// a and b, a freed, c (in a's place when the plan is followed), b and c freed: one epoch.
std::vector<Address> abc_epoch(Allocator& alloc) {
  void* a = alloc.allocate(40 * MiB);
  void* b = alloc.allocate(40 * MiB);
  alloc.deallocate(a);
  void* c = alloc.allocate(60 * MiB);
  const std::vector<Address> at = {addr(a), addr(b), addr(c)};
  alloc.deallocate(b);
  alloc.deallocate(c);
  alloc.check_invariants();
  return at;
}

}  // namespace

TEST_CASE("vmm planner: a repeated epoch follows the plan the thread made, then makes no device call",
          "[vmm][plan][planner]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.event_mode = EventMode::immediate});
  Allocator alloc(device, Config::parse("mode:vmm,vmm_idle_divisor:1"));
  REQUIRE(alloc.config().vmm_planner == PlannerMode::background);
  const Address base = abc_epoch(alloc)[0];
  const std::vector<Address> planned = {base, base + 60 * MiB, base};
  // The plan arrives when the thread has made it: an epoch later at best, later on a busy host
  // (the thread runs at SCHED_IDLE: with more runnable threads than cores it waited more than
  // 2,000 epochs of a millisecond each). So the bound is time, as below, and each try waits for
  // the thread a little longer.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int epochs = 1; abc_epoch(alloc) != planned; ++epochs) {
    INFO("epochs run online: " << epochs);
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(epochs, 20)));
  }
  const DeviceCounters settled = device->counters();
  for (int run = 0; run < 5; ++run) {
    INFO("run " << run);
    REQUIRE(abc_epoch(alloc) == planned);
    REQUIRE(device->counters().maps == settled.maps);
    REQUIRE(device->counters().physical_creates == settled.physical_creates);
    REQUIRE(device->counters().syncs() == settled.syncs());
  }
  alloc.empty_cache();
  REQUIRE(alloc.usage().reserved == 0);
}

TEST_CASE("vmm planner: a step whose kept output moved its base is planned, mirror included, by the thread",
          "[vmm][plan][planner][step]") {
  // test_vmm.cpp's loop whose output, kept over each boundary, takes turns between two places.
  // The synchronous planner plans the second step and its mirror in step(), and the third step
  // follows the mirror. With the planner thread both go to the thread (planning a large step
  // and its mirror in step() held a training loop's thread 100 ms): the third step runs online,
  // and the loop settles on the thread's plans a few steps later.
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.event_mode = EventMode::immediate});
  Allocator alloc(device, Config::parse("mode:vmm,vmm_idle_divisor:1"));
  REQUIRE(alloc.config().vmm_planner == PlannerMode::background);
  void* weights = alloc.allocate(64 * MiB);
  void* out = alloc.allocate(48 * MiB);
  const auto step = [&] {
    void* next = alloc.allocate(48 * MiB);
    std::vector<Address> at = abc_epoch(alloc);
    alloc.deallocate(out);
    out = next;
    at.push_back(addr(out));
    alloc.step();
    alloc.check_invariants();
    return at;
  };
  std::vector<std::vector<Address>> places = {step(), step(), step()};
  // The plans handed over at the second boundary come back at a later one at the earliest.
  REQUIRE(alloc.stats().planned_epochs == 0);
  // Then the steps follow the thread's plans: six in a row with no device call. (The thread runs
  // at SCHED_IDLE: on a host whose cores are busy it may wait long for its turn.)
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int quiet = 0; quiet < 6;) {
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const DeviceCounters before = device->counters();
    const std::uint64_t planned = alloc.stats().planned_epochs;
    places.push_back(step());
    const DeviceCounters now = device->counters();
    const bool no_call = now.maps == before.maps && now.physical_creates == before.physical_creates &&
                         now.syncs() == before.syncs();
    quiet = no_call && alloc.stats().planned_epochs == planned + 1 ? quiet + 1 : 0;
  }
  REQUIRE(alloc.stats().mirrored_steps >= 1);
  // The output takes turns between two places, each base's steps where the steps two before were.
  for (std::size_t i = places.size() - 4; i < places.size(); ++i) {
    INFO("step " << i);
    REQUIRE(places[i] == places[i - 2]);
    REQUIRE(places[i][3] != places[i - 1][3]);
  }
  alloc.deallocate(out);
  alloc.deallocate(weights);
  alloc.empty_cache();
  REQUIRE(alloc.usage().reserved == 0);
}

TEST_CASE("vmm planner: an allocator destroyed while its thread plans loses nothing", "[vmm][plan][planner]") {
  // Many heaps hand large epochs to the thread, and the allocator goes at once: the thread stops
  // after the plan it is making, the queued jobs are dropped, every page goes back.
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.event_mode = EventMode::immediate});
  {
    Allocator alloc(device, Config::parse("mode:vmm"));
    std::vector<Stream> streams;
    for (int i = 0; i < 8; ++i) streams.push_back(device->create_stream());
    for (int round = 0; round < 3; ++round) {
      for (const Stream s : streams) {
        std::vector<void*> blocks;
        for (int i = 0; i < 2000; ++i) blocks.push_back(alloc.allocate(4096 + 512 * (i % 7), s));
        for (std::size_t i = 0; i < blocks.size(); i += 2) alloc.deallocate(blocks[i]);
        for (std::size_t i = 1; i < blocks.size(); i += 2) alloc.deallocate(blocks[i]);
      }
    }
    alloc.check_invariants();
  }
  REQUIRE(device->used_bytes() == 0);
  REQUIRE(device->mapped_bytes() == 0);
}

TEST_CASE("vmm planner: the spare record buffers are in memory before the fast path writes them",
          "[vmm][plan][planner]") {
#if defined(__linux__)
  // An epoch's record is written by the allocations themselves: a page of it touched for the
  // first time would be a page fault inside an allocate (1-3 us, every 102nd allocation).
  constexpr std::size_t kEntries = 8192;  // 320 KiB each: above malloc's mmap threshold
  detail::EpochPlanner planner(2 * MiB);
  detail::PlanMailbox mailbox;
  planner.prepare(mailbox, 2, kEntries);
  // The thread writes them, then leaves them in the mailbox (an ended epoch finds none before).
  wait_until([&] { return planner.spare_buffers(mailbox) == 2; });
  REQUIRE(mailbox.buffers.size() == 2);
  for (const auto& b : mailbox.buffers) {
    REQUIRE(b.empty());
    REQUIRE(b.capacity() >= kEntries);
    REQUIRE(pages_not_resident(b.data(), kEntries * sizeof(detail::RecordedBlock)) == 0);
  }
  // reserve_resident() keeps what the vector held.
  std::vector<detail::RecordedBlock> kept(3, detail::RecordedBlock{.size = 512, .start = 1, .end = 2});
  detail::reserve_resident(kept, kEntries);
  REQUIRE(kept.size() == 3);
  REQUIRE(kept[2].size == 512);
  REQUIRE(kept.capacity() >= kEntries);
  REQUIRE(pages_not_resident(kept.data(), kEntries * sizeof(detail::RecordedBlock)) == 0);
  // A capacity past kResidentBlocks: the thread writes the first kResidentBlocks places only, so
  // that a large vmm_plan_max_blocks does not hold the first plans back.
  constexpr std::size_t kLarge = 4 * detail::EpochPlanner::kResidentBlocks;
#if defined(__GLIBC__)
  // The buffer may come from memory other test cases of this process freed (glibc serves a large
  // block from its free chunks before it maps fresh pages), whose pages were written: those go
  // back to the system first, so that only what the thread writes is resident.
  malloc_trim(0);
#endif
  detail::PlanMailbox large;
  planner.prepare(large, 1, kLarge);
  wait_until([&] { return planner.spare_buffers(large) == 1; });
  const auto& b = large.buffers.front();
  REQUIRE(b.capacity() >= kLarge);
  constexpr std::size_t kWritten = detail::EpochPlanner::kResidentBlocks * sizeof(detail::RecordedBlock);
  REQUIRE(pages_not_resident(b.data(), kWritten) == 0);
  REQUIRE(pages_not_resident(b.data() + 2 * detail::EpochPlanner::kResidentBlocks, kWritten) > 0);
#else
  TP_SKIP("mincore() is Linux's");
#endif
}

TEST_CASE("vmm planner: a plan the thread made is deleted by the thread, wherever its last reference goes",
          "[vmm][plan][planner]") {
  // Its memory is the thread's malloc arena's: freeing it on the caller's path could wait for
  // that arena's lock, held by the thread at SCHED_IDLE.
  detail::EpochPlanner planner(4096);
  detail::PlanMailbox mailbox;
  planner.prepare(mailbox, 2, 64);
  wait_until([&] { return planner.spare_buffers(mailbox) == 2; });
  // An epoch of a and b, b freed, a freed, c (three steps) handed over (which swaps the record
  // for a spare), and its plan collected once the thread has made it.
  std::vector<detail::RecordedBlock> record;
  std::vector<detail::FinishedPlan> finished;
  auto plan_an_epoch = [&](std::uint64_t key) {
    record.assign({{.size = 4096, .start = 0, .end = 3, .recorded = 0},
                   {.size = 4096, .start = 1, .end = 2, .recorded = 4096},
                   {.size = 8192, .start = 4, .end = 5, .recorded = 0}});
    REQUIRE(planner.try_hand_over(mailbox, key, key + 1, record));
    wait_until([&] {
      for (auto& f : planner.try_collect(mailbox)) finished.push_back(std::move(f));
      return !finished.empty();
    });
  };
  plan_an_epoch(1);
  REQUIRE(finished.size() == 1);
  REQUIRE(finished[0].plan->steps.size() == 3);
  REQUIRE(planner.plans_deleted_by_thread() == 0);
  finished.clear();  // the last reference, released here: the thread deletes the plan
  wait_until([&] { return planner.plans_deleted_by_thread() == 1; });
  REQUIRE(planner.plans_to_delete() == 0);

  // Once the thread has stopped, a plan is deleted where it is released (LeakSanitizer would
  // see one left behind).
  plan_an_epoch(3);
  planner.stop();
  finished.clear();
  REQUIRE(planner.plans_to_delete() == 0);
  REQUIRE(planner.plans_deleted_by_thread() == 1);
}

TEST_CASE("vmm planner: a step planned above a block live before its epoch starts its search from that block",
          "[vmm][plan][planner]") {
  // Two fixed blocks (a step's weights) with a hole between them, and steps placed in the hole
  // and above them. A step's search for its free block starts at the block that ends closest
  // below it while it lives: a step's, or a fixed one's (found by its address, so that a step
  // above the base does not walk the heap's blocks from its start).
  constexpr std::size_t kPage = 4096;
  const std::vector<detail::RecordedBlock> record = {
      {.size = kPage, .start = 1, .end = 3, .recorded = 3 * kPage},
      {.size = 2 * kPage, .start = 2, .end = 5, .recorded = 4 * kPage},
      {.size = kPage, .start = 3, .end = 6, .recorded = kPage},
      {.size = kPage, .start = 4, .end = 6, .recorded = 6 * kPage},
      {.size = kPage, .start = 0, .end = 7, .recorded = 0, .fixed = true},
      {.size = kPage, .start = 0, .end = 7, .recorded = 2 * kPage, .fixed = true},
  };
  const std::size_t steps = 4;
  const std::shared_ptr<const detail::EpochPlan> plan = detail::make_epoch_plan(record, kPage);
  REQUIRE(plan);
  REQUIRE(plan->steps.size() == steps);
  std::size_t anchored_on_fixed = 0;
  for (std::size_t i = 0; i < steps; ++i) {
    const detail::EpochPlan::Step& s = plan->steps[i];
    // The block that ends closest below step i's offset among those alive when it is allocated.
    std::size_t best_end = 0;
    std::size_t expected = detail::PlannedLayout::kNone;
    for (std::size_t j = 0; j < record.size(); ++j) {
      const bool alive = record[j].start <= record[i].start && record[i].start < record[j].end && j != i;
      const std::size_t offset = record[j].fixed ? record[j].recorded : plan->steps[j].offset;
      if (!alive || offset + record[j].size > s.offset || offset + record[j].size < best_end) continue;
      best_end = offset + record[j].size;
      expected = j;
    }
    INFO("step " << i << " at " << s.offset);
    if (expected == detail::PlannedLayout::kNone) {
      CHECK(s.below == detail::PlannedLayout::kNone);
    } else if (record[expected].fixed) {
      REQUIRE(s.below >= steps);
      REQUIRE(s.below - steps < plan->fixed_anchors.size());
      CHECK(plan->fixed_anchors[s.below - steps] == record[expected].recorded);
      ++anchored_on_fixed;
    } else {
      CHECK(s.below == expected);
    }
  }
  CHECK(anchored_on_fixed >= 2);
  // One anchor per fixed block, however many steps start their search there.
  std::vector<std::size_t> anchors = plan->fixed_anchors;
  std::sort(anchors.begin(), anchors.end());
  CHECK(std::adjacent_find(anchors.begin(), anchors.end()) == anchors.end());
}

TEST_CASE("vmm planner: a chain of predicted steps is planned a step ahead by the thread", "[vmm][plan][planner]") {
  // test_vmm.cpp's loop whose optimizer makes its four states anew every step (a chain: no
  // mirror). A prediction planned by the thread at the boundary before its step would come back
  // a step late, for a base that has moved. So the chain's first prediction is planned in
  // step(), on the program's thread (Stats::plans_on_caller), and the thread plans each step after
  // the next one from the plan the next one follows (plan_ahead()): a step that follows a
  // prediction nobody planned on its thread. The thread runs at SCHED_IDLE: on a host whose cores
  // are busy it may not have planned ahead by the next boundary (that step's prediction is then
  // planned in step() again), so the loop is run afresh (its chain settles on recurring bases
  // within a few steps) until the runs have shown two such steps in all.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int planned_ahead = 0;  // quiet steps that followed a prediction the thread made
  for (int run = 0; planned_ahead < 2; ++run) {
    INFO("run " << run);
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.event_mode = EventMode::immediate});
    Allocator alloc(device, Config::parse("mode:vmm"));
    REQUIRE(alloc.config().vmm_planner == PlannerMode::background);
    void* weights = alloc.allocate(64 * MiB);
    std::vector<void*> states = {alloc.allocate(20 * MiB), alloc.allocate(20 * MiB), alloc.allocate(20 * MiB),
                                 alloc.allocate(20 * MiB)};
    for (int i = 0; i < 8; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const DeviceCounters before = device->counters();
      const Stats was = alloc.stats();
      abc_epoch(alloc);
      for (void*& state : states) {
        void* next = alloc.allocate(20 * MiB);
        alloc.deallocate(alloc.allocate(12 * MiB));
        alloc.deallocate(state);
        state = next;
      }
      alloc.step();
      alloc.check_invariants();
      const DeviceCounters now = device->counters();
      const Stats is = alloc.stats();
      const bool quiet = now.physical_creates == before.physical_creates && now.maps == before.maps &&
                         now.syncs() == before.syncs();
      if (quiet && is.planned_epochs == was.planned_epochs + 1 && is.predicted_steps > was.predicted_steps &&
          is.plans_on_caller == was.plans_on_caller)
        ++planned_ahead;
    }
    REQUIRE(alloc.stats().plans_on_caller >= 1);  // the chain's first, in step()
    REQUIRE(alloc.stats().mirrored_steps == 0);
    for (void* state : states) alloc.deallocate(state);
    alloc.deallocate(weights);
    alloc.empty_cache();
    REQUIRE(alloc.usage().reserved == 0);
  }
}

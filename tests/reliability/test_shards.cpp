// Threads on different streams (src/core/shards.hpp): each stream's shard runs the fast path
// under its own lock, and the statistics stay exact: the peaks of the sums over shards, never
// above what the program really reached nor below it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "tensorpool/size_classes.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

Config settings(const char* mode) { return Config::parse(std::string("mode:") + mode); }

// What the test knows of every live block, to compute the exact values of the statistics.
struct Held {
  void* ptr;
  std::size_t bytes;
};

struct Expected {
  std::array<std::int64_t, kNumPools + 1> requested{};    // per pool, then the total
  std::array<std::int64_t, kNumPools + 1> allocations{};
  std::array<std::int64_t, kNumPools + 1> requested_peak{};
  std::array<std::int64_t, kNumPools + 1> allocations_peak{};

  void change(std::size_t pool, std::int64_t bytes, std::int64_t count) {
    for (const std::size_t row : {pool, std::size_t{kNumPools}}) {
      requested[row] += bytes;
      allocations[row] += count;
      requested_peak[row] = std::max(requested_peak[row], requested[row]);
      allocations_peak[row] = std::max(allocations_peak[row], allocations[row]);
    }
  }
};

std::size_t pool_of(const Allocator& a, std::size_t bytes) {
  return round_size(bytes) <= a.config().small_size ? static_cast<std::size_t>(Pool::small)
                                                    : static_cast<std::size_t>(Pool::large);
}

void check_peaks(const Allocator& a, const Expected& e) {
  const Stats st = a.stats();
  for (std::size_t row = 0; row <= kNumPools; ++row) {
    const PoolStats& ps = row == kNumPools ? st.total : st.pool[row];
    INFO("row " << row);
    CHECK(ps[Metric::requested_bytes].current == e.requested[row]);
    CHECK(ps[Metric::allocations].current == e.allocations[row]);
    CHECK(ps[Metric::requested_bytes].peak == e.requested_peak[row]);
    CHECK(ps[Metric::allocations].peak == e.allocations_peak[row]);
  }
}

// Two threads, each on its own stream, take turns (one operation each, strictly alternating), so
// the program's history is one known sequence and its peaks are known exactly; both threads run
// their own shard's fast path most of the time.
void alternate(const char* mode) {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 64 * GiB});
  Allocator alloc(device, settings(mode));
  const std::array<Stream, 2> streams = {device->create_stream(), device->create_stream()};
  Expected expected;
  std::atomic<int> turn{0};
  std::atomic<std::uint64_t> allocations{0};
  constexpr int kSteps = 3000;
  auto run = [&](int me) {
    std::mt19937_64 rng(41 + static_cast<std::uint64_t>(me));
    std::vector<Held> mine;
    for (int step = me; step < kSteps; step += 2) {
      while (turn.load(std::memory_order_acquire) != step) std::this_thread::yield();
      const bool grow = mine.empty() || rng() % 100 < (me == 0 ? 55 : 45);
      if (grow) {
        const std::size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 8 * MiB : 64 * KiB);
        mine.push_back({alloc.allocate(bytes, streams[static_cast<std::size_t>(me)]), bytes});
        ++allocations;
        expected.change(pool_of(alloc, bytes), static_cast<std::int64_t>(bytes), 1);
      } else {
        const std::size_t i = rng() % mine.size();
        alloc.deallocate(mine[i].ptr);
        expected.change(pool_of(alloc, mine[i].bytes), -static_cast<std::int64_t>(mine[i].bytes), -1);
        mine[i] = mine.back();
        mine.pop_back();
      }
      if (step == kSteps / 2) {  // peaks start again from the current values
        alloc.reset_peaks();
        expected.requested_peak = expected.requested;
        expected.allocations_peak = expected.allocations;
      }
      turn.store(step + 1, std::memory_order_release);
    }
    while (turn.load(std::memory_order_acquire) != kSteps + me) std::this_thread::yield();
    for (const Held& h : mine) {
      alloc.deallocate(h.ptr);
      expected.change(pool_of(alloc, h.bytes), -static_cast<std::int64_t>(h.bytes), -1);
    }
    turn.store(kSteps + me + 1, std::memory_order_release);
  };
  std::thread a(run, 0);
  std::thread b(run, 1);
  a.join();
  b.join();
  alloc.check_invariants();  // every shard at or below its ceilings, which sum to at most the peak
  check_peaks(alloc, expected);
  CHECK(alloc.stats().alloc_calls == allocations.load());
  CHECK(alloc.stats().free_calls == allocations.load());
}

}  // namespace

TEST_CASE("shards: two threads taking turns on their own streams get the exact peaks", "[allocator][threads]") {
  SECTION("fixed") { alternate("fixed"); }
  SECTION("vmm") { alternate("vmm"); }
}

TEST_CASE("shards: blocks held at once by two threads count in one peak", "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(device, settings("fixed"));
  const std::array<Stream, 2> streams = {device->create_stream(), device->create_stream()};
  // Warm both shards' caches, one thread at a time: the peak is one block's.
  for (const Stream s : streams) alloc.deallocate(alloc.allocate(3 * MiB, s));
  CHECK(alloc.stats().total[Metric::requested_bytes].peak == 3 * MiB);
  // Both hold a block at the same time: the peak is the sum, though each call found its block in
  // its own shard's cache.
  std::atomic<int> holding{0};
  auto hold = [&](std::size_t i) {
    void* p = alloc.allocate(3 * MiB, streams[i]);
    ++holding;
    while (holding.load() < 2) std::this_thread::yield();
    alloc.deallocate(p);
  };
  std::thread a(hold, 0);
  std::thread b(hold, 1);
  a.join();
  b.join();
  const Stats st = alloc.stats();
  CHECK(st.total[Metric::requested_bytes].peak == 6 * MiB);
  CHECK(st.total[Metric::allocations].peak == 2);
  CHECK(st.total[Metric::requested_bytes].current == 0);
  alloc.check_invariants();
}

TEST_CASE("shards: a block freed by another thread, on another stream's shard", "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(device, settings("vmm"));
  const Stream mine = device->create_stream();
  const Stream theirs = device->create_stream();
  void* p = alloc.allocate(1 * MiB, mine);
  std::thread other([&] {
    alloc.deallocate(alloc.allocate(2 * MiB, theirs));  // this thread's last stream is `theirs`
    alloc.deallocate(p);                                // mapped by `mine`'s shard
    CHECK_THROWS_AS(alloc.deallocate(p), UsageError);   // and now by none
  });
  other.join();
  alloc.check_invariants();
  CHECK(alloc.usage().allocated == 0);
  CHECK(alloc.stats().free_calls == 2);
}

TEST_CASE("shards: threads hammering their own streams keep every count", "[allocator][threads]") {
  for (const char* mode : {"fixed", "vmm"}) {
    auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 16 * GiB});
    Allocator alloc(device, settings(mode));
    constexpr int kThreads = 4;
    constexpr int kPairs = 20000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const Stream s = t == 0 ? kDefaultStream : device->create_stream();
        std::vector<void*> held;
        for (int i = 0; i < kPairs; ++i) {
          held.push_back(alloc.allocate(static_cast<std::size_t>(512 * (1 + (i * 13 + t) % 5000)), s));
          if (held.size() > 8) {
            alloc.deallocate(held.front());
            held.erase(held.begin());
          }
        }
        for (void* p : held) alloc.deallocate(p);
      });
    }
    for (auto& th : threads) th.join();
    INFO(mode);
    alloc.check_invariants();
    const Stats st = alloc.stats();
    CHECK(st.alloc_calls == kThreads * kPairs);
    CHECK(st.free_calls == kThreads * kPairs);
    CHECK(st.total[Metric::allocations].current == 0);
    CHECK(st.total[Metric::allocations].peak >= 9);
    CHECK(st.total[Metric::allocations].peak <= kThreads * 9);
  }
}

TEST_CASE("shards: a second stream joins after the first set its peak alone", "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(device, settings("fixed"));
  const Stream first = device->create_stream();
  // One stream alone: its shard's own counters keep the peak (no ceilings).
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(alloc.allocate(4 * MiB, first));
  for (int i = 0; i < 6; ++i) {
    alloc.deallocate(held.back());
    held.pop_back();
  }
  CHECK(alloc.stats().total[Metric::requested_bytes].peak == 32 * MiB);
  // Another stream, on another thread: the peak counts both, and only past the old one.
  std::thread other([&] {
    const Stream second = device->create_stream();
    void* a = alloc.allocate(20 * MiB, second);  // 8 + 20 MiB: below the peak
    CHECK(alloc.stats().total[Metric::requested_bytes].peak == 32 * MiB);
    void* b = alloc.allocate(8 * MiB, second);   // 36 MiB: a new peak
    alloc.deallocate(a);
    alloc.deallocate(b);
  });
  other.join();
  CHECK(alloc.stats().total[Metric::requested_bytes].peak == 36 * MiB);
  CHECK(alloc.stats().total[Metric::allocations].peak == 8);
  alloc.check_invariants();
  for (void* p : held) alloc.deallocate(p);
  alloc.reset_peaks();
  CHECK(alloc.stats().total[Metric::requested_bytes].peak == 0);
  alloc.check_invariants();
}

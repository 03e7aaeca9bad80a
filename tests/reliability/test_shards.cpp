// Threads on different streams (src/core/shards.hpp): each stream's shard runs the fast path
// under its own lock, and the statistics stay exact: the peaks of the sums over shards, never
// above what the program really reached nor below it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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

// How two threads take turns (take_turns()).
struct Turns {
  enum class Streams { own, one };
  Streams streams;
  int steps;
  std::uint64_t seed;
  bool (*grows)(int me, std::size_t held, std::mt19937_64& rng);  // else it frees a block it holds
  std::size_t (*bytes)(std::mt19937_64& rng);
  bool reset_peaks_halfway = false;
  int check_every = 0;  // turns between invariant checks (0: only at the end)
};

// Two threads take turns (one operation each, strictly alternating), so the program's history is
// one known sequence and its peaks are known exactly; each runs its shard's fast path most of the
// time. On streams of their own, each has its own shard; on one stream they share it, and their
// blocks are often freed beside a free twin the other freed (seams, shards.hpp), whose invariants
// check_invariants() checks as the fast paths left them.
void take_turns(const char* mode, const Turns& turns) {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 64 * GiB});
  Allocator alloc(device, settings(mode));
  const std::array<Stream, 2> streams = turns.streams == Turns::Streams::own
                                            ? std::array<Stream, 2>{device->create_stream(), device->create_stream()}
                                            : std::array<Stream, 2>{kDefaultStream, kDefaultStream};
  Expected expected;
  std::atomic<int> turn{0};
  std::atomic<std::uint64_t> allocations{0};
  auto run = [&](int me) {
    std::mt19937_64 rng(turns.seed + static_cast<std::uint64_t>(me));
    std::vector<Held> mine;
    for (int step = me; step < turns.steps; step += 2) {
      while (turn.load(std::memory_order_acquire) != step) std::this_thread::yield();
      if (turns.grows(me, mine.size(), rng)) {
        const std::size_t bytes = turns.bytes(rng);
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
      if (turns.reset_peaks_halfway && step == turns.steps / 2) {  // peaks start again from the current values
        alloc.reset_peaks();
        expected.requested_peak = expected.requested;
        expected.allocations_peak = expected.allocations;
      }
      if (turns.check_every != 0 && step % turns.check_every == 0) alloc.check_invariants();
      turn.store(step + 1, std::memory_order_release);
    }
    while (turn.load(std::memory_order_acquire) != turns.steps + me) std::this_thread::yield();
    for (const Held& h : mine) {
      alloc.deallocate(h.ptr);
      expected.change(pool_of(alloc, h.bytes), -static_cast<std::int64_t>(h.bytes), -1);
    }
    turn.store(turns.steps + me + 1, std::memory_order_release);
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

// Each on a stream of its own: blocks of any size up to 8 MiB, peaks reset halfway.
void alternate(const char* mode) {
  take_turns(mode, {.streams = Turns::Streams::own,
                    .steps = 3000,
                    .seed = 41,
                    .grows = [](int me, std::size_t held, std::mt19937_64& rng) {
                      return held == 0 || rng() % 100 < (me == 0 ? 55u : 45u);
                    },
                    .bytes = [](std::mt19937_64& rng) -> std::size_t {
                      return 1 + rng() % (rng() % 4 == 0 ? 8 * MiB : 64 * KiB);
                    },
                    .reset_peaks_halfway = true});
}

// On one stream: blocks of three sizes (twins are common), invariants every 16 turns.
void alternate_on_one_stream(const char* mode) {
  take_turns(mode, {.streams = Turns::Streams::one,
                    .steps = 4000,
                    .seed = 7,
                    .grows = [](int, std::size_t held, std::mt19937_64& rng) {
                      return held == 0 || (held < 6 && rng() % 2 == 0);
                    },
                    .bytes = [](std::mt19937_64& rng) -> std::size_t {
                      constexpr std::array<std::size_t, 3> kSizes = {MiB, 2 * MiB, 64 * MiB};
                      return kSizes[rng() % kSizes.size()];
                    },
                    .check_every = 16});
}

// A thread that runs what it is given, one job at a time, while the caller waits: a test can
// interleave the calls of several threads in an order it chooses, each thread keeping its own
// thread-local state (its fast path's stream cache, the identity a seam compares) from job to job.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    run(nullptr);
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  /// Runs job on the worker and returns when it is done (null: the worker stops).
  void run(std::function<void()> job) {
    std::unique_lock lock(mutex_);
    job_ = std::move(job);
    pending_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return !pending_; });
  }

 private:
  void loop() {
    for (;;) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return pending_; });
      const bool stop = !job_;
      if (job_) job_();
      pending_ = false;
      changed_.notify_all();
      if (stop) return;
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool pending_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

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

TEST_CASE("shards: a block freed beside its free twin from another thread is kept apart for the next request of its size",
          "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(device, settings("fixed"));  // 2 MiB blocks, one after another in a 20 MiB segment
  Worker a;
  Worker b;
  void* lower = nullptr;
  void* upper = nullptr;
  a.run([&] { lower = alloc.allocate(2 * MiB); });
  b.run([&] { upper = alloc.allocate(2 * MiB); });
  void* gap = alloc.allocate(2 * MiB);
  void* lone = alloc.allocate(2 * MiB);  // an exact fit elsewhere, for the request below
  void* top = alloc.allocate(2 * MiB);
  const auto offset = [&](void* p) {
    return reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(lower);
  };
  REQUIRE(offset(upper) == 2 * MiB);
  REQUIRE(offset(gap) == 4 * MiB);
  REQUIRE(offset(lone) == 6 * MiB);
  REQUIRE(offset(top) == 8 * MiB);
  alloc.deallocate(lone);  // free, between two live blocks
  a.run([&] { alloc.deallocate(lower); });
  b.run([&] { alloc.deallocate(upper); });  // beside `lower`, which the other thread freed: kept apart
  alloc.check_invariants();                 // as the fast path left it
  // Merged, the two would make a 4 MiB block, and a 2 MiB request would get `lone` (an exact fit,
  // in its own bin); kept apart, it gets `lower` whole.
  void* p = alloc.allocate(2 * MiB);
  CHECK(p == lower);
  alloc.check_invariants();
  // A block handed out from a seam keeps the seam when freed, whoever frees it.
  alloc.deallocate(p);
  alloc.check_invariants();
  CHECK(alloc.allocate(2 * MiB) == lower);
  alloc.deallocate(lower);
  // Any other request merges the two first: 4 MiB fits where they lie.
  void* both = alloc.allocate(4 * MiB);
  CHECK(both == lower);
  alloc.check_invariants();
  alloc.deallocate(both);
  alloc.deallocate(gap);
  a.run([&] { alloc.deallocate(alloc.allocate(6 * MiB)); });  // the merged 6 MiB at `lower`
  alloc.deallocate(top);
  const Stats st = alloc.stats();
  CHECK(st.total[Metric::allocations].current == 0);
  CHECK(st.alloc_calls == 9);
  CHECK(st.free_calls == 9);
  CHECK(alloc.fragmentation().free_blocks == 1);  // the segment, whole again
  alloc.check_invariants();
}

TEST_CASE("shards: a free that merges with a twin freed by the same thread keeps no seam", "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(device, settings("fixed"));
  void* lower = alloc.allocate(2 * MiB);
  void* upper = alloc.allocate(2 * MiB);
  void* gap = alloc.allocate(2 * MiB);
  void* lone = alloc.allocate(2 * MiB);
  void* top = alloc.allocate(2 * MiB);
  alloc.deallocate(lone);
  alloc.deallocate(lower);
  alloc.deallocate(upper);  // one thread: merged at once, as always
  CHECK(alloc.allocate(2 * MiB) == lone);
  for (void* q : {gap, lone, top}) alloc.deallocate(q);
  CHECK(alloc.fragmentation().free_blocks == 1);
  alloc.check_invariants();
}

TEST_CASE("shards: two threads taking turns on one stream keep every count and invariant", "[allocator][threads]") {
  SECTION("fixed") { alternate_on_one_stream("fixed"); }
  SECTION("vmm") { alternate_on_one_stream("vmm"); }
}

TEST_CASE("shards: two threads' blocks in a vmm heap that no longer records are kept apart too", "[allocator][threads]") {
  auto device = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.capacity = 8 * GiB, .event_mode = EventMode::immediate});
  Allocator alloc(device, Config::parse("vmm_planner:synchronous"));
  Worker a;
  Worker b;
  void* first = nullptr;
  void* second = nullptr;
  const auto both_then_free = [&] {
    a.run([&] { first = alloc.allocate(64 * MiB); });
    b.run([&] { second = alloc.allocate(64 * MiB); });
    a.run([&] { alloc.deallocate(first); });
    b.run([&] { alloc.deallocate(second); });  // beside the other thread's free block
  };
  // Epochs of one block that repeat: the heap gives back the pages above one block and stops
  // recording (vmm.md, "Planned layouts", 5 and 6); two blocks map them again, and from then on it
  // keeps them.
  for (int warm = 0; warm < 2; ++warm) {
    both_then_free();
    for (int i = 0; i < 16; ++i) a.run([&] { alloc.deallocate(alloc.allocate(64 * MiB)); });
  }
  const std::uint64_t maps = device->counters().maps;
  for (int round = 0; round < 32; ++round) {
    both_then_free();
    REQUIRE(std::max(first, second) == static_cast<char*>(std::min(first, second)) + 64 * MiB);
    alloc.check_invariants();  // as the fast paths left it
    void* lower = std::min(first, second);
    a.run([&] {
      for (int i = 0; i < 4; ++i) {
        void* p = alloc.allocate(64 * MiB);
        CHECK(p == lower);
        alloc.deallocate(p);
      }
    });
    alloc.check_invariants();
  }
  CHECK(device->counters().maps == maps);  // the pairs ran on the pages the heap holds
  void* whole = alloc.allocate(128 * MiB);  // the two merged: where they lay
  CHECK(whole == std::min(first, second));
  alloc.deallocate(whole);
  CHECK(device->counters().maps == maps);
  CHECK(alloc.stats().total[Metric::allocations].current == 0);
  alloc.check_invariants();
}

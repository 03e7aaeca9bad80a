// Multi-threaded stress test of one allocator: worker threads allocate, free (their own blocks
// and blocks handed over by other threads), call record_stream and read statistics, while one
// more thread completes stream work on the simulated device and injects upstream faults. Both
// modes. A shared registry (its own mutex) checks that live blocks never overlap; at the end
// everything is freed and nothing may remain reserved. A second case captures CUDA graphs on one
// stream (graph pools) while other threads allocate and free on theirs, some of their blocks
// used on the captured stream. A third has each thread repeat a step of its own on its own
// stream with vmm_find_steps (the finders side by side, one stream's boundaries made in the
// exclusive mode). Labelled `stress`: brief in the normal
// suite, the test the tsan preset runs (make test-tsan, with test_shards.cpp) to look for data
// races.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

// The allocator warns on every injected event fault (the tests check them instead). Set before
// main(): the library reads the level once, on its first log call. A user's setting wins.
[[maybe_unused]] const int quiet_logs = setenv("TENSORPOOL_LOG_LEVEL", "error", 0);

constexpr int kWorkers = 4;
constexpr int kOpsPerWorker = 50000;

struct Held {
  void* ptr;
  std::size_t bytes;
};

// Live blocks of every thread: overlapping blocks would mean two threads own the same memory.
class Registry {
 public:
  bool add(void* p, std::size_t bytes) {
    const auto a = reinterpret_cast<Address>(p);
    std::lock_guard lock(mutex_);
    auto next = live_.lower_bound(a);
    if (next != live_.end() && next->first < a + bytes) return false;
    if (next != live_.begin() && std::prev(next)->second > a) return false;
    live_.emplace(a, a + bytes);
    return true;
  }
  void remove(void* p) {
    std::lock_guard lock(mutex_);
    live_.erase(reinterpret_cast<Address>(p));
  }
  // Blocks handed from one thread to another (freed by the receiver).
  void hand_over(Held h) {
    std::lock_guard lock(mutex_);
    handed_.push_back(h);
  }
  bool take_handed(Held& out) {
    std::lock_guard lock(mutex_);
    if (handed_.empty()) return false;
    out = handed_.back();
    handed_.pop_back();
    return true;
  }

 private:
  std::mutex mutex_;
  std::map<Address, Address> live_;
  std::vector<Held> handed_;
};

struct Shared {
  std::shared_ptr<SimulatedDevice> sim;
  std::unique_ptr<Allocator> alloc;
  std::vector<Stream> streams;
  Registry registry;
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> ops{0};
  std::mutex message_mutex;
  std::string message;

  void fail(const std::string& what) {
    std::lock_guard lock(message_mutex);
    if (!failed.exchange(true)) message = what;
  }
};

std::size_t stress_size(std::mt19937_64& rng) {
  const auto r = rng() % 100;
  if (r < 70) return 1 + rng() % (512 * KiB);
  if (r < 95) return 512 * KiB + rng() % (8 * MiB);
  return 8 * MiB + rng() % (48 * MiB);
}

void release(Shared& s, const Held& h) {
  s.registry.remove(h.ptr);  // before the free: the block may be handed out again at once
  s.alloc->deallocate(h.ptr);
}

void worker_step(Shared& s, std::mt19937_64& rng, std::vector<Held>& mine) {
  const auto r = rng() % 100;
  const Stream stream = s.streams[rng() % s.streams.size()];
  if (r < 42 || mine.empty()) {
    const std::size_t bytes = stress_size(rng);
    try {
      void* p = s.alloc->allocate(bytes, stream);
      if (!s.registry.add(p, bytes)) s.fail("overlapping blocks at " + std::to_string(reinterpret_cast<Address>(p)));
      mine.push_back({p, bytes});
    } catch (const OutOfMemoryError&) {
      ++s.ooms;
    }
  } else if (r < 82) {  // slightly more frees than allocations: pressure comes and goes
    const std::size_t i = rng() % mine.size();
    release(s, mine[i]);
    mine[i] = mine.back();
    mine.pop_back();
  } else if (r < 88) {
    s.alloc->record_stream(mine[rng() % mine.size()].ptr, stream);
  } else if (r < 92) {  // handed over less often than taken: handed blocks do not pile up
    const std::size_t i = rng() % mine.size();
    s.registry.hand_over(mine[i]);
    mine[i] = mine.back();
    mine.pop_back();
  } else if (r < 97) {
    Held h;
    if (s.registry.take_handed(h)) release(s, h);
  } else if (r < 98) {
    s.alloc->empty_cache();
  } else {
    const Stats st = s.alloc->stats();
    if (st.total[Metric::reserved_bytes].current < st.total[Metric::allocated_bytes].current)
      s.fail("reserved below allocated");
    (void)s.alloc->fragmentation();
  }
}

void worker(Shared& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Held> mine;
  try {
    for (int i = 0; i < kOpsPerWorker && !s.failed; ++i) {
      worker_step(s, rng, mine);
      ++s.ops;
    }
    for (const Held& h : mine) release(s, h);
  } catch (const std::exception& e) {
    s.fail(std::string("worker: ") + e.what());
  }
}

// Completes stream work in random order and now and then fails an upstream allocation (an
// OutOfMemoryError for the worker that meets it) until the workers are done. It pauses between
// steps: the device's work completes concurrently with the workers, without starving them.
void device_thread(Shared& s, const std::atomic<bool>& stop, bool vmm) {
  std::mt19937_64 rng(7);
  while (!stop) {
    const auto r = rng() % 100;
    if (r < 80) s.sim->complete_stream(s.streams[rng() % s.streams.size()]);
    else if (r < 90) s.sim->complete_all();
    else if (r < 92) s.sim->fail_nth(vmm ? FaultSite::physical_create : FaultSite::segment_alloc, 1 + rng() % 8);
    else if (r < 95) s.alloc->check_invariants();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void stress(const char* config) {
  Shared s;
  s.sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB});
  const Config c = Config::parse(config);
  s.alloc = std::make_unique<Allocator>(s.sim, c);
  s.streams = {kDefaultStream, s.sim->create_stream(), s.sim->create_stream(), s.sim->create_stream()};
  std::atomic<bool> stop{false};
  std::thread device([&] { device_thread(s, stop, c.mode == Mode::vmm); });
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; ++i) workers.emplace_back([&s, i] { worker(s, 100 + static_cast<std::uint64_t>(i)); });
  for (auto& t : workers) t.join();
  stop = true;
  device.join();
  Held h;
  while (s.registry.take_handed(h)) release(s, h);
  INFO(s.message);
  REQUIRE_FALSE(s.failed);
  s.sim->fail_nth(c.mode == Mode::vmm ? FaultSite::physical_create : FaultSite::segment_alloc, 0);
  s.sim->complete_all();
  s.alloc->empty_cache();
  s.alloc->check_invariants();
  CHECK(s.alloc->usage().allocated == 0);
  CHECK(s.alloc->usage().reserved == 0);
  CHECK(s.sim->used_bytes() == 0);
  std::printf("stress [%s]: %d workers, %llu ops, %llu OOMs\n", config, kWorkers,
              static_cast<unsigned long long>(s.ops.load()), static_cast<unsigned long long>(s.ooms.load()));
}

}  // namespace

TEST_CASE("stress: threads on one allocator, fixed mode", "[stress]") { stress("mode:fixed,memory_limit:256MiB"); }

TEST_CASE("stress: threads on one allocator, vmm mode", "[stress]") { stress("mode:vmm,memory_limit:256MiB"); }

namespace {

// Each worker repeats one step of its own (80 to 120 allocations of fixed sizes, most freed
// within the step) on a stream of its own, with vmm_find_steps: the finders of the streams run
// side by side under their shards' locks, the first to find a step makes the boundaries (in the
// exclusive mode, before its stream's next allocation), the others stop looking; the device
// thread completes work and checks the invariants meanwhile.
void stepping_worker(Shared& s, Stream stream, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> step(80 + rng() % 41);
  for (std::size_t& bytes : step) bytes = stress_size(rng);
  try {
    for (int run = 0; run < 60 && !s.failed; ++run) {
      std::vector<Held> live;
      for (std::size_t i = 0; i < step.size(); ++i) {
        void* p = s.alloc->allocate(step[i], stream);
        if (!s.registry.add(p, step[i])) s.fail("overlapping blocks");
        live.push_back({p, step[i]});
        if (i % 3 == 2) {  // two of three freed at once, in the same order every step
          release(s, live[live.size() - 2]);
          live.erase(live.end() - 2);
        }
        ++s.ops;
      }
      for (const Held& h : live) release(s, h);
    }
  } catch (const std::exception& e) {
    s.fail(std::string("stepping worker: ") + e.what());
  }
}

}  // namespace

TEST_CASE("stress: threads that repeat their steps on streams of their own, steps found", "[stress]") {
  Shared s;
  s.sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB});
  s.alloc = std::make_unique<Allocator>(s.sim, Config::parse("mode:vmm,vmm_find_steps:true"));
  s.streams = {kDefaultStream, s.sim->create_stream(), s.sim->create_stream(), s.sim->create_stream()};
  std::atomic<bool> stop{false};
  std::thread device([&] {
    while (!stop) {
      s.sim->complete_all();
      s.alloc->check_invariants();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; ++i)
    workers.emplace_back([&s, i] { stepping_worker(s, s.streams[static_cast<std::size_t>(i)], 300 + static_cast<std::uint64_t>(i)); });
  for (auto& t : workers) t.join();
  stop = true;
  device.join();
  INFO(s.message);
  REQUIRE_FALSE(s.failed);
  const std::uint64_t found = s.alloc->stats().steps_found;
  CHECK(found > 0);
  s.sim->complete_all();
  s.alloc->empty_cache();
  s.alloc->check_invariants();
  CHECK(s.alloc->usage().reserved == 0);
  std::printf("stress [steps found]: %d workers, %llu ops, %llu boundaries found\n", kWorkers,
              static_cast<unsigned long long>(s.ops.load()), static_cast<unsigned long long>(found));
}

namespace {

// One thread begins and ends captures on its stream, allocating and freeing inside each from a
// new or a shared graph pool and releasing pools; the others allocate and free on their own
// streams (the fast path steps aside during captures), some blocks also used on the captured
// stream (their frees then wait for the capture's end for an event).
void stress_captures(const char* config) {
  auto sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB,
                                                                      .event_mode = EventMode::immediate});
  Allocator alloc(sim, Config::parse(config));
  const Stream captured = sim->create_stream();
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::atomic<int> ooms{0};
  std::thread capturer([&] {
    std::mt19937_64 rng(3);
    std::vector<GraphPool> pools;
    try {
      for (int round = 0; round < 300; ++round) {
        if (pools.empty() || rng() % 3 == 0) {
          pools.push_back(alloc.begin_capture(captured, 8 * MiB));
        } else {
          alloc.begin_capture(captured, pools.back());
        }
        std::vector<void*> held;
        for (int i = 0; i < 20; ++i) {
          try {
            held.push_back(alloc.allocate(1 + rng() % (512 * KiB), captured));
          } catch (const GraphPoolExhaustedError&) {
          }
          if (held.size() > 4 && rng() % 2 == 0) {
            alloc.deallocate(held.front());
            held.erase(held.begin());
          }
        }
        alloc.end_capture(captured);
        for (void* p : held) alloc.deallocate(p);
        if (pools.size() > 2) {
          alloc.release_graph(pools.front());
          pools.erase(pools.begin());
        }
      }
      for (GraphPool p : pools) alloc.release_graph(p);
    } catch (const std::exception& e) {
      std::printf("capturer: %s\n", e.what());
      failed = true;
    }
    stop = true;
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(w) + 10);
      const Stream own = sim->create_stream();
      std::vector<void*> held;
      try {
        while (!stop) {
          if (held.size() < 16) {
            void* p = nullptr;
            try {
              p = alloc.allocate(1 + rng() % (2 * MiB), own);
            } catch (const OutOfMemoryError&) {
              // While a capture is underway no event may be queried (graphs.md), so the frees
              // of blocks used on the captured stream wait for its end; a capturer preempted
              // inside a capture (one core, a slow build) can leave them waiting until the
              // device is full. Give back what this thread holds and go on.
              ++ooms;
              for (void* q : held) alloc.deallocate(q);
              held.clear();
              std::this_thread::yield();
              continue;
            }
            if (rng() % 8 == 0) alloc.record_stream(p, captured);
            held.push_back(p);
          } else {
            const auto i = static_cast<std::ptrdiff_t>(rng() % held.size());
            alloc.deallocate(held[static_cast<std::size_t>(i)]);
            held.erase(held.begin() + i);
          }
        }
      } catch (const std::exception& e) {
        std::printf("worker: %s\n", e.what());
        failed = true;
      }
      for (void* p : held) alloc.deallocate(p);
    });
  }
  capturer.join();
  for (auto& t : workers) t.join();
  REQUIRE_FALSE(failed);
  INFO(ooms << " out-of-memory errors of the workers while captures were underway");
  CHECK(alloc.graph_pools().empty());
  alloc.empty_cache();
  alloc.check_invariants();
  CHECK(alloc.usage().allocated == 0);
  CHECK(alloc.usage().reserved == 0);
}

}  // namespace

TEST_CASE("stress: graph captures beside other threads, fixed mode", "[stress]") { stress_captures("mode:fixed"); }

TEST_CASE("stress: graph captures beside other threads, vmm mode", "[stress]") { stress_captures("mode:vmm"); }

// The per-device registry (tensorpool/registry.hpp) and the C API's per-thread errors. Every
// test case runs in its own process (catch_discover_tests), so each starts with an empty
// registry.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "support/skip.hpp"
#include "tensorpool/registry.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/tensorpool.h"
#include "tensorpool/trace/pytorch_snapshot.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;

TEST_CASE("the backend key: four kinds, round trip, a bad value names the key", "[registry]") {
  CHECK(Config{}.backend == Backend::async);
  CHECK(Config::parse("backend:malloc").backend == Backend::malloc);
  CHECK(Config::parse("backend:vmm").backend == Backend::vmm);
  const Config sim = Config::parse("backend:simulated");
  CHECK(sim.backend == Backend::simulated);
  CHECK(Config::parse(sim.to_string()).backend == Backend::simulated);
  CHECK_THROWS_WITH(Config::parse("backend:tpu"), Contains("'backend'") && Contains("async, malloc, vmm or simulated"));
  // The allocator itself ignores it: any backend value works on any device.
  auto device = std::make_shared<SimulatedDevice>();
  Allocator a(device, Config::parse("backend:vmm"));
  a.deallocate(a.allocate(MiB));
}

TEST_CASE("registry: one allocator per device, however many threads race to create it", "[registry]") {
  configure_device_allocators("backend:simulated");
  constexpr int kThreads = 8;
  std::array<std::array<Allocator*, 4>, kThreads> seen{};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) {
      }
      for (int d = 0; d < 4; ++d) {
        Allocator& a = device_allocator((d + t) % 4);
        a.deallocate(a.allocate(MiB * (1 + t)));
        seen[t][(d + t) % 4] = &a;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int d = 0; d < 4; ++d) {
    std::set<Allocator*> distinct;
    for (int t = 0; t < kThreads; ++t) distinct.insert(seen[t][d]);
    CHECK(distinct.size() == 1);
    CHECK(*distinct.begin() == existing_device_allocator(d));
    CHECK(existing_device_allocator(d)->device().properties().ordinal == d);
    CHECK(existing_device_allocator(d)->stats().alloc_calls == kThreads);
    existing_device_allocator(d)->check_invariants();
  }
  CHECK(device_allocator_ordinals() == std::vector<int>{0, 1, 2, 3});
  CHECK(existing_device_allocator(4) == nullptr);
}

TEST_CASE("registry: a bad TENSORPOOL_CONF is refused at first use, naming the key", "[registry]") {
  ::setenv("TENSORPOOL_CONF", "backend:simulated,max_split_sise:1GiB", 1);
  CHECK_THROWS_WITH(device_allocator(0), Contains("TENSORPOOL_CONF") && Contains("max_split_sise"));
  CHECK(existing_device_allocator(0) == nullptr);
  // The C API says the same, with its status.
  tensorpool_allocator* h = nullptr;
  CHECK(tensorpool_device_allocator(0, &h) == TENSORPOOL_ERROR_CONFIG);
  CHECK_THAT(tensorpool_last_error(), Contains("max_split_sise"));
  CHECK(tensorpool_configure(nullptr) == TENSORPOOL_ERROR_CONFIG);  // what install() calls
  // A failed creation is retried: fixed settings work.
  ::setenv("TENSORPOOL_CONF", "backend:simulated,mode:fixed,max_split_size:1GiB", 1);
  CHECK(device_allocator(0).config().max_split_size == GiB);
  ::unsetenv("TENSORPOOL_CONF");
}

TEST_CASE("registry: settings are fixed once an allocator exists", "[registry]") {
  CHECK_THROWS_WITH(configure_device_allocators("backend:simulated,oversize_slack:many"),
                    Contains("oversize_slack"));
  configure_device_allocators("backend:simulated,small_size:512KiB");
  CHECK(device_allocator(1).config().small_size == 512 * KiB);
  CHECK_THROWS_AS(configure_device_allocators("backend:simulated"), UsageError);
  CHECK_THROWS_AS(configure_device_allocators_from_env(), UsageError);
  CHECK_THROWS_WITH(device_allocator(kMaxRegistryDevices), Contains("outside"));
  CHECK_THROWS_AS(device_allocator(-1), UsageError);
}

TEST_CASE("registry: an unavailable backend is a clear error", "[registry]") {
  CHECK(backend_available(Backend::simulated));
  if (backend_available(Backend::async))
    TP_SKIP("this build has the CUDA backends (the error is a build's without them: preset cpu-only)");
  configure_device_allocators("backend:async");
  CHECK_THROWS_AS(device_allocator(0), BackendUnavailableError);
  tensorpool_allocator* h = nullptr;
  CHECK(tensorpool_device_allocator(0, &h) == TENSORPOOL_ERROR_UNAVAILABLE);
  CHECK_THAT(tensorpool_last_error(), Contains("backend 'async'") && Contains("CUDA"));
}

TEST_CASE("registry: recorded history and snapshot of every device", "[registry]") {
  configure_device_allocators("backend:simulated");
  Allocator& d0 = device_allocator(0);
  void* early = d0.allocate(4 * MiB);  // before recording: seen as live at the window's start
  record_device_history(true, 1000);
  Allocator& d2 = device_allocator(2);  // created later: records too
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back((i % 2 ? d0 : d2).allocate((i + 1) * MiB));
  for (int i = 0; i < 10; i += 3) (i % 2 ? d0 : d2).deallocate(blocks[i]);
  d0.deallocate(early);
  const auto path = std::filesystem::temp_directory_path() / ("tp-registry-" + std::to_string(::getpid()) + ".pickle");
  dump_device_snapshot(path);
  const trace::pytorch::Snapshot s = trace::pytorch::load_snapshot(path);
  REQUIRE(s.device_traces.size() == 3);
  CHECK_FALSE(s.device_traces[0].empty());
  CHECK(s.device_traces[1].empty());
  CHECK_FALSE(s.device_traces[2].empty());
  std::size_t live = 0;
  for (const auto& seg : s.segments)
    for (const auto& b : seg.blocks) live += b.live();
  CHECK(live == 10 - 4);
  const trace::Trace t = trace::pytorch::to_trace(s, "registry.pickle");
  CHECK_FALSE(t.events.empty());
  std::filesystem::remove(path);
  CHECK_THROWS_AS(dump_device_snapshot("/nonexistent-dir/x.pickle"), Error);
}

TEST_CASE("C API: the last error is per thread", "[registry]") {
  tensorpool_allocator* a = nullptr;
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, GiB, nullptr, &a) == TENSORPOOL_OK);
  int foreign = 0;
  REQUIRE(tensorpool_free(a, &foreign) == TENSORPOOL_ERROR_USAGE);
  const std::string mine = tensorpool_last_error();
  std::string theirs;
  std::thread other([&] {
    void* p = nullptr;
    CHECK(tensorpool_alloc(a, 4 * GiB, 0, &p) == TENSORPOOL_ERROR_OUT_OF_MEMORY);
    theirs = tensorpool_last_error();
  });
  other.join();
  CHECK_THAT(mine, Contains("tensorpool_free"));
  CHECK_THAT(theirs, Contains("out of memory"));
  CHECK(tensorpool_last_error() == mine);
  CHECK(tensorpool_last_status() == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_check_invariants(a) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
}

#if TENSORPOOL_REGISTRY_ON_DOUBLE
#include "testing/control.hpp"

TEST_CASE("registry: the CUDA backend kinds on the test double", "[registry]") {
  cuda_double::Options two;
  two.device_count = 2;
  cuda_double::reset(two);
  for (const char* kind : {"async", "malloc", "vmm"}) {
    INFO(kind);
    tensorpool_allocator* a = nullptr;
    const tensorpool_backend k = std::string(kind) == "async"    ? TENSORPOOL_BACKEND_CUDA_ASYNC
                                 : std::string(kind) == "malloc" ? TENSORPOOL_BACKEND_CUDA_MALLOC
                                                                 : TENSORPOOL_BACKEND_CUDA_VMM;
    REQUIRE(tensorpool_create(k, 1, 0, std::string(kind) == "vmm" ? "mode:vmm" : "", &a) == TENSORPOOL_OK);
    void* p = nullptr;
    REQUIRE(tensorpool_alloc(a, 30 * MiB, 0, &p) == TENSORPOOL_OK);
    CHECK(cuda_double::used_bytes(1) >= 30 * MiB);
    CHECK(tensorpool_free(a, p) == TENSORPOOL_OK);
    CHECK(tensorpool_empty_cache(a) == TENSORPOOL_OK);
    CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
    CHECK(cuda_double::used_bytes(1) == 0);
  }
  configure_device_allocators("backend:malloc");
  Allocator& a = device_allocator(1);
  a.deallocate(a.allocate(3 * MiB));
  CHECK(a.device().properties().ordinal == 1);
  CHECK_THROWS_AS(device_allocator(5), DeviceError);  // the double has two devices
}
#endif

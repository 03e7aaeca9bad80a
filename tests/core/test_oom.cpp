// Running out of memory: the error's content, observers, free-memory callbacks, upstream faults.
#include <catch2/catch.hpp>

#include <memory>
#include <new>

#include "support/fixed_mode.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;

namespace {
// Fixed segments (support/fixed_mode.hpp): the simulated device would get vmm by default.
using Fixture = testing::FixedModeAllocator;
}  // namespace

TEST_CASE("OutOfMemoryError is a bad_alloc that explains where memory went", "[oom]") {
  Fixture f({}, {.capacity = 100 * MiB});
  void* a = f.alloc.allocate(30 * MiB);
  void* b = f.alloc.allocate(30 * MiB);
  void* c = f.alloc.allocate(30 * MiB);
  f.alloc.deallocate(b);  // 30 MiB cached in the middle, 10 MiB left on the device
  try {
    f.alloc.allocate(50 * MiB);
    FAIL("expected OutOfMemoryError");
  } catch (const std::bad_alloc& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Contains("52428800 bytes"));
    CHECK_THAT(m, Contains("capacity 100.00 MiB"));
    CHECK_THAT(m, Contains("device free"));
    CHECK_THAT(m, Contains("reserved 60.00 MiB"));  // b's segment was released while retrying
    CHECK_THAT(m, Contains("allocated 60.00 MiB"));
    CHECK_THAT(m, Contains("reserved but unallocated 0 B"));
    CHECK_THAT(m, Contains("largest free block"));
    CHECK_THAT(m, Contains("Hint:"));
    const auto* oom = dynamic_cast<const OutOfMemoryError*>(&e);
    REQUIRE(oom != nullptr);
    REQUIRE(oom->info().requested == 50 * MiB);
    REQUIRE(oom->info().page_size == 0);  // fixed segments
    REQUIRE(oom->info().device_free == 40 * MiB);
  }
  const auto s = f.alloc.stats();
  REQUIRE(s.ooms == 1);
  REQUIRE(s.retries == 1);
  REQUIRE(s.upstream_frees == 1);
  f.alloc.check_invariants();
  f.alloc.deallocate(a);
  f.alloc.deallocate(c);
}

TEST_CASE("the hint names fragmentation when cached memory could have served", "[oom]") {
  Fixture f(Config::parse("max_split_size:20MiB"), {.capacity = 48 * MiB});
  // Two segments, each half used: plenty reserved-but-unallocated, no block large enough.
  void* a = f.alloc.allocate(4 * MiB);
  void* b = f.alloc.allocate(4 * MiB);
  void* c = f.alloc.allocate(4 * MiB);
  void* d = f.alloc.allocate(4 * MiB);
  void* e = f.alloc.allocate(4 * MiB);
  void* g = f.alloc.allocate(4 * MiB);
  f.alloc.deallocate(b);
  f.alloc.deallocate(d);
  REQUIRE_THROWS_WITH(f.alloc.allocate(20 * MiB), Contains("fragmented"));
  for (void* p : {a, c, e, g}) f.alloc.deallocate(p);
}

TEST_CASE("a request larger than the device fails at once, keeping the cache", "[oom]") {
  Fixture f({}, {.capacity = GiB});
  f.alloc.deallocate(f.alloc.allocate(100 * MiB));
  REQUIRE_THROWS_AS(f.alloc.allocate(2 * GiB), OutOfMemoryError);
  REQUIRE_THROWS_AS(f.alloc.allocate(~std::size_t{0}), OutOfMemoryError);
  REQUIRE(f.alloc.stats().upstream_frees == 0);
  REQUIRE(f.alloc.stats().ooms == 2);
}

TEST_CASE("OOM observers see the failure, free-memory callbacks can resolve it", "[oom][hooks]") {
  Fixture f({}, {.capacity = 64 * MiB});
  void* held = f.alloc.allocate(40 * MiB);
  int oom_calls = 0;
  std::size_t seen = 0;
  f.alloc.add_oom_observer([&](const OutOfMemoryInfo& info) {
    ++oom_calls;
    seen = info.requested;
    REQUIRE_NOTHROW(f.alloc.stats());  // called without the lock held
  });
  REQUIRE_THROWS_AS(f.alloc.allocate(40 * MiB), OutOfMemoryError);
  REQUIRE(oom_calls == 1);
  REQUIRE(seen == 40 * MiB);

  int callback_calls = 0;
  const HookId cb = f.alloc.add_free_memory_callback([&](std::size_t bytes) {
    ++callback_calls;
    REQUIRE(bytes == 40 * MiB);
    if (held == nullptr) return false;
    f.alloc.deallocate(held);  // a higher-level cache giving memory back
    held = nullptr;
    return true;
  });
  void* p = f.alloc.allocate(40 * MiB);
  REQUIRE(p != nullptr);
  REQUIRE(callback_calls == 1);
  REQUIRE(oom_calls == 1);
  REQUIRE(f.alloc.remove_hook(cb));
  REQUIRE_FALSE(f.alloc.remove_hook(cb));
  f.alloc.deallocate(p);
  f.alloc.check_invariants();
}

TEST_CASE("an upstream failure is retried after releasing the cache", "[oom][faults]") {
  Fixture f;
  f.alloc.deallocate(f.alloc.allocate(30 * MiB));
  f.device->fail_nth(FaultSite::segment_alloc, 1);
  void* p = f.alloc.allocate(50 * MiB);  // first try fails, cache released, second try succeeds
  REQUIRE(p != nullptr);
  const auto s = f.alloc.stats();
  REQUIRE(s.upstream_alloc_failures == 1);
  REQUIRE(s.upstream_frees == 1);
  REQUIRE(s.retries == 1);
  REQUIRE(s.ooms == 0);
  f.alloc.deallocate(p);
  f.alloc.check_invariants();
}

// Fault injection through the device backend: upstream segment allocations, physical creations,
// map calls and event creations failing, first in small scenarios that pin down each path's
// documented outcome, then in sweeps that fail the n-th call of a site for every n a workload
// reaches, each run judged by the differential test's reference model (error types, no leak
// after the final drain, check_invariants after every step).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>

#include "reliability/differential.hpp"
#include "support/deterministic.hpp"
#include "support/fixed_mode.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;
using namespace tensorpool::reliability;

namespace {

// The allocator warns on every injected event fault (the tests check them instead). Set before
// main(): the library reads the level once, on its first log call. A user's setting wins.
[[maybe_unused]] const int quiet_logs = setenv("TENSORPOOL_LOG_LEVEL", "error", 0);


struct Rig {
  explicit Rig(const char* config, std::size_t capacity = GiB)
      : sim(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = capacity})),
        alloc(sim, testing::fixed_mode(testing::deterministic_config(config))) {}  // fixed unless `config` says vmm
  // Nothing may remain once everything is freed, all work completed and the cache emptied.
  void expect_no_leak() {
    sim->complete_all();
    alloc.empty_cache();
    alloc.check_invariants();
    CHECK(alloc.usage().reserved == 0);
    CHECK(sim->used_bytes() == 0);
  }
  std::shared_ptr<SimulatedDevice> sim;
  Allocator alloc;
};

}  // namespace

TEST_CASE("faults: a failed segment allocation is an OutOfMemoryError, then recovers", "[faults]") {
  Rig r("memory_limit:none");
  // 12 MiB gets a segment of its own size: no smaller segment to fall back to.
  r.sim->fail_nth(FaultSite::segment_alloc, 1);
  REQUIRE_THROWS_AS(r.alloc.allocate(12 * MiB), OutOfMemoryError);
  r.alloc.check_invariants();
  CHECK(r.alloc.stats().upstream_alloc_failures == 1);
  CHECK(r.alloc.usage().reserved == 0);
  void* p = r.alloc.allocate(12 * MiB);
  REQUIRE(p != nullptr);
  r.alloc.deallocate(p);
  r.expect_no_leak();
}

TEST_CASE("faults: a failed segment allocation falls back to the exact size", "[faults]") {
  Rig r("memory_limit:none");
  // A 1 MiB request prefers a 20 MiB segment; fail that, the 2 MiB exact-size retry succeeds.
  r.sim->fail_allocations_above(8 * MiB);
  void* p = r.alloc.allocate(1536 * KiB);
  r.alloc.check_invariants();
  CHECK(r.alloc.usage().reserved == 2 * MiB);
  r.sim->fail_allocations_above(0);
  r.alloc.deallocate(p);
  r.expect_no_leak();
}

TEST_CASE("faults: vmm, a failed physical creation is an OutOfMemoryError", "[faults][vmm]") {
  Rig r("mode:vmm,vmm_chunk_divisor:0");  // the request in one chunk (the sweeps cover the divisor)
  r.sim->fail_allocations_above(2 * MiB);  // the growth step and the bare need both fail
  REQUIRE_THROWS_AS(r.alloc.allocate(6 * MiB), OutOfMemoryError);
  r.alloc.check_invariants();
  CHECK(r.sim->used_bytes() == 0);
  r.sim->fail_allocations_above(0);
  void* p = r.alloc.allocate(6 * MiB);
  r.alloc.deallocate(p);
  r.expect_no_leak();
}

TEST_CASE("faults: vmm, a failed map is a DeviceError and the pages stay accounted", "[faults][vmm]") {
  Rig r("mode:vmm,vmm_chunk_divisor:0");  // one chunk for the request
  r.sim->fail_nth(FaultSite::map, 1);
  REQUIRE_THROWS_AS(r.alloc.allocate(4 * MiB), DeviceError);
  r.alloc.check_invariants();
  // The physical chunk created for the request is cached, not leaked: reserved == device used.
  CHECK(r.alloc.usage().reserved == r.sim->used_bytes());
  CHECK(r.alloc.usage().allocated == 0);
  const auto creates = r.sim->counters().physical_creates;
  void* p = r.alloc.allocate(4 * MiB);  // maps the cached chunk: no new creation
  CHECK(r.sim->counters().physical_creates == creates);
  r.alloc.deallocate(p);
  r.expect_no_leak();
}

TEST_CASE("faults: vmm, a map failing midway keeps what was mapped", "[faults][vmm]") {
  Rig r("mode:vmm,vmm_max_growth:2MiB,vmm_max_chunk:2MiB,vmm_idle_limit:0");  // remaps free pages eagerly
  // Two 4 MiB chunks mapped on stream s1, then free there. A 30 MiB request on the default
  // stream reclaims them (unmapped, cached) and maps them into its own heap before creating the
  // rest: the second of those maps fails, after the first succeeded.
  const Stream s1 = r.sim->create_stream();
  void* a = r.alloc.allocate(4 * MiB, s1);
  void* b = r.alloc.allocate(4 * MiB, s1);
  r.alloc.deallocate(a);
  r.alloc.deallocate(b);
  r.sim->fail_nth(FaultSite::map, 2);
  const auto maps = r.sim->counters().maps;
  CHECK_THROWS_AS(r.alloc.allocate(30 * MiB, kDefaultStream), DeviceError);
  CHECK(r.sim->counters().maps == maps + 1);  // one chunk mapped before the failure
  r.alloc.check_invariants();
  CHECK(r.alloc.usage().reserved == r.sim->used_bytes());
  CHECK(r.alloc.usage().allocated == 0);
  void* c = r.alloc.allocate(30 * MiB, kDefaultStream);  // the fault is spent
  r.alloc.check_invariants();
  r.alloc.deallocate(c);
  r.expect_no_leak();
}

TEST_CASE("faults: a failed event creation in a free neither throws nor waits: the block waits for the stream",
          "[faults]") {
  Rig r("memory_limit:none");
  const Stream s1 = r.sim->create_stream();
  const Stream s2 = r.sim->create_stream();
  const auto syncs = r.sim->counters().syncs();
  SECTION("until an event recorded on the stream after it completes") {
    void* p = r.alloc.allocate(MiB, s1);
    r.alloc.record_stream(p, s2);
    void* q = r.alloc.allocate(MiB, s1);
    r.alloc.record_stream(q, s2);
    r.sim->fail_nth(FaultSite::event_create, 1);
    REQUIRE_NOTHROW(r.alloc.deallocate(p));  // no event: waits in s2's queue without one
    r.alloc.deallocate(q);                   // an event on s2, recorded after p's free
    CHECK(r.sim->counters().syncs() == syncs);
    CHECK(r.alloc.usage().active == 2 * MiB);
    r.alloc.check_invariants();
    r.sim->complete_stream(s2);
    r.alloc.deallocate(r.alloc.allocate(512));  // the next allocation collects both
    CHECK(r.alloc.usage().active == 0);
    CHECK(r.sim->counters().syncs() == syncs);
  }
  SECTION("until a path that may wait synchronizes it") {
    void* p = r.alloc.allocate(MiB, s1);
    r.alloc.record_stream(p, s2);
    r.sim->fail_nth(FaultSite::event_create, 1);
    REQUIRE_NOTHROW(r.alloc.deallocate(p));
    CHECK(r.sim->counters().syncs() == syncs);
    r.alloc.deallocate(r.alloc.allocate(512));
    CHECK(r.alloc.usage().active == MiB);  // nothing says s2 is done yet
    r.alloc.check_invariants();
    r.alloc.empty_cache();  // waits for what is pending: s2 is synchronized
    CHECK(r.sim->counters().syncs() == syncs + 1);
    CHECK(r.alloc.usage().active == 0);
  }
  r.alloc.check_invariants();
  r.expect_no_leak();
}

TEST_CASE("faults: a failed event creation during cross-stream reuse leaves the state intact",
          "[faults]") {
  Rig r("memory_limit:20MiB");
  const Stream s1 = r.sim->create_stream();
  const Stream s2 = r.sim->create_stream();
  void* a = r.alloc.allocate(12 * MiB, s1);
  r.alloc.deallocate(a);  // cached on s1; a second segment would pass the limit
  r.sim->fail_nth(FaultSite::event_create, 1);
  // The reuse needs an event; without one the ladder goes on: s1's free segment is returned and
  // a new one made for s2. The fault never reaches the caller (it once did: a regression test).
  void* b = nullptr;
  REQUIRE_NOTHROW(b = r.alloc.allocate(12 * MiB, s2));
  r.alloc.check_invariants();
  CHECK(r.alloc.usage().allocated == 12 * MiB);
  CHECK(r.alloc.stats().upstream_frees == 1);
  CHECK(r.alloc.snapshot().segments.at(0).stream == s2);
  (void)a;
  r.alloc.deallocate(b);
  r.expect_no_leak();
}

// --- sweeps: fail the n-th call of a site, for every n the workload reaches ---------------------

namespace {

constexpr std::uint64_t kPointsPerSweep = 60;  // injection points per site
constexpr std::uint64_t kPointsPerWorkload = 60;

// A 2000-op workload without random faults or drains (a drain disarms the fault before it can
// fire); fails the test if it fails without any fault.
std::vector<Op> workload(const RunOptions& options, bool vmm, std::uint64_t seed, RunFigures& baseline,
                         bool repeated_steps) {
  auto ops = generate(seed, 2000, Profile{vmm, false, options.streams, options.capacity, repeated_steps});
  std::erase_if(ops, [](const Op& op) { return op.kind == OpKind::drain; });
  if (const auto failure = run(options, ops, &baseline))
    FAIL("without faults: " << report(seed, options, *failure, shrink(options, ops, *failure)));
  return ops;
}

// Fails call n of `site` (n = 1 .. the calls the workload makes, at most kPointsPerWorkload),
// each in a fresh run of the workload judged by the reference model.
void sweep_workload(const RunOptions& options, const std::vector<Op>& ops, FaultSite site,
                    std::uint64_t calls, std::uint64_t seed, RunFigures& total) {
  for (std::uint64_t n = 1; n <= calls; ++n) {
    std::vector<Op> faulty{{OpKind::fault, 0, static_cast<std::uint8_t>(site), n}};
    faulty.insert(faulty.end(), ops.begin(), ops.end());
    RunFigures figures;
    const auto failure = run(options, faulty, &figures);
    if (failure)
      FAIL("fault at call " << n << ": " << report(seed, options, *failure, shrink(options, faulty, *failure)));
    CHECK(figures.faults_injected == 1);
    total += figures;
  }
}

// Sweeps workloads of successive seeds until kPointsPerSweep injection points are covered (event
// creation is rare: the allocator pools its events, so one workload reaches only a few).
void sweep(const char* config, bool vmm, FaultSite site, std::uint64_t first_seed, bool repeated_steps = false) {
  const RunOptions options{config};
  RunFigures total;
  std::uint64_t points = 0;
  std::uint64_t workloads = 0;
  for (std::uint64_t seed = first_seed; points < kPointsPerSweep && workloads < 40; seed += 1000, ++workloads) {
    RunFigures baseline;
    const auto ops = workload(options, vmm, seed, baseline, repeated_steps);
    const std::uint64_t reached = baseline.site_calls[static_cast<std::size_t>(site)];
    const std::uint64_t calls = std::min({reached, kPointsPerWorkload, kPointsPerSweep - points});
    sweep_workload(options, ops, site, calls, seed, total);
    points += calls;
  }
  CHECK(points == kPointsPerSweep);
  std::printf("fault sweep [%s] site %d: %llu workloads, %llu faults injected, %llu ops, %llu OOMs, "
              "%llu DeviceErrors\n",
              config, static_cast<int>(site), static_cast<unsigned long long>(workloads),
              static_cast<unsigned long long>(total.faults_injected), static_cast<unsigned long long>(total.ops),
              static_cast<unsigned long long>(total.ooms), static_cast<unsigned long long>(total.device_errors));
}

}  // namespace

TEST_CASE("faults: sweep, fixed mode, segment allocation", "[faults][sweep]") {
  sweep("mode:fixed,memory_limit:1GiB", false, FaultSite::segment_alloc, 11);
}

TEST_CASE("faults: sweep, fixed mode, event creation", "[faults][sweep]") {
  sweep("mode:fixed,memory_limit:1GiB", false, FaultSite::event_create, 12);
}

TEST_CASE("faults: sweep, vmm mode, physical creation", "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB", true, FaultSite::physical_create, 13);
}

TEST_CASE("faults: sweep, vmm mode, map", "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB", true, FaultSite::map, 14);
}

TEST_CASE("faults: sweep, vmm mode, chunks of 1/4 of the request, at least 1/128 of the limit, map", "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB,vmm_chunk_divisor:4,vmm_chunk_floor_divisor:128", true, FaultSite::map, 16);
}

TEST_CASE("faults: sweep, the default mode (vmm on the simulated device), map", "[faults][sweep][vmm]") {
  sweep("memory_limit:1GiB", true, FaultSite::map, 17);
}

TEST_CASE("faults: sweep, vmm mode, repeated steps (plans, holes, give-back), map", "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB", true, FaultSite::map, 18, true);
}

TEST_CASE("faults: sweep, vmm mode, repeated steps (plans, holes, give-back), event creation",
          "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB", true, FaultSite::event_create, 19, true);
}

TEST_CASE("faults: sweep, vmm mode, event creation", "[faults][sweep][vmm]") {
  sweep("mode:vmm,memory_limit:1GiB", true, FaultSite::event_create, 15);
}

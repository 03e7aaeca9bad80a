// CUDA graph capture (Allocator::begin_capture, src/core/graph_capture.cpp) on the simulated
// device, in both modes: a captured stream is served from its graph pool with no device call,
// the pool's blocks stay the pool's until the graph is released, a request the pool cannot serve
// says how much to reserve, and misuse changes nothing; the invariants hold after every call.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "support/sim_allocator.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

using Sim = testing::SimAllocator;

// Every call the allocator can make on the device, summed.
std::uint64_t device_calls(const DeviceCounters& c) {
  return c.segment_allocs + c.segment_alloc_failures + c.segment_frees + c.events_created + c.events_destroyed +
         c.events_recorded + c.event_queries + c.event_syncs + c.stream_waits + c.stream_syncs + c.device_syncs +
         c.address_reserves + c.address_releases + c.physical_creates + c.physical_releases + c.maps + c.unmaps;
}

bool inside(const GraphPoolInfo& pool, const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<Address>(p);
  return std::any_of(pool.ranges.begin(), pool.ranges.end(),
                     [&](const auto& r) { return a >= r.first && a + bytes <= r.first + r.second; });
}

GraphPoolInfo pool_info(const Allocator& alloc, GraphPool pool) {
  for (const GraphPoolInfo& info : alloc.graph_pools())
    if (info.id == pool.id) return info;
  FAIL("graph pool " << pool.id << " is not listed");
  return {};
}

Mode any_mode() { return GENERATE(Mode::fixed, Mode::vmm); }

}  // namespace

TEST_CASE("graphs: a captured stream is served from its pool without a device call", "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  const GraphPool pool = sim.alloc.begin_capture(s, 256 * MiB);
  sim.device->set_capturing(s, true);
  const std::uint64_t calls_before = device_calls(sim.device->counters());
  const std::size_t reserved_before = sim.alloc.usage().reserved;

  std::mt19937_64 rng(7);
  std::map<void*, std::size_t> live;
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 100)) {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      sim.alloc.deallocate(it->first);
      live.erase(it);
    } else {
      const std::size_t bytes = rng() % 2 == 0 ? 1 + rng() % (64 * KiB) : 1 + rng() % (2 * MiB);
      void* p = sim.alloc.allocate(bytes, s);
      for (const auto& [q, n] : live)  // no overlap with another live block
        REQUIRE((reinterpret_cast<Address>(p) + bytes <= reinterpret_cast<Address>(q) ||
                 reinterpret_cast<Address>(q) + n <= reinterpret_cast<Address>(p)));
      live.emplace(p, bytes);
    }
    if (i % 50 == 0) sim.alloc.check_invariants();
  }
  REQUIRE(device_calls(sim.device->counters()) == calls_before);
  REQUIRE(sim.alloc.usage().reserved == reserved_before);
  const GraphPoolInfo info = pool_info(sim.alloc, pool);
  for (const auto& [p, n] : live) REQUIRE(inside(info, p, n));
  REQUIRE(info.blocks == live.size());
  REQUIRE(info.capturing == std::vector<Stream>{s});
  const Stats st = sim.alloc.stats();
  REQUIRE(st.graph_pools == 1);
  REQUIRE(st.graph_reserved_bytes == info.reserved);
  REQUIRE(st.graph_allocated_bytes == info.allocated);
  REQUIRE(info.reserved >= 256 * MiB);

  sim.device->set_capturing(s, false);
  sim.alloc.end_capture(s);
  for (const auto& [p, n] : live) sim.alloc.deallocate(p);
  sim.alloc.release_graph(pool);
  REQUIRE(sim.alloc.graph_pools().empty());
  REQUIRE(sim.alloc.usage().allocated == 0);
  sim.alloc.check_invariants();
}

TEST_CASE("graphs: a pool's blocks are kept from other streams until the graph is released", "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  const GraphPool pool = sim.alloc.begin_capture(s, 32 * MiB);
  void* kept = sim.alloc.allocate(4 * MiB, s);      // an output the graph keeps
  void* scratch = sim.alloc.allocate(20 * MiB, s);  // freed inside the capture
  sim.alloc.deallocate(scratch);
  sim.alloc.end_capture(s);

  // After the capture, the stream is served as usual: never from the pool, freed space included.
  void* after = sim.alloc.allocate(20 * MiB, s);
  REQUIRE_FALSE(inside(pool_info(sim.alloc, pool), after, 20 * MiB));
  const Stream other = sim.device->create_stream();
  void* elsewhere = sim.alloc.allocate(20 * MiB, other);
  REQUIRE_FALSE(inside(pool_info(sim.alloc, pool), elsewhere, 20 * MiB));

  // empty_cache leaves the pool alone; the snapshot names it.
  sim.alloc.empty_cache();
  const GraphPoolInfo info = pool_info(sim.alloc, pool);
  REQUIRE(info.allocated == round_size(4 * MiB));
  const Snapshot snap = sim.alloc.snapshot();
  REQUIRE(snap.graph_pools.size() == 1);
  std::size_t ranges_seen = 0;
  for (const SegmentInfo& seg : snap.segments)
    for (const BlockInfo& b : seg.blocks)
      if (b.graph_pool == pool.id) ranges_seen += b.size;
  REQUIRE(ranges_seen == info.reserved);

  // A second capture into the same pool reuses what the first freed.
  sim.alloc.begin_capture(s, pool);
  void* again = sim.alloc.allocate(20 * MiB, s);
  REQUIRE(inside(pool_info(sim.alloc, pool), again, 20 * MiB));
  sim.alloc.deallocate(again);
  sim.alloc.end_capture(s);

  // Released with a live block: the pool stays until that block is freed, then its ranges are
  // cache the allocator may give back.
  sim.alloc.release_graph(pool);
  REQUIRE(pool_info(sim.alloc, pool).released);
  sim.alloc.deallocate(kept);
  REQUIRE(sim.alloc.graph_pools().empty());
  sim.alloc.deallocate(after);
  sim.alloc.deallocate(elsewhere);
  sim.alloc.check_invariants();
  sim.alloc.empty_cache();
  REQUIRE(sim.alloc.usage().reserved == 0);
  REQUIRE(sim.device->free_memory() == sim.device->properties().capacity);
}

TEST_CASE("graphs: a request the pool cannot serve says how much to reserve, and changes nothing",
          "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  const GraphPool pool = sim.alloc.begin_capture(s, 8 * MiB);
  void* a = sim.alloc.allocate(6 * MiB, s);
  const std::uint64_t calls_before = device_calls(sim.device->counters());
  const GraphPoolInfo before = pool_info(sim.alloc, pool);
  std::size_t suggested = 0;
  try {
    (void)sim.alloc.allocate(5 * MiB, s);
    FAIL("the pool served more than it holds");
  } catch (const GraphPoolExhaustedError& e) {
    suggested = e.suggested_reserve();
    REQUIRE(e.pool() == pool.id);
    REQUIRE_THAT(e.what(), Catch::Contains("graph pool") && Catch::Contains("reserve at least"));
  }
  REQUIRE(suggested >= 8 * MiB + 5 * MiB);
  REQUIRE(device_calls(sim.device->counters()) == calls_before);
  const GraphPoolInfo after = pool_info(sim.alloc, pool);
  REQUIRE(after.allocated == before.allocated);
  REQUIRE(after.blocks == before.blocks);
  REQUIRE(sim.alloc.stats().ooms == 1);
  sim.alloc.check_invariants();
  sim.alloc.deallocate(a);
  sim.alloc.end_capture(s);
  sim.alloc.release_graph(pool);

  // The suggested reserve serves the same capture.
  const GraphPool bigger = sim.alloc.begin_capture(s, suggested);
  void* x = sim.alloc.allocate(6 * MiB, s);
  void* y = sim.alloc.allocate(5 * MiB, s);
  sim.alloc.deallocate(x);
  sim.alloc.deallocate(y);
  sim.alloc.end_capture(s);
  sim.alloc.release_graph(bigger);
  sim.alloc.check_invariants();
}

TEST_CASE("graphs: misuse is a usage error that changes nothing", "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  REQUIRE_THROWS_WITH(sim.alloc.begin_capture(s, 0), Catch::Contains("needs a reserve"));
  REQUIRE(sim.alloc.graph_pools().empty());
  REQUIRE_THROWS_WITH(sim.alloc.end_capture(s), Catch::Contains("not captured"));
  REQUIRE_THROWS_WITH(sim.alloc.release_graph(GraphPool{42}), Catch::Contains("does not exist"));
  REQUIRE_THROWS_AS(sim.alloc.begin_capture(s, GraphPool{42}), UsageError);

  const GraphPool pool = sim.alloc.begin_capture(s, 4 * MiB);
  const Stats before = sim.alloc.stats();
  REQUIRE_THROWS_WITH(sim.alloc.begin_capture(s, 4 * MiB), Catch::Contains("already captured"));
  REQUIRE_THROWS_WITH(sim.alloc.release_graph(pool), Catch::Contains("end_capture first"));
  REQUIRE_THROWS_WITH(sim.alloc.empty_cache(), Catch::Contains("end_capture first"));
  if (mode == Mode::vmm) {
    REQUIRE_THROWS_WITH(sim.alloc.sleep(), Catch::Contains("end_capture first"));
  }
  void* p = sim.alloc.allocate(MiB, s);
  REQUIRE_THROWS_WITH(sim.alloc.deallocate(static_cast<char*>(p) + 512), Catch::Contains("graph pool"));
  sim.alloc.record_stream(p, kDefaultStream);  // accepted: a pool's blocks follow the graph's order
  REQUIRE_FALSE(sim.alloc.is_asleep(p));
  sim.alloc.deallocate(p);
  REQUIRE_THROWS_WITH(sim.alloc.deallocate(p), Catch::Contains("not one of its live blocks"));
  REQUIRE(sim.alloc.stats().graph_reserved_bytes == before.graph_reserved_bytes);
  REQUIRE(static_cast<std::int64_t>(sim.alloc.usage().reserved) == before.total[Metric::reserved_bytes].current);
  sim.alloc.check_invariants();
  sim.alloc.end_capture(s);
  sim.alloc.release_graph(pool);
  REQUIRE_THROWS_WITH(sim.alloc.release_graph(pool), Catch::Contains("does not exist"));
  sim.alloc.check_invariants();
}

TEST_CASE("graphs: a stream the device captures without a pool is refused growth, not served by the device",
          "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  void* warm = sim.alloc.allocate(2 * MiB, s);
  sim.alloc.deallocate(warm);
  sim.device->set_capturing(s, true);
  const std::uint64_t calls_before = device_calls(sim.device->counters());
  REQUIRE_THROWS_WITH(sim.alloc.allocate(512 * MiB, s), Catch::Contains("before cudaStreamBeginCapture"));
  REQUIRE(device_calls(sim.device->counters()) == calls_before);
  // Reserving for a pool now would call the device inside the capture: refused too.
  REQUIRE_THROWS_WITH(sim.alloc.begin_capture(s, 64 * MiB), Catch::Contains("being captured already"));
  REQUIRE(sim.alloc.graph_pools().empty());
  sim.alloc.check_invariants();
  sim.device->set_capturing(s, false);
}

TEST_CASE("graphs: a stream forked into a capture shares its pool, and frees that need events wait for its end",
          "[graphs]") {
  const Mode mode = any_mode();
  Sim sim(mode);
  const Stream s = sim.device->create_stream();
  const Stream side = sim.device->create_stream();
  const Stream other = sim.device->create_stream();
  void* shared = sim.alloc.allocate(3 * MiB, other);  // used by the captured stream too
  sim.alloc.record_stream(shared, s);

  const GraphPool pool = sim.alloc.begin_capture(s, 16 * MiB);
  sim.device->set_capturing(s, true);
  sim.device->set_capturing(side, true);
  sim.alloc.begin_capture(side, pool);  // nothing more to reserve: no device call
  const DeviceCounters before = sim.device->counters();
  void* a = sim.alloc.allocate(5 * MiB, s);
  void* b = sim.alloc.allocate(5 * MiB, side);
  REQUIRE(inside(pool_info(sim.alloc, pool), a, 5 * MiB));
  REQUIRE(inside(pool_info(sim.alloc, pool), b, 5 * MiB));
  sim.alloc.deallocate(shared);  // needs an event on s: not recorded during the capture
  REQUIRE(device_calls(sim.device->counters()) == device_calls(before));
  REQUIRE(pool_info(sim.alloc, pool).capturing.size() == 2);
  sim.alloc.check_invariants();

  sim.device->set_capturing(side, false);
  sim.alloc.end_capture(side);
  REQUIRE(sim.device->counters().events_recorded == before.events_recorded);  // s is still captured
  REQUIRE(sim.alloc.fragmentation().pending_free == 3 * MiB);
  sim.device->set_capturing(s, false);
  sim.alloc.end_capture(s);
  REQUIRE(sim.device->counters().events_recorded == before.events_recorded + 1);
  REQUIRE(sim.alloc.fragmentation().pending_free == 3 * MiB);  // s's work is not done (manual events)
  sim.alloc.deallocate(a);
  sim.alloc.deallocate(b);
  sim.alloc.release_graph(pool);
  sim.alloc.empty_cache();  // the shared block's event completes (immediate mode) and it goes back
  sim.alloc.check_invariants();
  REQUIRE(sim.alloc.usage().allocated == 0);
}

TEST_CASE("graphs: the last end_capture releases the waiting frees whose streams are done", "[graphs]") {
  // Back to back captures leave no allocation outside a capture to process events at: without
  // this, such frees would wait until memory ran out (the stress test of captures found it).
  Sim sim(any_mode(), 8 * GiB, EventMode::immediate);
  Allocator& alloc = sim.alloc;
  const Stream s = sim.device->create_stream();
  const Stream other = sim.device->create_stream();
  void* shared = alloc.allocate(3 * MiB, other);
  alloc.record_stream(shared, s);
  const GraphPool pool = alloc.begin_capture(s, 4 * MiB);
  alloc.deallocate(shared);  // waits, without an event, for the capture's end
  REQUIRE(alloc.fragmentation().pending_free == 3 * MiB);
  alloc.end_capture(s);
  REQUIRE(alloc.fragmentation().pending_free == 0);  // its event was done at once
  alloc.release_graph(pool);
  alloc.check_invariants();
  REQUIRE(alloc.usage().allocated == 0);
}

TEST_CASE("graphs: graph pools sleep with the rest, or alone, and wake at the same addresses", "[graphs][sleep]") {
  Sim sim(Mode::vmm);
  const Stream s = sim.device->create_stream();
  void* plain = sim.alloc.allocate(8 * MiB, s);
  const GraphPool pool = sim.alloc.begin_capture(s, 16 * MiB);
  void* captured = sim.alloc.allocate(6 * MiB, s);
  REQUIRE_THROWS_WITH(sim.alloc.sleep(), Catch::Contains("end_capture first"));
  sim.alloc.end_capture(s);

  const SleepReport alone = sim.alloc.sleep("tensorpool:graphs");
  REQUIRE(alone.asleep_blocks == 1);  // the pool's range
  REQUIRE(sim.alloc.is_asleep(captured));
  REQUIRE_FALSE(sim.alloc.is_asleep(plain));
  sim.alloc.check_invariants();
  sim.alloc.wake("tensorpool:graphs");
  REQUIRE_FALSE(sim.alloc.is_asleep(captured));

  const SleepReport all = sim.alloc.sleep();
  REQUIRE(all.asleep_blocks == 2);
  REQUIRE(sim.alloc.is_asleep(captured));
  REQUIRE(sim.alloc.is_asleep(plain));
  sim.alloc.wake();
  REQUIRE(pool_info(sim.alloc, pool).allocated == round_size(6 * MiB));
  sim.alloc.deallocate(captured);
  sim.alloc.release_graph(pool);
  sim.alloc.deallocate(plain);
  sim.alloc.check_invariants();
  sim.alloc.empty_cache();
  REQUIRE(sim.alloc.usage().reserved == 0);
}

// Allocator basics: rounding, caching, split/coalesce, pools, oversize, misuse, stats, views.
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "support/fixed_mode.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;

namespace {

// Fixed segments (support/fixed_mode.hpp): the simulated device would get vmm by default.
using Fixture = testing::FixedModeAllocator;

Address addr(void* p) { return reinterpret_cast<Address>(p); }

}  // namespace

TEST_CASE("allocate rounds to 512 B and reuses cached blocks", "[allocator]") {
  Fixture f;
  REQUIRE(f.alloc.allocate(0) == nullptr);
  f.alloc.deallocate(nullptr);  // no-op
  void* p = f.alloc.allocate(1000);
  REQUIRE(p != nullptr);
  REQUIRE(addr(p) % 512 == 0);
  auto s = f.alloc.stats();
  REQUIRE(s.of(Pool::small)[Metric::allocated_bytes].current == 1024);
  REQUIRE(s.of(Pool::small)[Metric::requested_bytes].current == 1000);
  REQUIRE(s.of(Pool::small)[Metric::reserved_bytes].current == static_cast<std::int64_t>(2 * MiB));
  f.alloc.deallocate(p);
  void* q = f.alloc.allocate(900);
  REQUIRE(q == p);  // served from the cache
  REQUIRE(f.device->counters().segment_allocs == 1);
  f.alloc.deallocate(q);
  f.alloc.check_invariants();
}

TEST_CASE("small and large pools use the documented segment sizes", "[allocator]") {
  Fixture f;
  void* small = f.alloc.allocate(MiB);           // small pool: 2 MiB segment
  void* big = f.alloc.allocate(11 * MiB + 1);    // large, >= 10 MiB: rounded to 2 MiB
  void* mid = f.alloc.allocate(3 * MiB);         // large, < 10 MiB: 20 MiB segment
  const Snapshot snap = f.alloc.snapshot();
  REQUIRE(snap.segments.size() == 3);
  std::multiset<std::size_t> sizes;
  for (const auto& seg : snap.segments) sizes.insert(seg.size);
  REQUIRE(sizes == std::multiset<std::size_t>{2 * MiB, 12 * MiB, 20 * MiB});
  const auto s = f.alloc.stats();
  REQUIRE(s.of(Pool::small)[Metric::segments].current == 1);
  REQUIRE(s.of(Pool::large)[Metric::segments].current == 2);
  for (void* p : {small, mid, big}) f.alloc.deallocate(p);
  f.alloc.check_invariants();
}

TEST_CASE("blocks split and coalesce within a segment", "[allocator]") {
  Fixture f;
  void* a = f.alloc.allocate(4 * MiB);
  void* b = f.alloc.allocate(4 * MiB);
  void* c = f.alloc.allocate(4 * MiB);
  REQUIRE(addr(b) == addr(a) + 4 * MiB);  // carved from the same 20 MiB segment
  REQUIRE(addr(c) == addr(b) + 4 * MiB);
  REQUIRE(f.alloc.snapshot().segments.at(0).blocks.size() == 4);
  f.alloc.deallocate(b);
  REQUIRE(f.alloc.fragmentation().inactive_split == 4 * MiB + 8 * MiB);
  REQUIRE(f.alloc.fragmentation().inactive_split_blocks == 2);
  f.alloc.deallocate(a);  // merges with b
  REQUIRE(f.alloc.snapshot().segments.at(0).blocks.size() == 3);
  f.alloc.deallocate(c);  // merges everything back into one free block
  const auto seg = f.alloc.snapshot().segments.at(0);
  REQUIRE(seg.blocks.size() == 1);
  REQUIRE(seg.blocks[0].state == BlockState::free);
  REQUIRE(f.alloc.fragmentation().inactive_split == 0);
  void* whole = f.alloc.allocate(20 * MiB);  // the coalesced segment serves a full-size request
  REQUIRE(addr(whole) == addr(a));
  REQUIRE(f.device->counters().segment_allocs == 1);
  f.alloc.deallocate(whole);
  f.alloc.check_invariants();
}

TEST_CASE("max_split_size: oversize blocks are never split and only reused when close", "[allocator]") {
  Fixture f(Config::parse("max_split_size:64MiB,oversize_slack:8MiB"));
  void* big = f.alloc.allocate(100 * MiB);
  f.alloc.deallocate(big);
  void* small = f.alloc.allocate(30 * MiB);  // below max_split_size: never takes the oversize block
  REQUIRE(addr(small) != addr(big));
  void* close = f.alloc.allocate(95 * MiB);  // within the slack: reuses it whole
  REQUIRE(addr(close) == addr(big));
  REQUIRE(f.alloc.stats().total[Metric::allocated_bytes].current ==
          static_cast<std::int64_t>(30 * MiB + 100 * MiB));
  f.alloc.deallocate(close);
  void* far = f.alloc.allocate(70 * MiB);  // 30 MiB smaller than the cached block: new segment
  REQUIRE(addr(far) != addr(big));
  for (const auto& seg : f.alloc.snapshot().segments)
    if (seg.oversize) REQUIRE(seg.blocks.size() == 1);
  f.alloc.deallocate(small);
  f.alloc.deallocate(far);
  f.alloc.check_invariants();
}

TEST_CASE("misuse raises UsageError and leaves the state intact", "[allocator]") {
  Fixture f;
  void* p = f.alloc.allocate(4096);
  void* q = f.alloc.allocate(4096);
  const Stats before = f.alloc.stats();
  REQUIRE_THROWS_WITH(f.alloc.deallocate(reinterpret_cast<void*>(0x1234000)),
                      Contains("not allocated by this allocator"));
  REQUIRE_THROWS_WITH(f.alloc.deallocate(static_cast<char*>(p) + 512), Contains("inside the block"));
  f.alloc.deallocate(q);
  REQUIRE_THROWS_WITH(f.alloc.deallocate(q), Contains("double free"));
  REQUIRE_THROWS_AS(f.alloc.record_stream(q, 7), UsageError);
  f.alloc.check_invariants();
  const Stats after = f.alloc.stats();
  REQUIRE(after.total[Metric::allocations].current == before.total[Metric::allocations].current - 1);
  REQUIRE(after.free_calls == before.free_calls + 1);  // only the valid free counted
  f.alloc.deallocate(p);
  f.alloc.check_invariants();
  REQUIRE(f.cur(Metric::allocated_bytes) == 0);
}

TEST_CASE("empty_cache returns every free segment", "[allocator]") {
  Fixture f;
  void* keep = f.alloc.allocate(5 * MiB);
  for (int i = 0; i < 8; ++i) f.alloc.deallocate(f.alloc.allocate(30 * MiB + i * MiB));
  REQUIRE(f.cur(Metric::segments) > 1);
  f.alloc.empty_cache();
  REQUIRE(f.cur(Metric::segments) == 1);  // only the one holding `keep`
  REQUIRE(f.device->used_bytes() == 20 * MiB);
  f.alloc.deallocate(keep);
  f.alloc.empty_cache();
  REQUIRE(f.cur(Metric::reserved_bytes) == 0);
  REQUIRE(f.device->used_bytes() == 0);
  const auto s = f.alloc.stats();
  REQUIRE(s.upstream_allocs == s.upstream_frees);
  f.alloc.check_invariants();
}

TEST_CASE("stats track current, peak and cumulative values, reset_peaks", "[allocator][stats]") {
  Fixture f;
  void* a = f.alloc.allocate(3 * MiB);
  void* b = f.alloc.allocate(2 * MiB);
  f.alloc.deallocate(a);
  auto s = f.alloc.stats().total[Metric::allocated_bytes];
  REQUIRE(s.current == static_cast<std::int64_t>(2 * MiB));
  REQUIRE(s.peak == static_cast<std::int64_t>(5 * MiB));
  REQUIRE(s.allocated == static_cast<std::int64_t>(5 * MiB));
  REQUIRE(s.freed == static_cast<std::int64_t>(3 * MiB));
  f.alloc.reset_peaks();
  REQUIRE(f.alloc.stats().total[Metric::allocated_bytes].peak == static_cast<std::int64_t>(2 * MiB));
  REQUIRE(f.alloc.stats().alloc_calls == 2);
  f.alloc.deallocate(b);
}

TEST_CASE("fragmentation view", "[allocator][stats]") {
  Fixture f;
  void* a = f.alloc.allocate(4 * MiB - 100);
  void* b = f.alloc.allocate(4 * MiB);
  f.alloc.deallocate(a);
  const FragmentationReport r = f.alloc.fragmentation();
  REQUIRE(r.reserved == 20 * MiB);
  REQUIRE(r.allocated == 4 * MiB);
  REQUIRE(r.requested == 4 * MiB);
  REQUIRE(r.reserved_unallocated == 16 * MiB);
  REQUIRE(r.total_free == 16 * MiB);
  REQUIRE(r.largest_free == 12 * MiB);
  REQUIRE(r.free_blocks == 2);
  REQUIRE(r.utilization == Approx(0.2));
  REQUIRE(r.external_fragmentation == Approx(0.25));
  void* c = f.alloc.allocate(MiB - 1000);
  REQUIRE(f.alloc.fragmentation().internal_waste == round_size(MiB - 1000) - (MiB - 1000));
  f.alloc.deallocate(b);
  f.alloc.deallocate(c);
}

TEST_CASE("memory limit in bytes or as a fraction", "[allocator]") {
  Fixture f(Config::parse("memory_limit:64MiB"));
  void* a = f.alloc.allocate(40 * MiB);
  REQUIRE_THROWS_AS(f.alloc.allocate(40 * MiB), OutOfMemoryError);
  f.alloc.deallocate(a);
  void* b = f.alloc.allocate(60 * MiB);  // releases the cached 40 MiB segment first
  REQUIRE(f.alloc.stats().total[Metric::reserved_bytes].current == static_cast<std::int64_t>(60 * MiB));
  f.alloc.deallocate(b);

  Fixture g(Config::parse("memory_limit:0.25"), {.capacity = 1 * GiB});
  REQUIRE(g.alloc.memory_limit() == 256 * MiB);
  REQUIRE_THROWS_AS(g.alloc.allocate(300 * MiB), OutOfMemoryError);
  g.alloc.set_memory_limit(0);
  g.alloc.deallocate(g.alloc.allocate(300 * MiB));
}

TEST_CASE("near the limit a smaller exact segment is used instead of a 20 MiB one", "[allocator]") {
  Fixture f(Config::parse("memory_limit:12MiB"));
  void* p = f.alloc.allocate(3 * MiB);  // would want a 20 MiB segment; gets 4 MiB
  REQUIRE(f.alloc.snapshot().segments.at(0).size == 4 * MiB);
  f.alloc.deallocate(p);
}

TEST_CASE("concurrent use from several threads keeps the state consistent", "[allocator][threads]") {
  Fixture f;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> held;
      for (int i = 0; i < 5000; ++i) {
        held.push_back(f.alloc.allocate(static_cast<std::size_t>(512 * (1 + (i * 7 + t) % 3000))));
        if (held.size() > 20) {
          f.alloc.deallocate(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) f.alloc.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  f.alloc.check_invariants();
  REQUIRE(f.cur(Metric::allocated_bytes) == 0);
  REQUIRE(f.alloc.stats().alloc_calls == 20000);
}

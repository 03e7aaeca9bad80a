// Tests of the models of RMM's pool_memory_resource ("rmm-pool") and arena_memory_resource
// ("rmm-arena"): one test per documented rule (see the banners of src/replay/models/rmm_*.cpp),
// through the ReplayTarget interface, plus the random workload every model runs.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "random_workload.hpp"
#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"

using namespace tensorpool;
using namespace tensorpool::replay;

namespace {

std::unique_ptr<ReplayTarget> pool(const std::string& conf, std::size_t capacity = 80 * GiB) {
  TargetOptions o;
  o.conf = conf;
  o.capacity = capacity;
  return make_target("rmm-pool", o);
}

std::unique_ptr<ReplayTarget> arena(const std::string& conf, std::size_t capacity = 80 * GiB) {
  TargetOptions o;
  o.conf = conf;
  o.capacity = capacity;
  return make_target("rmm-arena", o);
}

std::uintptr_t at(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

// --- rmm-pool ---------------------------------------------------------------------------------

TEST_CASE("rmm-pool: the initial pool (default half the device) is taken at once and never returned",
          "[models][rmm]") {
  auto t = pool("");
  REQUIRE(t->name() == "rmm-pool");
  REQUIRE(t->reserved() == 40 * GiB);
  REQUIRE(t->upstream().allocs == 1);
  void* p = t->allocate(1 * GiB, 0);
  t->deallocate(p, 1 * GiB, 0);
  t->empty_cache();  // pool_memory_resource has no trim
  REQUIRE(t->reserved() == 40 * GiB);
  REQUIRE(t->upstream().frees == 0);
  REQUIRE(pool("initial_pool_size:1GiB")->reserved() == 1 * GiB);
}

TEST_CASE("rmm-pool: sizes align to 256 B, best fit, split from the front", "[models][rmm]") {
  auto t = pool("initial_pool_size:64MiB");
  void* a = t->allocate(1, 0);
  REQUIRE(t->allocated() == 256);
  void* b = t->allocate(300, 0);
  REQUIRE(at(b) == at(a) + 256);
  REQUIRE(t->allocated() == 256 + 512);
  void* c = t->allocate(10 * MiB, 0);
  void* d = t->allocate(1 * MiB, 0);
  void* e = t->allocate(4 * MiB, 0);
  t->deallocate(c, 10 * MiB, 0);  // holes: 10 MiB (c) and the tail after e
  t->deallocate(e, 4 * MiB, 0);   // merges with the tail
  void* f = t->allocate(2 * MiB, 0);
  REQUIRE(at(f) == at(c));  // the 10 MiB hole is the smallest that fits
  for (void* p : {a, b, d, f}) t->deallocate(p, 0, 0);
  void* g = t->allocate(64 * MiB, 0);  // everything coalesced back into one block
  REQUIRE(at(g) == at(a));
  REQUIRE(t->upstream().allocs == 1);
}

TEST_CASE("rmm-pool: growth takes the larger of the request and the pool, within the maximum",
          "[models][rmm]") {
  auto t = pool("initial_pool_size:0,maximum_pool_size:1GiB", 80 * GiB);
  void* a = t->allocate(100 * MiB, 0);
  REQUIRE(t->reserved() == 100 * MiB);  // an empty pool grows by the request
  void* b = t->allocate(10 * MiB, 0);   // no room left: grows by the pool's size
  REQUIRE(t->reserved() == 200 * MiB);
  void* c = t->allocate(300 * MiB, 0);  // grows by the request (larger than the pool)
  REQUIRE(t->reserved() == 500 * MiB);
  void* d = t->allocate(400 * MiB, 0);  // grows by the pool's 500 MiB (524 MiB are left)
  REQUIRE(t->reserved() == 1000 * MiB);
  void* e = t->allocate(100 * MiB, 0);  // the free 90 MiB and 100 MiB blocks: the 100 MiB one
  void* f = t->allocate(90 * MiB, 0);
  REQUIRE(t->reserved() == 1000 * MiB);
  void* g = t->allocate(10 * MiB, 0);  // the pool's size would pass the maximum: what is left
  REQUIRE(t->reserved() == 1 * GiB);
  REQUIRE(t->upstream().allocs == 5);
  REQUIRE_THROWS_AS(t->allocate(20 * MiB, 0), OutOfMemoryError);  // the maximum is reached
  for (void* p : {a, b, c, d, e, f, g}) t->deallocate(p, 0, 0);
}

TEST_CASE("rmm-pool: a refused growth is retried at half the size, down to the request", "[models][rmm]") {
  auto t = pool("initial_pool_size:600MiB,maximum_pool_size:none", 1 * GiB);
  void* a = t->allocate(600 * MiB, 0);
  void* b = t->allocate(300 * MiB, 0);  // asks 600 MiB (the pool's size): the device has 424 left
  REQUIRE(t->reserved() == 900 * MiB);  // so it asked half: 300 MiB
  REQUIRE(t->upstream().allocs == 2);
  REQUIRE(t->upstream().frees == 0);
  REQUIRE_THROWS_AS(t->allocate(200 * MiB, 0), OutOfMemoryError);  // 600, 300, 200: all refused
  t->deallocate(b, 0, 0);
  t->deallocate(a, 0, 0);
}

TEST_CASE("rmm-pool: free lists are per stream, another stream's list is taken over when needed",
          "[models][rmm]") {
  auto t = pool("initial_pool_size:32MiB");
  void* a = t->allocate(32 * MiB, 1);
  t->deallocate(a, 32 * MiB, 1);  // on stream 1's list
  const auto waits_before = t->upstream().syncs;
  void* b = t->allocate(8 * MiB, 2);  // stream 2 has nothing: takes stream 1's list, no growth
  REQUIRE(at(b) == at(a));
  REQUIRE(t->upstream().allocs == 1);
  REQUIRE(t->upstream().syncs == waits_before);  // a stream wait, not a host sync
  void* c = t->allocate(8 * MiB, 1);  // stream 1's list went to stream 2: stream 1 takes it back
  REQUIRE(t->upstream().allocs == 1);
  t->deallocate(b, 8 * MiB, 2);
  t->deallocate(c, 8 * MiB, 1);
}

TEST_CASE("rmm-pool: bad settings are refused", "[models][rmm]") {
  REQUIRE_THROWS_AS(pool("initial_pool_size:100"), ConfigError);  // not a multiple of 256
  REQUIRE_THROWS_AS(pool("initial_pool_size:2GiB,maximum_pool_size:1GiB"), ConfigError);
  REQUIRE_THROWS_AS(pool("initial_pool_size:100GiB"), ConfigError);  // beyond the device
  REQUIRE_THROWS_WITH(pool("grow:2"), Catch::Contains("known keys: initial_pool_size, maximum_pool_size"));
}

// --- rmm-arena --------------------------------------------------------------------------------

TEST_CASE("rmm-arena: one fixed arena of half the device, taken at once, never grows", "[models][rmm]") {
  auto t = arena("");
  REQUIRE(t->name() == "rmm-arena");
  REQUIRE(t->reserved() == 40 * GiB);
  REQUIRE(t->upstream().allocs == 1);
  void* a = t->allocate(30 * GiB, 0);
  REQUIRE_THROWS_AS(t->allocate(20 * GiB, 0), OutOfMemoryError);  // would need growth
  REQUIRE(t->upstream().allocs == 1);
  REQUIRE(t->upstream().syncs == 1);  // it synchronized and defragmented before giving up
  t->deallocate(a, 0, 0);
  REQUIRE(arena("arena_size:1GiB")->reserved() == 1 * GiB);
}

TEST_CASE("rmm-arena: small requests share a superblock of their stream's arena, first fit",
          "[models][rmm]") {
  auto t = arena("arena_size:64MiB");
  void* a = t->allocate(1000, 0);  // 1024 after alignment, in a new 256 KiB superblock
  void* b = t->allocate(1, 0);
  REQUIRE(at(b) == at(a) + 1024);
  void* c = t->allocate(100, 1);  // another stream: its own arena, its own superblock
  REQUIRE(at(c) == at(a) + 256 * KiB);
  t->deallocate(a, 0, 0);
  void* d = t->allocate(512, 0);  // first fit: the hole a left at the superblock's start
  REQUIRE(at(d) == at(a));
  REQUIRE(t->allocated() == 512 + 256 + 256);
  for (void* p : {b, c, d}) t->deallocate(p, 0, 0);
}

TEST_CASE("rmm-arena: a free superblock returns to the global arena, large requests go there directly",
          "[models][rmm]") {
  auto t = arena("arena_size:1MiB");
  void* small = t->allocate(4 * KiB, 0);  // superblock [0, 256 KiB)
  void* large = t->allocate(700 * KiB, 0);  // above a superblock: from the global arena
  REQUIRE(at(large) == at(small) + 256 * KiB);
  REQUIRE_THROWS_AS(t->allocate(300 * KiB, 0), OutOfMemoryError);  // 68 KiB left in the global arena
  t->deallocate(small, 0, 0);  // its superblock is wholly free: back to the global arena
  void* again = t->allocate(256 * KiB, 0);  // fits again, at the start
  REQUIRE(at(again) == at(small));
  t->deallocate(again, 0, 0);
  t->deallocate(large, 0, 0);
  void* all = t->allocate(1 * MiB, 0);  // everything coalesced in the global arena
  REQUIRE(at(all) == at(small));
  t->deallocate(all, 0, 0);
}

TEST_CASE("rmm-arena: bad settings are refused", "[models][rmm]") {
  REQUIRE_THROWS_AS(arena("arena_size:0"), ConfigError);
  REQUIRE_THROWS_AS(arena("arena_size:100GiB"), ConfigError);
  REQUIRE_THROWS_AS(arena("superblock_size:1000"), ConfigError);
  REQUIRE_THROWS_WITH(arena("size:1"), Catch::Contains("known keys: arena_size, superblock_size"));
}

TEST_CASE("rmm models: the random workload keeps their books straight", "[models][rmm]") {
  for (const char* name : {"rmm-pool", "rmm-arena"}) {
    INFO(name);
    TargetOptions o;
    o.capacity = 8 * GiB;
    o.conf = std::string(name) == "rmm-pool" ? "initial_pool_size:0" : "";
    auto t = make_target(name, o);
    const std::size_t fixed = t->reserved();
    auto result = testing::run_random_workload(*t, o.capacity, true, [&](ReplayTarget& target) {
      REQUIRE(target.reserved() <= o.capacity);
      REQUIRE(target.allocated() <= target.reserved());
      if (std::string(name) == "rmm-arena") REQUIRE(target.reserved() == fixed);
    });
    for (const auto& b : result.live) t->deallocate(b.p, b.bytes, 0);
    REQUIRE(t->allocated() == 0);
  }
}

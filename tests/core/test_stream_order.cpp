// Stream-ordered reuse: record_stream, deferred frees, cross-stream reuse through event waits.
#include <catch2/catch.hpp>

#include <memory>

#include "support/fixed_mode.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {
// Fixed segments (support/fixed_mode.hpp): the simulated device would get vmm by default.
using Fixture = testing::FixedModeAllocator;

/// The bytes of the blocks allocated or waiting for other streams' work.
std::int64_t active_bytes(const Fixture& f) { return f.alloc.stats().total[Metric::active_bytes].current; }
constexpr std::int64_t mib(std::int64_t n) { return n * static_cast<std::int64_t>(MiB); }

/// Two blocks of s1 also used on s2: p (8 MiB), freed while s2 works, whose work is then done,
/// and q (4 MiB), still live.
struct FreedWhileUsedElsewhere {
  Stream s1, s2;
  void* p;
  void* q;
};
FreedWhileUsedElsewhere free_one_used_elsewhere(Fixture& f) {
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(8 * MiB, s1);
  void* q = f.alloc.allocate(4 * MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.record_stream(q, s2);
  f.alloc.deallocate(p);  // pending on s2
  REQUIRE(active_bytes(f) == mib(12));
  f.device->complete_stream(s2);  // p's work is done; nothing asked yet
  REQUIRE(active_bytes(f) == mib(12));
  return {s1, s2, p, q};
}

/// Under a 20 MiB limit: a 16 MiB block of s1, also used on s2, freed while s2 works (whose work
/// never completes by itself), then 16 MiB asked for again on s1: only the pending free can serve.
struct AskedAgain {
  void* freed;
  void* again;
};
AskedAgain freed_while_used_then_asked_again(Fixture& f) {
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(16 * MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.deallocate(p);  // pending on s2
  return {p, f.alloc.allocate(16 * MiB, s1)};
}
}  // namespace

TEST_CASE("a block used on another stream is reused only after that stream's work", "[streams]") {
  Fixture f;
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(8 * MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.record_stream(p, s2);  // recording twice is harmless
  f.alloc.record_stream(p, s1);  // the owner stream is implied
  f.alloc.deallocate(p);
  REQUIRE(f.device->counters().events_recorded == 1);
  REQUIRE(active_bytes(f) == mib(8));
  REQUIRE(f.alloc.stats().total[Metric::allocated_bytes].current == 0);
  void* q = f.alloc.allocate(8 * MiB, s1);
  REQUIRE(q != p);  // p is still in flight on s2
  f.alloc.check_invariants();
  f.device->complete_stream(s2);
  f.alloc.deallocate(q);
  void* r = f.alloc.allocate(8 * MiB, s1);  // the event is collected on the next allocation
  REQUIRE((r == p || r == q));
  REQUIRE(active_bytes(f) == mib(8));
  REQUIRE(f.alloc.stats().syncs == 0);
  f.alloc.deallocate(r);
  f.alloc.check_invariants();
}

TEST_CASE("free blocks belong to their stream while memory is plentiful", "[streams]") {
  Fixture f;
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(MiB, s1);
  f.alloc.deallocate(p);
  void* q = f.alloc.allocate(MiB, s2);
  REQUIRE(q != p);
  REQUIRE(f.alloc.stats().stream_waits == 0);
  f.alloc.deallocate(q);
  const Snapshot snap = f.alloc.snapshot();
  REQUIRE(snap.segments.size() == 2);
  REQUIRE(snap.segments[0].stream != snap.segments[1].stream);
}

TEST_CASE("under pressure a free block of another stream is taken after an event wait", "[streams]") {
  Fixture f(Config::parse("memory_limit:20MiB"));
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(16 * MiB, s1);  // one 16 MiB segment owned by s1
  f.alloc.deallocate(p);
  void* q = f.alloc.allocate(8 * MiB, s2);   // no room for a new segment: reuse s1's cache
  REQUIRE(q == p);
  auto s = f.alloc.stats();
  REQUIRE(s.stream_waits == 1);
  REQUIRE(s.syncs == 0);
  REQUIRE(f.device->counters().stream_waits == 1);
  REQUIRE(f.device->counters().syncs() == 0);
  // The block stays s1's; freeing it from s2 waits for s2's work before s1 can reuse it.
  f.alloc.deallocate(q);
  REQUIRE(active_bytes(f) == mib(8));
  f.device->complete_stream(s2);
  void* r = f.alloc.allocate(16 * MiB, s1);
  REQUIRE(r == p);
  f.alloc.deallocate(r);
  f.alloc.check_invariants();
}

TEST_CASE("cross_stream_reuse:false falls back to synchronizing and releasing", "[streams]") {
  Fixture f(Config::parse("memory_limit:20MiB,cross_stream_reuse:false"));
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  f.alloc.deallocate(f.alloc.allocate(16 * MiB, s1));
  void* q = f.alloc.allocate(8 * MiB, s2);  // releases s1's free segment, allocates a new one
  REQUIRE(f.alloc.stats().stream_waits == 0);
  REQUIRE(f.alloc.stats().upstream_frees == 1);
  REQUIRE(f.alloc.snapshot().segments.at(0).stream == s2);
  f.alloc.deallocate(q);
}

TEST_CASE("the OOM ladder reuses a pending free after a wait on the device instead of failing",
          "[streams][oom]") {
  Fixture f(Config::parse("memory_limit:20MiB"));
  const auto [p, q] = freed_while_used_then_asked_again(f);
  REQUIRE(q == p);
  // s1 waits on the device for s2's work before the free: the host does not.
  REQUIRE(f.alloc.stats().syncs == 0);
  REQUIRE(f.device->counters().syncs() == 0);
  REQUIRE(f.alloc.stats().stream_waits == 1);
  REQUIRE(f.device->counters().stream_waits == 1);
  REQUIRE(active_bytes(f) == mib(16));
  f.alloc.deallocate(q);
  REQUIRE(active_bytes(f) == 0);  // freed on its own stream: no stream to wait for any more
  f.alloc.check_invariants();
}

TEST_CASE("cross_stream_reuse:false, the OOM ladder waits on the host for pending frees instead of failing",
          "[streams][oom]") {
  Fixture f(Config::parse("memory_limit:20MiB,cross_stream_reuse:false"));
  const auto [p, q] = freed_while_used_then_asked_again(f);
  REQUIRE(q == p);
  REQUIRE(f.alloc.stats().syncs == 1);
  REQUIRE(f.device->counters().event_syncs == 1);
  REQUIRE(f.alloc.stats().stream_waits == 0);
  f.alloc.deallocate(q);
  f.alloc.check_invariants();
}

TEST_CASE("a failed event creation on free waits for the stream without a sync, nothing is lost",
          "[streams][faults]") {
  Fixture f;
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(MiB, s1);
  f.alloc.record_stream(p, s2);
  f.device->fail_nth(FaultSite::event_create, 1);
  REQUIRE_NOTHROW(f.alloc.deallocate(p));
  REQUIRE(f.alloc.stats().syncs == 0);
  REQUIRE(f.device->counters().syncs() == 0);
  REQUIRE(active_bytes(f) == mib(1));  // pending on s2
  void* q = f.alloc.allocate(MiB, s1);
  REQUIRE(q != p);  // s2 may still use p
  f.alloc.deallocate(q);
  f.alloc.check_invariants();
  f.alloc.empty_cache();  // a path that may wait: s2 is synchronized
  REQUIRE(f.device->counters().stream_syncs == 1);
  REQUIRE(active_bytes(f) == 0);
  f.alloc.check_invariants();
}

TEST_CASE("a free that waits for another stream collects the frees whose work is done, without waiting",
          "[streams]") {
  Fixture f;
  const auto [s1, s2, p, q] = free_one_used_elsewhere(f);
  f.alloc.deallocate(q);  // q's event is recorded after that work: q waits, p is free
  REQUIRE(active_bytes(f) == mib(4));
  REQUIRE(f.alloc.stats().syncs == 0);
  REQUIRE(f.device->counters().syncs() == 0);
  f.alloc.check_invariants();
  void* r = f.alloc.allocate(8 * MiB, s1);
  REQUIRE(r == p);
  f.alloc.deallocate(r);
  f.device->complete_stream(s2);
  f.alloc.empty_cache();
  REQUIRE(active_bytes(f) == 0);
  f.alloc.check_invariants();
}

TEST_CASE("a failed event query in a free leaves the frees waiting, throws nothing and loses nothing",
          "[streams][faults]") {
  Fixture f;
  const auto [s1, s2, p, q] = free_one_used_elsewhere(f);
  f.device->fail_nth(FaultSite::event_query, 1);
  REQUIRE_NOTHROW(f.alloc.deallocate(q));
  REQUIRE(f.device->counters().faults_injected == 1);
  REQUIRE(active_bytes(f) == mib(12));
  f.alloc.check_invariants();
  void* r = f.alloc.allocate(MiB, s1);  // the allocation asks again: p is free, q still waits
  REQUIRE(active_bytes(f) == mib(5));
  f.alloc.deallocate(r);
  f.alloc.empty_cache();  // a path that may wait: q's event is synchronized
  REQUIRE(active_bytes(f) == 0);
  REQUIRE(f.alloc.stats().total[Metric::reserved_bytes].current == 0);
  f.alloc.check_invariants();
}

TEST_CASE("a failed event query in an allocation or a step() leaves the frees waiting, and both go on",
          "[streams][faults]") {
  Fixture f;
  const auto [s1, s2, p, q] = free_one_used_elsewhere(f);
  f.device->fail_nth(FaultSite::event_query, 1);
  void* r = nullptr;
  REQUIRE_NOTHROW(r = f.alloc.allocate(8 * MiB, s1));  // p's free is not collected: r is elsewhere
  REQUIRE(f.device->counters().faults_injected == 1);
  REQUIRE(r != p);
  REQUIRE(active_bytes(f) == mib(20));
  f.device->fail_nth(FaultSite::event_query, 1);
  REQUIRE_NOTHROW(f.alloc.step());
  REQUIRE(f.device->counters().faults_injected == 2);
  REQUIRE(active_bytes(f) == mib(20));
  f.alloc.check_invariants();
  f.alloc.step();  // asked again: p is free
  REQUIRE(active_bytes(f) == mib(12));
  f.alloc.deallocate(r);
  f.alloc.deallocate(q);
  f.device->complete_stream(s2);
  f.alloc.empty_cache();
  REQUIRE(f.alloc.stats().total[Metric::reserved_bytes].current == 0);
  f.alloc.check_invariants();
}

TEST_CASE("empty_cache waits for pending frees and releases their segments", "[streams]") {
  Fixture f;
  const Stream s1 = f.device->create_stream();
  const Stream s2 = f.device->create_stream();
  void* p = f.alloc.allocate(30 * MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.deallocate(p);
  f.alloc.empty_cache();
  REQUIRE(f.alloc.stats().total[Metric::reserved_bytes].current == 0);
  REQUIRE(f.device->used_bytes() == 0);
  f.alloc.check_invariants();
}

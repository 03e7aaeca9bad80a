// The simulated device: capacity, granularity, stream-ordered events, waits, faults, VM pages.
#include <catch2/catch.hpp>

#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/simulated_device.hpp"

using namespace tensorpool;

TEST_CASE("simulated device hands out virtual segments of any capacity", "[device]") {
  SimulatedDevice d({.capacity = 80 * GiB});
  REQUIRE(d.free_memory() == 80 * GiB);
  void* a = d.allocate_segment(40 * GiB, 0);
  void* b = d.allocate_segment(38 * GiB, 0);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(reinterpret_cast<Address>(a) % (2 * MiB) == 0);
  REQUIRE(d.free_memory() == 2 * GiB);
  REQUIRE(d.allocate_segment(4 * GiB, 0) == nullptr);  // out of memory is nullptr, not a throw
  REQUIRE_THROWS_AS(d.allocate_segment(MiB, 0), DeviceError);  // not a multiple of 2 MiB
  d.free_segment(a, 40 * GiB, 0);
  REQUIRE_THROWS_AS(d.free_segment(a, 40 * GiB, 0), DeviceError);  // already freed
  REQUIRE(d.counters().segment_allocs == 2);
  REQUIRE(d.counters().segment_alloc_failures == 1);
  REQUIRE(d.counters().segment_frees == 1);
  d.set_external_usage(30 * GiB);
  REQUIRE(d.free_memory() == 12 * GiB);
}

TEST_CASE("events complete in stream order, only when told", "[device]") {
  SimulatedDevice d;
  const Stream s = d.create_stream();
  const DeviceEvent e1 = d.create_event();
  const DeviceEvent e2 = d.create_event();
  REQUIRE(d.query_event(e1));  // never recorded: complete
  d.record_event(e1, s);
  d.record_event(e2, s);
  REQUIRE_FALSE(d.query_event(e1));
  REQUIRE(d.incomplete_events() == 2);
  d.complete_event(e2);  // completes everything before it on the stream as well
  REQUIRE(d.query_event(e1));
  REQUIRE(d.query_event(e2));
  d.record_event(e1, s);
  d.synchronize_event(e1);
  REQUIRE(d.query_event(e1));
  REQUIRE(d.counters().event_syncs == 1);
  REQUIRE_THROWS_AS(d.record_event(e1, 999), DeviceError);
}

TEST_CASE("a stream that waited on an event cannot finish before that event", "[device]") {
  SimulatedDevice d;
  const Stream a = d.create_stream();
  const Stream b = d.create_stream();
  const DeviceEvent ea = d.create_event();
  const DeviceEvent eb = d.create_event();
  d.record_event(ea, a);
  d.stream_wait_event(b, ea);
  d.record_event(eb, b);
  d.complete_stream(b);
  REQUIRE(d.query_event(ea));  // b's completion implied a's work up to ea
  REQUIRE(d.query_event(eb));
  REQUIRE(d.counters().stream_waits == 1);
  REQUIRE(d.counters().syncs() == 0);
}

TEST_CASE("a wait is work of its stream: the stream is not done, nor synchronized, before the event", "[device]") {
  SimulatedDevice d;
  const Stream a = d.create_stream();
  const Stream b = d.create_stream();
  const DeviceEvent ea = d.create_event();
  const DeviceEvent eb = d.create_event();
  d.record_event(eb, b);
  d.complete_stream(b);
  d.record_event(ea, a);
  d.stream_wait_event(b, ea);  // the last thing b was given, after all it had recorded
  REQUIRE_FALSE(d.query_stream(b));  // cudaStreamQuery: not ready while the wait is not
  d.synchronize_stream(b);  // cudaStreamSynchronize returns once the wait is passed
  REQUIRE(d.query_event(ea));
  REQUIRE(d.query_stream(b));
  // Two streams that wait for each other's last records: completing one completes both.
  const DeviceEvent e1 = d.create_event();
  const DeviceEvent e2 = d.create_event();
  d.record_event(e1, a);
  d.record_event(e2, b);
  d.stream_wait_event(a, e2);
  d.stream_wait_event(b, e1);
  d.complete_stream(a);
  REQUIRE(d.query_stream(a));
  REQUIRE(d.query_stream(b));
}

TEST_CASE("immediate mode completes work at once", "[device]") {
  SimulatedDevice d({.event_mode = EventMode::immediate});
  const DeviceEvent e = d.create_event();
  d.record_event(e, d.create_stream());
  REQUIRE(d.query_event(e));
}

TEST_CASE("fault injection fails the n-th call and large requests", "[device]") {
  SimulatedDevice d;
  d.fail_nth(FaultSite::segment_alloc, 2);
  REQUIRE(d.allocate_segment(2 * MiB, 0) != nullptr);
  REQUIRE(d.allocate_segment(2 * MiB, 0) == nullptr);
  REQUIRE(d.allocate_segment(2 * MiB, 0) != nullptr);
  d.fail_allocations_above(8 * MiB);
  REQUIRE(d.allocate_segment(10 * MiB, 0) == nullptr);
  REQUIRE(d.allocate_segment(8 * MiB, 0) != nullptr);
  d.fail_nth(FaultSite::event_create, 1);
  REQUIRE_THROWS_AS(d.create_event(), DeviceError);
  REQUIRE(d.counters().faults_injected == 3);
}

TEST_CASE("virtual memory: parts of a handle map at several places, whole pages only", "[device][vm]") {
  SimulatedDevice d({.capacity = 8 * MiB});
  const Address base = d.reserve_address_range(64 * MiB, 0);
  const PhysicalHandle p = d.create_physical(6 * MiB);
  d.map(base, 6 * MiB, p);
  d.map_part(base + 8 * MiB, 2 * MiB, p, 2 * MiB);   // its middle page again
  d.map_part(base + 10 * MiB, 4 * MiB, p, 0);        // and its first two pages a third time
  REQUIRE(d.mapped_bytes() == 12 * MiB);             // address space: three mappings
  REQUIRE(d.used_bytes() == 6 * MiB);                // memory: one handle
  REQUIRE_THROWS_AS(d.map_part(base + 16 * MiB, 2 * MiB, p, 6 * MiB), DeviceError);   // past its end
  REQUIRE_THROWS_AS(d.map_part(base + 16 * MiB, 1 * MiB, p, 0), DeviceError);         // not a page
  REQUIRE_THROWS_AS(d.map_part(base + 16 * MiB, 2 * MiB, p, 1 * MiB), DeviceError);   // offset not a page
  REQUIRE_THROWS_AS(d.map_part(base + 9 * MiB, 2 * MiB, p, 0), DeviceError);          // overlap
  REQUIRE_THROWS_AS(d.map_part(base + 16 * MiB, 2 * MiB, p + 100, 0), DeviceError);   // unknown handle
  REQUIRE_THROWS_AS(d.map(base + 16 * MiB, 6 * MiB, p), DeviceError);  // a whole map stays exclusive
  d.unmap(base, 6 * MiB);
  REQUIRE_THROWS_AS(d.release_physical(p), DeviceError);  // still mapped twice
  d.unmap(base + 8 * MiB, 2 * MiB);
  d.unmap(base + 10 * MiB, 4 * MiB);
  d.release_physical(p);
  REQUIRE(d.used_bytes() == 0);
  REQUIRE(d.counters().maps == 3);
  REQUIRE(d.counters().unmaps == 3);
  d.release_address_range(base, 64 * MiB);
}

TEST_CASE("virtual memory: a part mapped elsewhere shows the handle's bytes", "[device][vm]") {
  SimulatedDevice d({.capacity = 8 * MiB, .back_memory = true});
  const Address base = d.reserve_address_range(64 * MiB, 0);
  const PhysicalHandle p = d.create_physical(4 * MiB);
  d.map(base, 4 * MiB, p);
  d.map_part(base + 32 * MiB, 2 * MiB, p, 2 * MiB);
  const char text[] = "stitched";
  d.copy_to_device(base + 32 * MiB + 100, text, sizeof text);
  char read[sizeof text] = {};
  d.copy_to_host(read, base + 2 * MiB + 100, sizeof read);
  REQUIRE(std::string(read) == "stitched");
  d.unmap(base + 32 * MiB, 2 * MiB);
  d.unmap(base, 4 * MiB);
  d.release_physical(p);
}

TEST_CASE("virtual memory: pages map once, inside reservations", "[device][vm]") {
  SimulatedDevice d({.capacity = 8 * MiB});
  const Address base = d.reserve_address_range(64 * MiB, 0);
  const PhysicalHandle p1 = d.create_physical(2 * MiB);
  const PhysicalHandle p2 = d.create_physical(2 * MiB);
  d.map(base, 2 * MiB, p1);
  REQUIRE_THROWS_AS(d.map(base, 2 * MiB, p2), DeviceError);            // overlap
  REQUIRE_THROWS_AS(d.map(base + 2 * MiB, 2 * MiB, p1), DeviceError);  // handle mapped twice
  REQUIRE_THROWS_AS(d.map(base + 64 * MiB, 2 * MiB, p2), DeviceError);  // outside the range
  d.map(base + 2 * MiB, 2 * MiB, p2);
  REQUIRE(d.mapped_bytes() == 4 * MiB);
  REQUIRE_THROWS_AS(d.release_physical(p1), DeviceError);  // still mapped
  REQUIRE(d.create_physical(6 * MiB) == 0);                 // 4 of 8 MiB used
  d.unmap(base, 2 * MiB);
  d.release_physical(p1);
  REQUIRE(d.used_bytes() == 2 * MiB);
  REQUIRE_THROWS_AS(d.release_address_range(base, 64 * MiB), DeviceError);  // p2 still mapped
  d.unmap(base + 2 * MiB, 2 * MiB);
  d.release_address_range(base, 64 * MiB);
  REQUIRE(d.counters().maps == 2);
  REQUIRE(d.counters().unmaps == 2);
  REQUIRE(d.counters().modelled_ns > 0);
}

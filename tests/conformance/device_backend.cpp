// tests/conformance/device_backend.cpp: the checks of the DeviceBackend conformance suite (see
// device_backend.hpp). Each SECTION is one clause of the contract in tensorpool/device.hpp and
// runs on a fresh backend.
#include "conformance/device_backend.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <iterator>
#include <cstddef>
#include <utility>

#include "tensorpool/errors.hpp"

namespace tensorpool::conformance {

namespace {

Address addr_of(const void* p) { return reinterpret_cast<Address>(p); }
std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }
bool disjoint(Address a, std::size_t an, Address b, std::size_t bn) { return a + an <= b || b + bn <= a; }

void check_properties(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const DeviceProperties& p = d.properties();
  CHECK_FALSE(p.name.empty());
  CHECK(p.capacity > 0);
  CHECK(p.segment_granularity > 0);
  CHECK(std::has_single_bit(p.alignment));
  CHECK(d.free_memory() <= p.capacity);
  CHECK(&d.properties() == &p);  // the same object for the backend's lifetime
  CHECK(d.virtual_memory() == d.virtual_memory());
  CHECK(d.alive());
}

void check_segments(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const DeviceProperties& p = d.properties();
  const std::size_t g = p.segment_granularity;
  const Stream s = t.new_stream();
  void* a = d.allocate_segment(g, kDefaultStream);
  void* b = d.allocate_segment(3 * g, s);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(addr_of(a) % p.alignment == 0);
  CHECK(addr_of(b) % p.alignment == 0);
  CHECK(disjoint(addr_of(a), g, addr_of(b), 3 * g));
  CHECK(d.free_memory() <= p.capacity - 4 * g);  // the segments are device memory
  d.free_segment(a, g, kDefaultStream);
  d.free_segment(b, 3 * g, s);
}

void check_out_of_memory(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const std::size_t g = d.properties().segment_granularity;
  const std::size_t capacity = d.properties().capacity;
  CHECK(d.allocate_segment(round_up(capacity + 1, g), kDefaultStream) == nullptr);  // never fits
  if (!t.may_fill_device) return;
  const Stream s = t.new_stream();
  const std::size_t big = round_down(capacity / 4 * 3, g);
  void* a = d.allocate_segment(big, s);
  REQUIRE(a != nullptr);
  CHECK(d.allocate_segment(big, s) == nullptr);  // out of memory: nullptr, not an exception
  d.free_segment(a, big, s);
  t.finish(s);
  void* again = d.allocate_segment(big, s);  // the free made room
  REQUIRE(again != nullptr);
  d.free_segment(again, big, s);
}

void check_bad_free(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const std::size_t g = d.properties().segment_granularity;
  void* a = d.allocate_segment(g, kDefaultStream);
  REQUIRE(a != nullptr);
  // Not an address the backend handed out: DeviceError, and the real segment is still whole.
  CHECK_THROWS_AS(d.free_segment(static_cast<char*>(a) + g / 2, g / 2, kDefaultStream), DeviceError);
  d.free_segment(a, g, kDefaultStream);
}

void check_event_order(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const Stream s = t.new_stream();
  const DeviceEvent e1 = d.create_event();
  const DeviceEvent e2 = d.create_event();
  CHECK(e1 != 0);
  CHECK(e2 != 0);
  CHECK(e1 != e2);
  CHECK(d.query_event(e1));  // never recorded: complete
  d.synchronize_event(e1);   // returns at once
  d.record_event(e1, s);
  d.record_event(e2, s);
  if (t.work_stays_pending) {
    CHECK_FALSE(d.query_event(e1));
    CHECK_FALSE(d.query_event(e2));
  }
  d.synchronize_event(e2);
  CHECK(d.query_event(e2));
  CHECK(d.query_event(e1));  // recorded before e2 on the same stream: complete too
  d.record_event(e1, s);     // recording again captures the new work
  if (t.work_stays_pending) CHECK_FALSE(d.query_event(e1));
  t.finish(s);
  CHECK(d.query_event(e1));
  d.destroy_event(e1);
  d.destroy_event(e2);
}

void check_synchronize(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const Stream s = t.new_stream();
  const Stream u = t.new_stream();
  const DeviceEvent e = d.create_event();
  const DeviceEvent f = d.create_event();
  d.record_event(e, s);
  d.synchronize_stream(s);
  CHECK(d.query_event(e));
  d.record_event(e, s);
  d.record_event(f, u);
  d.synchronize_device();
  CHECK(d.query_event(e));
  CHECK(d.query_event(f));
  d.record_event(e, kDefaultStream);  // the default stream is a stream like any other
  d.synchronize_stream(kDefaultStream);
  CHECK(d.query_event(e));
  d.destroy_event(e);
  d.destroy_event(f);
}

void check_stream_query(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const Stream s = t.new_stream();
  const Stream u = t.new_stream();
  CHECK(d.query_stream(s));  // nothing submitted: idle
  const DeviceEvent e = d.create_event();
  d.record_event(e, s);  // work on s
  if (t.work_stays_pending) {
    CHECK_FALSE(d.query_stream(s));
    CHECK(d.query_stream(u));  // another stream's work is not its own
  }
  t.finish(s);
  CHECK(d.query_stream(s));
  d.record_event(e, s);
  d.synchronize_stream(s);
  CHECK(d.query_stream(s));
  d.destroy_event(e);
}

void check_stream_wait(BackendUnderTest& t) {
  DeviceBackend& d = *t.backend;
  const Stream s = t.new_stream();
  const Stream u = t.new_stream();
  const DeviceEvent e = d.create_event();
  const DeviceEvent f = d.create_event();
  const DeviceEvent never = d.create_event();
  d.stream_wait_event(u, never);  // a wait on an event never recorded orders nothing
  d.record_event(e, s);
  d.stream_wait_event(u, e);
  if (t.work_stays_pending) CHECK_FALSE(d.query_event(e));  // the host did not wait
  d.record_event(f, u);
  t.finish(u);  // u's work after the wait could not finish before e's
  CHECK(d.query_event(f));
  CHECK(d.query_event(e));
  d.destroy_event(e);
  d.destroy_event(f);
  d.destroy_event(never);
}

void check_virtual_memory(BackendUnderTest& t) {
  VirtualMemory* vm = t.backend->virtual_memory();
  if (vm == nullptr) return;  // optional: nothing to check
  const std::size_t page = vm->page_size();
  const std::size_t capacity = t.backend->properties().capacity;
  REQUIRE(page > 0);
  const Address base = vm->reserve_address_range(4 * page, page);
  const Address other = vm->reserve_address_range(2 * page, page);
  REQUIRE(base != 0);
  REQUIRE(other != 0);
  CHECK(base % page == 0);
  CHECK(disjoint(base, 4 * page, other, 2 * page));
  const PhysicalHandle h1 = vm->create_physical(page);
  const PhysicalHandle h2 = vm->create_physical(2 * page);
  REQUIRE(h1 != 0);
  REQUIRE(h2 != 0);
  CHECK(h1 != h2);
  CHECK(t.backend->free_memory() <= capacity - 3 * page);  // physical memory is device memory
  vm->map(base, page, h1);  // two handles side by side: one contiguous window of three pages
  vm->map(base + page, 2 * page, h2);
  vm->unmap(base, page);
  vm->map(base + 3 * page, page, h1);  // an unmapped handle maps again elsewhere
  vm->unmap(base + page, 2 * page);
  vm->unmap(base + 3 * page, page);
  vm->release_physical(h1);
  vm->release_physical(h2);
  vm->release_address_range(base, 4 * page);
  vm->release_address_range(other, 2 * page);
}

// Where the backend maps parts of a handle: one handle whole at one place and its middle page at
// another at the same time, the same bytes through both, each mapping removed on its own.
void check_mapped_parts(BackendUnderTest& t) {
  VirtualMemory* vm = t.backend->virtual_memory();
  if (vm == nullptr || !vm->maps_parts()) return;  // optional: nothing to check
  const std::size_t page = vm->page_size();
  const Address base = vm->reserve_address_range(3 * page, page);
  const Address other = vm->reserve_address_range(2 * page, page);
  REQUIRE(base != 0);
  REQUIRE(other != 0);
  const PhysicalHandle h = vm->create_physical(3 * page);
  REQUIRE(h != 0);
  vm->map(base, 3 * page, h);
  vm->map_part(other + page, page, h, page);  // its middle page, a second time
  CHECK_THROWS_AS(vm->map_part(other, 2 * page, h, 2 * page), DeviceError);  // past the handle's end
  if (t.backend->holds_contents()) {
    const unsigned char written[4] = {7, 1, 9, 3};
    t.backend->copy_to_device(other + page + 16, written, sizeof written);
    unsigned char read[4] = {};
    t.backend->copy_to_host(read, base + page + 16, sizeof read);
    CHECK(std::equal(std::begin(read), std::end(read), std::begin(written)));
  }
  vm->unmap(base, 3 * page);  // the part stays mapped
  if (t.backend->holds_contents()) {
    unsigned char read[4] = {};
    t.backend->copy_to_host(read, other + page + 16, sizeof read);
    CHECK(read[2] == 9);
  }
  vm->unmap(other + page, page);
  vm->release_physical(h);
  vm->release_address_range(base, 3 * page);
  vm->release_address_range(other, 2 * page);
}

void check_virtual_memory_oom(BackendUnderTest& t) {
  VirtualMemory* vm = t.backend->virtual_memory();
  if (vm == nullptr) return;
  const std::size_t page = vm->page_size();
  CHECK(vm->create_physical(round_up(t.backend->properties().capacity + 1, page)) == 0);  // not a throw
  const PhysicalHandle h = vm->create_physical(page);  // and the device still serves what fits
  REQUIRE(h != 0);
  vm->release_physical(h);
}

}  // namespace

BackendUnderTest over_simulated_device(std::shared_ptr<DeviceBackend> backend,
                                       std::shared_ptr<SimulatedDevice> sim, EventMode mode) {
  BackendUnderTest t;
  t.backend = std::move(backend);
  t.new_stream = [sim] { return sim->create_stream(); };
  t.finish = [sim](Stream s) { sim->complete_stream(s); };
  t.work_stays_pending = mode == EventMode::manual;
  return t;
}

void check_device_backend(const BackendFactory& make) {
  BackendUnderTest t = make();
  REQUIRE(t.backend != nullptr);
  SECTION("properties: a named device with a capacity, a granularity and an alignment") {
    check_properties(t);
  }
  SECTION("segments: aligned, disjoint, device memory, freed on their stream") { check_segments(t); }
  SECTION("segments: out of memory is nullptr, not an exception, and a free makes room") {
    check_out_of_memory(t);
  }
  SECTION("segments: a free of memory the backend did not hand out throws DeviceError") {
    check_bad_free(t);
  }
  SECTION("events: complete when never recorded, then in the order recorded on a stream") {
    check_event_order(t);
  }
  SECTION("events: stream and device synchronization complete the recorded work") {
    check_synchronize(t);
  }
  SECTION("streams: a wait orders one stream after another's event without blocking the host") {
    check_stream_wait(t);
  }
  SECTION("streams: a query says whether a stream's work is done, without waiting") { check_stream_query(t); }
  SECTION("virtual memory (where the backend has it): reserve, create, map, unmap, release") {
    check_virtual_memory(t);
  }
  SECTION("virtual memory (where the backend maps parts of a handle): a handle at two places") {
    check_mapped_parts(t);
  }
  SECTION("virtual memory (where the backend has it): out of memory is handle 0") {
    check_virtual_memory_oom(t);
  }
  if (t.after_each) t.after_each();
}

}  // namespace tensorpool::conformance

// Observers receive every event with address, sizes, stream and time; removal stops them.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

struct Recorder : Observer {
  std::vector<AllocatorEvent> events;
  void on_event(const AllocatorEvent& e) noexcept override { events.push_back(e); }
  std::vector<EventType> types() const {
    std::vector<EventType> t;
    for (const auto& e : events) t.push_back(e.type);
    return t;
  }
};

}  // namespace

TEST_CASE("observers see allocs, record_stream, frees, segments, empty_cache and OOMs", "[hooks]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 64 * MiB});
  Allocator alloc(device, Config::parse("mode:fixed"));  // segment events of fixed segments
  auto rec = std::make_shared<Recorder>();
  const HookId id = alloc.add_observer(rec);
  const Stream s = device->create_stream();
  const Stream other = device->create_stream();

  void* p = alloc.allocate(3000, s);
  using T = EventType;
  REQUIRE(rec->types() == std::vector<T>{T::segment_alloc, T::alloc});
  REQUIRE(rec->events[0].size == 2 * MiB);
  REQUIRE(rec->events[1].address == reinterpret_cast<Address>(p));
  REQUIRE(rec->events[1].requested == 3000);
  REQUIRE(rec->events[1].size == 3072);
  REQUIRE(rec->events[1].stream == s);

  alloc.record_stream(p, other);
  REQUIRE(rec->types().back() == T::record_stream);
  REQUIRE(rec->events.back().address == reinterpret_cast<Address>(p));
  REQUIRE(rec->events.back().requested == 3000);
  REQUIRE(rec->events.back().stream == other);
  alloc.deallocate(p);
  REQUIRE(rec->types().back() == T::free_requested);  // completion waits for `other`
  device->complete_stream(other);
  alloc.empty_cache();
  REQUIRE(rec->types() == std::vector<T>{T::segment_alloc, T::alloc, T::record_stream,
                                         T::free_requested, T::free_completed, T::segment_free,
                                         T::empty_cache});
  REQUIRE(rec->events[4].requested == 3000);

  REQUIRE_THROWS_AS(alloc.allocate(100 * MiB), OutOfMemoryError);
  REQUIRE(rec->types().back() == T::oom);
  REQUIRE(rec->events.back().requested == 100 * MiB);

  for (std::size_t i = 1; i < rec->events.size(); ++i)
    REQUIRE(rec->events[i].time_ns >= rec->events[i - 1].time_ns);

  REQUIRE(alloc.remove_hook(id));
  const auto n = rec->events.size();
  alloc.deallocate(alloc.allocate(512));
  REQUIRE(rec->events.size() == n);
}

// Sleep and wake (Allocator::sleep/wake, src/core/vmm_sleep.cpp) on the simulated device: the
// physical memory goes back to the device, live blocks keep their addresses, blocks freed while
// asleep are forgotten, requests made while asleep get other memory, and wake maps pages back
// or changes nothing; the invariants hold after every call.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/deterministic.hpp"
#include "support/sim_allocator.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

using Sim = testing::SimAllocator;

// Once every block is freed: empty_cache gives the device all of its memory back, consistently.
void require_all_given_back(Allocator& alloc, SimulatedDevice& device) {
  alloc.empty_cache();
  alloc.check_invariants();
  REQUIRE(alloc.usage().reserved == 0);
  REQUIRE(device.free_memory() == device.properties().capacity);
}

// A pattern that differs per block and per byte.
std::vector<unsigned char> pattern(std::size_t n, std::size_t seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 7919) >> 3);
  return v;
}

std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 3) {
    case 0: return 512 + rng() % (64 * KiB);
    case 1: return MiB + rng() % (8 * MiB);
    default: return 16 * MiB + rng() % (64 * MiB);
  }
}

}  // namespace

TEST_CASE("sleep: fixed segments refuse sleep and wake, naming the mode", "[sleep]") {
  Sim sim(Mode::fixed);
  void* p = sim.alloc.allocate(MiB);
  const Stats before = sim.alloc.stats();
  REQUIRE_THROWS_WITH(sim.alloc.sleep(), Catch::Contains("mode:vmm"));
  REQUIRE_THROWS_AS(sim.alloc.wake(), UsageError);
  REQUIRE(sim.alloc.stats().upstream_frees == before.upstream_frees);
  sim.alloc.check_invariants();
  sim.alloc.deallocate(p);
}

TEST_CASE("sleep: wake without sleep is a usage error and changes nothing", "[sleep]") {
  Sim sim;
  void* p = sim.alloc.allocate(3 * MiB);
  const Stats before = sim.alloc.stats();
  REQUIRE_THROWS_WITH(sim.alloc.wake(), Catch::Contains("without sleep()"));
  REQUIRE(sim.alloc.stats().vm_maps == before.vm_maps);
  REQUIRE_FALSE(sim.alloc.is_asleep(p));
  sim.alloc.check_invariants();
  sim.alloc.deallocate(p);
}

TEST_CASE("sleep: a wake after a sleep that found no heap is no misuse, and a second wake is", "[sleep]") {
  // No heap to put to sleep (nothing allocated yet), or only empty ones (a heap, once made,
  // stays: after empty_cache() it sleeps empty, which made its wake valid already). Found by the
  // differential test (seed 62002) in the first case: the sleep was made, so its wake is no
  // usage error, whatever that sleep had to release.
  Sim sim;
  SECTION("nothing allocated yet") {}
  SECTION("every heap given back") {
    sim.alloc.deallocate(sim.alloc.allocate(3 * MiB));
    sim.alloc.empty_cache();
    REQUIRE(sim.alloc.usage().reserved == 0);
  }
  const SleepReport r = sim.alloc.sleep();
  REQUIRE(r.asleep_blocks == 0);
  REQUIRE(r.asleep_bytes == 0);
  const Stats before = sim.alloc.stats();
  sim.alloc.wake();
  REQUIRE(sim.alloc.stats().vm_maps == before.vm_maps);
  REQUIRE_THROWS_WITH(sim.alloc.wake(), Catch::Contains("without sleep()"));
  sim.alloc.check_invariants();
  // A block made after it is awake and usable as any.
  void* p = sim.alloc.allocate(MiB);
  REQUIRE_FALSE(sim.alloc.is_asleep(p));
  sim.alloc.deallocate(p);
  require_all_given_back(sim.alloc, *sim.device);
}

TEST_CASE("sleep: every page goes back, live blocks keep their addresses, and wake maps them back",
          "[sleep]") {
  Sim sim;
  const std::size_t capacity = sim.device->properties().capacity;
  void* a = sim.alloc.allocate(5 * MiB);
  void* b = sim.alloc.allocate(700 * KiB);
  void* gone = sim.alloc.allocate(40 * MiB);
  sim.alloc.deallocate(gone);  // cached: released by sleep too
  const std::size_t live = sim.alloc.usage().allocated;
  const SleepReport r = sim.alloc.sleep();
  sim.alloc.check_invariants();
  REQUIRE(sim.device->free_memory() == capacity);
  REQUIRE(sim.alloc.usage().reserved == 0);
  REQUIRE(r.asleep_blocks == 2);
  REQUIRE(r.asleep_allocated == live);
  REQUIRE(r.asleep_bytes >= live);
  REQUIRE(r.released_bytes >= r.asleep_bytes + 40 * MiB);
  REQUIRE(sim.alloc.is_asleep(a));
  REQUIRE(sim.alloc.is_asleep(b));
  std::size_t asleep_in_snapshot = 0;
  for (const SegmentInfo& seg : sim.alloc.snapshot().segments)
    for (const BlockInfo& info : seg.blocks)
      if (info.asleep && info.state == BlockState::allocated) asleep_in_snapshot += info.size;
  REQUIRE(asleep_in_snapshot == live);
  const Stats asleep = sim.alloc.stats();
  REQUIRE(asleep.asleep_bytes == r.asleep_bytes);
  REQUIRE(asleep.asleep_allocated == live);
  REQUIRE(sim.alloc.fragmentation().utilization == 1.0);  // nothing reserved

  SECTION("a second sleep does nothing") {
    const std::uint64_t unmaps = sim.alloc.stats().vm_unmaps;
    const SleepReport again = sim.alloc.sleep();
    REQUIRE(again.released_bytes == 0);
    REQUIRE(again.asleep_bytes == r.asleep_bytes);
    REQUIRE(sim.alloc.stats().vm_unmaps == unmaps);
  }
  SECTION("record_stream on an asleep block is refused") {
    REQUIRE_THROWS_WITH(sim.alloc.record_stream(a, sim.device->create_stream()), Catch::Contains("asleep"));
    sim.alloc.check_invariants();
  }
  sim.alloc.wake();
  sim.alloc.check_invariants();
  REQUIRE_FALSE(sim.alloc.is_asleep(a));
  REQUIRE(sim.alloc.asleep().asleep_bytes == 0);
  REQUIRE(sim.alloc.usage().reserved == r.asleep_bytes);
  REQUIRE(sim.device->free_memory() == capacity - r.asleep_bytes);
  sim.alloc.deallocate(a);
  sim.alloc.deallocate(b);
  require_all_given_back(sim.alloc, *sim.device);
}

TEST_CASE("sleep: only the pages under live blocks sleep, and the free pages beside them go back for good",
          "[sleep]") {
  auto device = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.capacity = GiB, .event_mode = EventMode::immediate, .back_memory = true});
  Allocator alloc(device, testing::deterministic_config("mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0"));
  void* whole = alloc.allocate(40 * MiB);  // one growth: one 40 MiB chunk
  const auto base = reinterpret_cast<Address>(whole);
  alloc.deallocate(whole);
  void* a = alloc.allocate(3 * MiB);         // [0, 3) MiB of the chunk
  void* pad = alloc.allocate(30 * MiB);      // [3, 33)
  void* b = alloc.allocate(3 * MiB / 2);     // [33, 34.5)
  REQUIRE(reinterpret_cast<Address>(a) == base);
  REQUIRE(reinterpret_cast<Address>(b) == base + 33 * MiB);
  alloc.deallocate(pad);
  REQUIRE(device->used_bytes() == 40 * MiB);
  const std::vector<unsigned char> bytes_a = pattern(3 * MiB, 1);
  const std::vector<unsigned char> bytes_b = pattern(3 * MiB / 2, 2);
  device->copy_to_device(reinterpret_cast<Address>(a), bytes_a.data(), bytes_a.size());
  device->copy_to_device(reinterpret_cast<Address>(b), bytes_b.data(), bytes_b.size());

  const SleepReport r = alloc.sleep(Contents::keep);
  alloc.check_invariants();
  REQUIRE(r.released_bytes == 40 * MiB);
  REQUIRE(r.asleep_bytes == 8 * MiB);  // pages [0, 4) and [32, 36): the rest held nothing
  alloc.wake();
  alloc.check_invariants();
  REQUIRE(device->used_bytes() == 8 * MiB);
  REQUIRE(alloc.usage().reserved == 8 * MiB);
  std::vector<unsigned char> back(bytes_a.size());
  device->copy_to_host(back.data(), reinterpret_cast<Address>(a), back.size());
  REQUIRE(back == bytes_a);
  back.resize(bytes_b.size());
  device->copy_to_host(back.data(), reinterpret_cast<Address>(b), back.size());
  REQUIRE(back == bytes_b);
  void* between = alloc.allocate(28 * MiB);  // the pages between them, mapped again where they lay
  REQUIRE(reinterpret_cast<Address>(between) == base + 3 * MiB);
  alloc.check_invariants();
  for (void* p : {a, b, between}) alloc.deallocate(p);
  require_all_given_back(alloc, *device);
}

TEST_CASE("sleep: an asleep heap whose lone block repeats keeps its record", "[sleep]") {
  // Found by the differential test: the epoch of one block that repeats stopped the record of a
  // heap that slept empty, and a heap that sleeps must record (a free of an asleep block is
  // counted in the record).
  Sim sim;
  const Stream s = sim.device->create_stream();
  sim.alloc.deallocate(sim.alloc.allocate(300 * KiB, s));
  sim.alloc.sleep();
  for (const std::size_t bytes : {5, 9, 5}) {
    sim.alloc.deallocate(sim.alloc.allocate(bytes, s));
    sim.alloc.check_invariants();
  }
  sim.alloc.wake();
  sim.alloc.check_invariants();
  require_all_given_back(sim.alloc, *sim.device);
}

TEST_CASE("sleep: is_asleep of a pointer the allocator did not hand out is a usage error", "[sleep]") {
  Sim sim;
  void* p = sim.alloc.allocate(MiB);
  sim.alloc.sleep();
  int local = 0;
  REQUIRE_THROWS_AS(sim.alloc.is_asleep(&local), UsageError);
  sim.alloc.wake();
  sim.alloc.deallocate(p);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: the device's work on a block freed in stream order completes before its pages go",
          "[sleep]") {
  Sim sim;
  void* p = sim.alloc.allocate(64 * MiB);
  void* keep = sim.alloc.allocate(MiB);
  const Stream other = sim.device->create_stream();
  sim.alloc.record_stream(p, other);
  sim.alloc.deallocate(p);  // waits for the other stream's work (manual events: not done yet)
  REQUIRE(sim.alloc.usage().active > sim.alloc.usage().allocated);
  const std::uint64_t device_syncs = sim.device->counters().device_syncs;
  const SleepReport r = sim.alloc.sleep();
  REQUIRE(sim.device->counters().device_syncs == device_syncs + 1);
  REQUIRE(sim.alloc.usage().active == sim.alloc.usage().allocated);  // the free completed
  REQUIRE(r.asleep_blocks == 1);
  REQUIRE(r.released_bytes >= 64 * MiB);
  sim.alloc.check_invariants();
  sim.alloc.wake();
  sim.alloc.deallocate(keep);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: a wake the device cannot give pages for fails with nothing changed", "[sleep]") {
  Sim sim(Mode::vmm, 1 * GiB);
  void* big = sim.alloc.allocate(600 * MiB);
  const SleepReport r = sim.alloc.sleep();
  void* other = sim.alloc.allocate(700 * MiB);  // other memory, while asleep
  REQUIRE(sim.alloc.is_asleep(big));
  REQUIRE_FALSE(sim.alloc.is_asleep(other));
  const Stats before = sim.alloc.stats();
  REQUIRE_THROWS_WITH(sim.alloc.wake(), Catch::Contains("wake() needs") && Catch::Contains("stays asleep"));
  sim.alloc.check_invariants();
  REQUIRE(sim.alloc.is_asleep(big));
  REQUIRE(sim.alloc.asleep().asleep_bytes == r.asleep_bytes);
  REQUIRE(sim.alloc.usage().reserved == static_cast<std::size_t>(before.total[Metric::reserved_bytes].current));
  sim.alloc.deallocate(other);
  sim.alloc.wake();  // room now
  sim.alloc.check_invariants();
  REQUIRE_FALSE(sim.alloc.is_asleep(big));
  sim.alloc.deallocate(big);
  require_all_given_back(sim.alloc, *sim.device);
}

TEST_CASE("sleep: a heap whose asleep blocks were all freed gets no pages back", "[sleep]") {
  Sim sim;
  const Stream s = sim.device->create_stream();
  void* p = sim.alloc.allocate(96 * MiB, s);
  void* q = sim.alloc.allocate(8 * MiB, s);
  void* stays = sim.alloc.allocate(4 * MiB);  // another stream's heap
  sim.alloc.sleep();
  sim.alloc.deallocate(p);  // forgotten
  sim.alloc.deallocate(q);
  sim.alloc.check_invariants();
  REQUIRE(sim.alloc.asleep().asleep_blocks == 1);
  const std::uint64_t maps = sim.alloc.stats().vm_maps;
  sim.alloc.wake();
  sim.alloc.check_invariants();
  REQUIRE(sim.alloc.usage().reserved <= 4 * MiB + 2 * MiB);  // the default stream's chunk only
  REQUIRE(sim.alloc.stats().vm_maps > maps);
  sim.alloc.deallocate(stays);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: 100 cycles of random blocks on two streams keep every address and leak nothing",
          "[sleep]") {
  Sim sim;
  const std::size_t capacity = sim.device->properties().capacity;
  std::mt19937_64 rng(2026);
  const Stream second = sim.device->create_stream();
  std::map<void*, Stream> live;
  auto allocate = [&](Stream s) {
    void* p = sim.alloc.allocate(random_size(rng), s);
    live.emplace(p, s);
  };
  auto free_some = [&](std::size_t n) {
    for (std::size_t i = 0; i < n && !live.empty(); ++i) {
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
      sim.alloc.deallocate(it->first);
      live.erase(it);
    }
  };
  for (int cycle = 0; cycle < 100; ++cycle) {
    INFO("cycle " << cycle);
    for (int i = 0; i < 6; ++i) allocate(rng() % 2 == 0 ? kDefaultStream : second);
    free_some(3);
    const std::map<void*, Stream> before = live;
    const SleepReport r = sim.alloc.sleep();
    sim.alloc.check_invariants();
    REQUIRE(r.asleep_blocks == before.size());
    REQUIRE(sim.device->free_memory() == capacity);  // nothing stays awake
    for (const auto& [p, s] : before) REQUIRE(sim.alloc.is_asleep(p));
    free_some(2);  // forgotten
    for (int i = 0; i < 2; ++i) allocate(second);  // other memory
    const std::size_t awake_reserved = sim.alloc.usage().reserved;
    REQUIRE(sim.device->free_memory() == capacity - awake_reserved);
    sim.alloc.check_invariants();
    sim.alloc.wake();
    sim.alloc.check_invariants();
    for (const auto& [p, s] : live) REQUIRE_FALSE(sim.alloc.is_asleep(p));  // same addresses, all live
    if (cycle % 10 == 9) sim.alloc.empty_cache();
  }
  free_some(live.size());
  require_all_given_back(sim.alloc, *sim.device);
  const auto& c = sim.device->counters();
  REQUIRE(c.physical_creates == c.physical_releases);
}

TEST_CASE("sleep: a heap that follows its plan sleeps in the middle of an epoch and plans again after",
          "[sleep]") {
  Sim sim;
  const Stream s = sim.device->create_stream();
  auto step = [&] {  // one epoch of the stream's large heap: the same three blocks every time
    void* a = sim.alloc.allocate(24 * MiB, s);
    void* b = sim.alloc.allocate(8 * MiB, s);
    sim.alloc.deallocate(a);
    void* c = sim.alloc.allocate(16 * MiB, s);
    sim.alloc.deallocate(b);
    sim.alloc.deallocate(c);
  };
  for (int i = 0; i < 4; ++i) step();
  const std::uint64_t maps = sim.alloc.stats().vm_maps;
  step();
  REQUIRE(sim.alloc.stats().vm_maps == maps);  // the plan's pages stay in place
  void* a = sim.alloc.allocate(24 * MiB, s);  // follows the plan
  sim.alloc.sleep();
  sim.alloc.check_invariants();
  void* b = sim.alloc.allocate(8 * MiB, s);  // other memory, no plan
  REQUIRE_FALSE(sim.alloc.is_asleep(b));
  sim.alloc.deallocate(a);  // forgotten
  sim.alloc.deallocate(b);  // the heap's epoch ends while part of it sleeps
  sim.alloc.check_invariants();
  sim.alloc.wake();
  sim.alloc.check_invariants();
  for (int i = 0; i < 4; ++i) step();
  sim.alloc.check_invariants();
  const std::uint64_t after = sim.alloc.stats().vm_maps;
  step();
  REQUIRE(sim.alloc.stats().vm_maps == after);  // steady again: no device call per step
}

TEST_CASE("sleep: a tag sleeps alone, and the other blocks keep their pages", "[sleep][tag]") {
  Sim sim;
  const std::size_t capacity = sim.device->properties().capacity;
  void* weights = sim.alloc.allocate(300 * MiB);
  std::vector<void*> kv;
  {
    Tag scope("test_sleep.kv");
    for (int i = 0; i < 8; ++i) kv.push_back(sim.alloc.allocate(20 * MiB + 4096 * static_cast<std::size_t>(i)));
    {
      Tag inner("test_sleep.scratch");
      void* s = sim.alloc.allocate(MiB);
      sim.alloc.deallocate(s);
    }
    kv.push_back(sim.alloc.allocate(MiB));  // the outer tag again
  }
  void* after = sim.alloc.allocate(MiB);  // no tag
  const std::size_t reserved = sim.alloc.usage().reserved;
  const SleepReport r = sim.alloc.sleep("test_sleep.kv");
  sim.alloc.check_invariants();
  REQUIRE(r.asleep_blocks == kv.size());
  for (void* p : kv) REQUIRE(sim.alloc.is_asleep(p));
  REQUIRE_FALSE(sim.alloc.is_asleep(weights));
  REQUIRE_FALSE(sim.alloc.is_asleep(after));
  REQUIRE(sim.alloc.usage().reserved == reserved - r.released_bytes);
  REQUIRE(sim.device->free_memory() == capacity - sim.alloc.usage().reserved);
  REQUIRE(sim.alloc.usage().reserved >= 300 * MiB);  // the weights stay

  SECTION("a second sleep of the tag does nothing; a wake of another tag is refused") {
    const std::uint64_t unmaps = sim.alloc.stats().vm_unmaps;
    REQUIRE(sim.alloc.sleep("test_sleep.kv").asleep_blocks == kv.size());
    REQUIRE(sim.alloc.stats().vm_unmaps == unmaps);
    REQUIRE_THROWS_WITH(sim.alloc.wake("test_sleep.scratch"), Catch::Contains("without a sleep of that tag"));
  }
  SECTION("sleep() puts the rest to sleep; wake(tag) wakes the tag's blocks alone") {
    sim.alloc.sleep();
    REQUIRE(sim.alloc.is_asleep(weights));
    REQUIRE(sim.device->free_memory() == capacity);
    sim.alloc.wake("test_sleep.kv");
    sim.alloc.check_invariants();
    REQUIRE_FALSE(sim.alloc.is_asleep(kv.front()));
    REQUIRE(sim.alloc.is_asleep(weights));
  }
  sim.alloc.wake();
  sim.alloc.check_invariants();
  for (void* p : kv) REQUIRE_FALSE(sim.alloc.is_asleep(p));
  REQUIRE_FALSE(sim.alloc.is_asleep(weights));
  for (void* p : kv) sim.alloc.deallocate(p);
  sim.alloc.deallocate(weights);
  sim.alloc.deallocate(after);
  require_all_given_back(sim.alloc, *sim.device);
}

TEST_CASE("sleep: a tag nothing was allocated under, and an empty tag name, are usage errors", "[sleep][tag]") {
  Sim sim;
  void* p = sim.alloc.allocate(MiB);
  const Stats before = sim.alloc.stats();
  REQUIRE_THROWS_WITH(sim.alloc.sleep("test_sleep.never"), Catch::Contains("no allocation was ever made"));
  REQUIRE_THROWS_WITH(sim.alloc.wake("test_sleep.never"), Catch::Contains("test_sleep.never"));
  REQUIRE_THROWS_AS(Tag(""), UsageError);
  REQUIRE(sim.alloc.stats().syncs == before.syncs);
  REQUIRE_FALSE(sim.alloc.is_asleep(p));
  sim.alloc.deallocate(p);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: tagged blocks come from their own segments in fixed mode too", "[sleep][tag]") {
  Sim sim(Mode::fixed);
  void* plain = sim.alloc.allocate(MiB);
  sim.alloc.deallocate(plain);
  void* tagged = nullptr;
  {
    Tag scope("test_sleep.fixed");
    tagged = sim.alloc.allocate(MiB);
  }
  REQUIRE(tagged != plain);  // the cached untagged block is not the tagged one
  REQUIRE(sim.alloc.snapshot().segments.size() == 2);
  REQUIRE_THROWS_WITH(sim.alloc.sleep("test_sleep.fixed"), Catch::Contains("mode:vmm"));
  sim.alloc.deallocate(tagged);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: an allocator destroyed while asleep gives everything back", "[sleep]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  {
    Config c;
    c.mode = Mode::vmm;
    Allocator alloc(device, c);
    void* p = alloc.allocate(50 * MiB);
    (void)p;  // never freed: teardown takes it
    {
      Tag scope("test_sleep.teardown");
      (void)alloc.allocate(10 * MiB);
    }
    alloc.sleep("test_sleep.teardown");
    (void)alloc.allocate(5 * MiB);  // awake memory beside it
  }
  const auto& c = device->counters();
  REQUIRE(c.physical_creates == c.physical_releases);
  REQUIRE(c.address_reserves == c.address_releases);
  REQUIRE(device->free_memory() == device->properties().capacity);
}

TEST_CASE("sleep: kept contents come back byte for byte, 100 cycles on two streams", "[sleep][keep]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB, .back_memory = true});
  Config config;
  config.mode = Mode::vmm;
  Allocator alloc(device, config);
  const Stream second = device->create_stream();
  std::mt19937_64 rng(99);
  struct Live {
    std::size_t bytes;
    std::size_t seed;
  };
  std::map<void*, Live> live;
  std::size_t seeds = 0;
  auto allocate = [&](Stream s) {
    const std::size_t n = rng() % 3 == 0 ? 100 + rng() % 5000 : MiB + rng() % (6 * MiB);
    void* p = alloc.allocate(n, s);
    const std::vector<unsigned char> bytes = pattern(n, ++seeds);
    device->copy_to_device(reinterpret_cast<Address>(p), bytes.data(), n);
    live.emplace(p, Live{n, seeds});
  };
  auto free_one = [&] {
    auto it = live.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
    alloc.deallocate(it->first);
    live.erase(it);
  };
  for (int cycle = 0; cycle < 100; ++cycle) {
    INFO("cycle " << cycle);
    for (int i = 0; i < 4; ++i) allocate(i % 2 == 0 ? kDefaultStream : second);
    while (live.size() > 10) free_one();
    std::size_t requested = 0;
    for (const auto& [p, l] : live) requested += l.bytes;
    const SleepReport r = alloc.sleep(Contents::keep);
    REQUIRE(r.kept_bytes == requested);
    REQUIRE(device->free_memory() == device->properties().capacity);
    alloc.check_invariants();
    free_one();                // forgotten, its kept bytes given back
    allocate(second);          // other memory, written while the rest sleeps
    alloc.check_invariants();
    alloc.wake();
    alloc.check_invariants();
    for (const auto& [p, l] : live) {
      std::vector<unsigned char> back(l.bytes);
      device->copy_to_host(back.data(), reinterpret_cast<Address>(p), l.bytes);
      REQUIRE(back == pattern(l.bytes, l.seed));
    }
  }
  while (!live.empty()) free_one();
  require_all_given_back(alloc, *device);
}

TEST_CASE("sleep: a device without contents keeps nothing, and says so", "[sleep][keep]") {
  Sim sim;  // bookkeeping only
  void* p = sim.alloc.allocate(MiB);
  REQUIRE_FALSE(sim.device->holds_contents());
  REQUIRE_THROWS_WITH(sim.device->copy_to_host(nullptr, reinterpret_cast<Address>(p), 16), Catch::Contains("back_memory"));
  const SleepReport r = sim.alloc.sleep(Contents::keep);
  REQUIRE(r.kept_bytes == 0);
  REQUIRE(r.asleep_blocks == 1);
  sim.alloc.wake();
  sim.alloc.deallocate(p);
  sim.alloc.check_invariants();
}

TEST_CASE("sleep: a map refused half way through a wake gives back what it made, and everything stays asleep",
          "[sleep]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB, .back_memory = true});
  Config config;
  config.mode = Mode::vmm;
  Allocator alloc(device, config);
  std::vector<void*> live;
  for (int i = 0; i < 6; ++i) live.push_back(alloc.allocate(40 * MiB));
  const std::vector<unsigned char> bytes = pattern(MiB, 5);
  device->copy_to_device(reinterpret_cast<Address>(live[3]), bytes.data(), bytes.size());
  const SleepReport r = alloc.sleep(Contents::keep);
  const auto creates = device->counters().physical_creates;
  const auto releases = device->counters().physical_releases;
  device->fail_nth(FaultSite::map, 2);  // the second map of the wake
  REQUIRE_THROWS_AS(alloc.wake(), DeviceError);
  alloc.check_invariants();
  REQUIRE(alloc.asleep().asleep_bytes == r.asleep_bytes);
  REQUIRE(alloc.asleep().kept_bytes == r.kept_bytes);
  REQUIRE(device->counters().physical_creates - creates == device->counters().physical_releases - releases);
  REQUIRE(device->free_memory() == device->properties().capacity);
  for (void* p : live) REQUIRE(alloc.is_asleep(p));
  alloc.wake();  // no fault now
  alloc.check_invariants();
  std::vector<unsigned char> back(MiB);
  device->copy_to_host(back.data(), reinterpret_cast<Address>(live[3]), back.size());
  REQUIRE(back == bytes);
  for (void* p : live) alloc.deallocate(p);
}

TEST_CASE("sleep: a wake refused its n-th creation goes on, and one refused its n-th map changes nothing, for every n",
          "[sleep][faults]") {
  // Six 5 MiB blocks 8 MiB apart on one stream and one on another: seven runs of sleeping pages,
  // so a wake makes seven chunks, and a fault may hit any of them.
  struct Setup {
    std::shared_ptr<SimulatedDevice> device = std::make_shared<SimulatedDevice>(
        SimulatedDeviceOptions{.capacity = GiB, .event_mode = EventMode::immediate, .back_memory = true});
    Allocator alloc{device, testing::deterministic_config("mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0")};
    std::vector<void*> live;
    SleepReport report;
    Setup() {
      std::vector<void*> pads;
      for (std::size_t i = 0; i < 6; ++i) {
        live.push_back(alloc.allocate(5 * MiB));
        pads.push_back(alloc.allocate(3 * MiB));
      }
      for (void* p : pads) alloc.deallocate(p);
      live.push_back(alloc.allocate(3 * MiB, device->create_stream()));
      for (std::size_t i = 0; i < live.size(); ++i) {
        const std::vector<unsigned char> bytes = pattern(MiB, i);
        device->copy_to_device(reinterpret_cast<Address>(live[i]), bytes.data(), bytes.size());
      }
      report = alloc.sleep(Contents::keep);
    }
    bool contents_back() const {
      for (std::size_t i = 0; i < live.size(); ++i) {
        std::vector<unsigned char> back(MiB);
        device->copy_to_host(back.data(), reinterpret_cast<Address>(live[i]), back.size());
        if (back != pattern(MiB, i)) return false;
      }
      return true;
    }
  };
  std::uint64_t chunks = 0;
  {
    Setup clean;
    const std::uint64_t creates = clean.device->counters().physical_creates;
    clean.alloc.wake();
    chunks = clean.device->counters().physical_creates - creates;
    REQUIRE(clean.contents_back());
  }
  REQUIRE(chunks == 7);
  for (const FaultSite site : {FaultSite::physical_create, FaultSite::map}) {
    for (std::uint64_t n = 1; n <= chunks + 1; ++n) {
      INFO("fault site " << static_cast<int>(site) << ", call " << n);
      Setup s;
      s.device->fail_nth(site, n);
      // A refused creation is tried again once the cache is given back (it holds nothing here,
      // and the device fails the n-th call only): the wake goes on. A refused map ends it.
      if (site == FaultSite::map && n <= chunks) {
        REQUIRE_THROWS_AS(s.alloc.wake(), DeviceError);
        s.alloc.check_invariants();
        REQUIRE(s.alloc.asleep().asleep_bytes == s.report.asleep_bytes);
        REQUIRE(s.alloc.asleep().asleep_blocks == s.live.size());
        REQUIRE(s.device->used_bytes() == 0);
        REQUIRE(s.device->mapped_bytes() == 0);
        for (void* p : s.live) REQUIRE(s.alloc.is_asleep(p));
        s.device->fail_nth(site, 0);
      }
      s.alloc.wake();
      s.alloc.check_invariants();
      REQUIRE(s.alloc.usage().reserved == s.report.asleep_bytes);
      REQUIRE(s.contents_back());
      for (void* p : s.live) s.alloc.deallocate(p);
      s.alloc.empty_cache();
      REQUIRE(s.device->used_bytes() == 0);
    }
  }
}

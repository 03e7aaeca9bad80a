// Stitching under pressure (vmm_stitch, src/core/vmm_stitch.cpp): where the device has no memory
// left, the whole free pages of partly used chunks are mapped again, side by side, for a request
// no free block holds: no new memory, one map per run; the pages are not handed out where they
// lie meanwhile; empty_cache(), sleep() and the allocator's end give them back or unmap them in
// order; a refused map changes nothing.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "support/deterministic.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

Address addr(const void* p) { return reinterpret_cast<Address>(p); }

// One chunk of 14 MiB holding seven 2 MiB blocks, every other one freed: 6 MiB free in three
// whole pages that no reclaim can give back (the chunk holds live blocks), and 2 MiB left on a
// 16 MiB device (or `capacity`, less `external` used by someone else).
struct Scattered {
  explicit Scattered(const char* conf = "mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0",
                     std::size_t capacity = 16 * MiB, std::size_t external = 0)
      : device(std::make_shared<SimulatedDevice>(
            SimulatedDeviceOptions{.capacity = capacity, .event_mode = EventMode::immediate, .back_memory = true})),
        alloc(device, testing::deterministic_config(conf)) {
    device->set_external_usage(external);
    void* whole = alloc.allocate(14 * MiB);  // one growth: one chunk
    base = addr(whole);
    alloc.deallocate(whole);
    for (int i = 0; i < 7; ++i) blocks.push_back(alloc.allocate(2 * MiB));
    for (int i = 1; i < 7; i += 2) alloc.deallocate(blocks[static_cast<std::size_t>(i)]);
    REQUIRE(device->used_bytes() == 14 * MiB);
    alloc.check_invariants();
  }
  void fill(void* p, unsigned char value, std::size_t bytes) {
    std::vector<unsigned char> v(bytes, value);
    device->copy_to_device(addr(p), v.data(), bytes);
  }
  bool holds(const void* p, unsigned char value, std::size_t bytes) {
    std::vector<unsigned char> v(bytes);
    device->copy_to_host(v.data(), addr(p), bytes);
    for (unsigned char c : v)
      if (c != value) return false;
    return true;
  }
  /// Writes into each live block (0, 2, 4, 6) its own byte, its index + 1.
  void mark_live() {
    for (int i = 0; i < 7; i += 2) fill(blocks[static_cast<std::size_t>(i)], static_cast<unsigned char>(i + 1), 2 * MiB);
  }
  /// Whether each live block still holds what mark_live() wrote.
  bool live_intact() {
    for (int i = 0; i < 7; i += 2)
      if (!holds(blocks[static_cast<std::size_t>(i)], static_cast<unsigned char>(i + 1), 2 * MiB)) return false;
    return true;
  }
  void free_live() {
    for (int i = 0; i < 7; i += 2) alloc.deallocate(blocks[static_cast<std::size_t>(i)]);
  }
  /// Frees the live blocks and empties the cache: nothing is left reserved, used or mapped.
  void expect_all_given_back() {
    free_live();
    alloc.empty_cache();
    alloc.check_invariants();
    REQUIRE(alloc.usage().reserved == 0);
    REQUIRE(device->used_bytes() == 0);
    REQUIRE(device->mapped_bytes() == 0);
  }
  /// One of the three free pages of the chunk (what a stitch lends).
  bool lent_page(const void* p) const {
    return addr(p) == base + 2 * MiB || addr(p) == base + 6 * MiB || addr(p) == base + 10 * MiB;
  }
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
  Address base = 0;
  std::vector<void*> blocks;  // 0, 2, 4, 6 live
};

}  // namespace

TEST_CASE("stitch: a request no free block holds is served from free pages mapped again", "[vmm][stitch]") {
  Scattered s;
  const std::uint64_t creates = s.device->counters().physical_creates;
  const std::uint64_t maps = s.device->counters().maps;
  void* p = s.alloc.allocate(6 * MiB);
  REQUIRE(addr(p) == s.base + 14 * MiB);                       // after the chunk, in the top hole
  REQUIRE(s.device->counters().physical_creates == creates);   // no new memory
  REQUIRE(s.device->counters().maps == maps + 3);              // one map per page run
  REQUIRE(s.alloc.stats().stitches == 1);
  REQUIRE(s.device->used_bytes() == 14 * MiB);
  REQUIRE(s.alloc.usage().reserved == 14 * MiB);
  s.alloc.check_invariants();
  // Its bytes are the free pages' own: the live blocks around them keep theirs.
  s.mark_live();
  s.fill(p, 0xAB, 6 * MiB);
  REQUIRE(s.live_intact());
  REQUIRE(s.holds(p, 0xAB, 6 * MiB));
  // The snapshot shows the pages once: mapped where the request has them, not where they lie.
  std::size_t mapped = 0;
  for (const SegmentInfo& seg : s.alloc.snapshot().segments)
    for (const BlockInfo& b : seg.blocks)
      if (b.mapped) mapped += b.size;
  REQUIRE(mapped == s.device->used_bytes());
  // Where they lie, the pages are handed out to no one: a 2 MiB request grows (the 2 MiB left).
  void* q = s.alloc.allocate(2 * MiB);
  REQUIRE(addr(q) >= s.base + 20 * MiB);
  REQUIRE(s.device->used_bytes() == 16 * MiB);
  s.alloc.check_invariants();
  s.alloc.deallocate(q);
  s.alloc.deallocate(p);
  s.expect_all_given_back();
}

TEST_CASE("stitch: the device's last pages and the free ones together serve a request", "[vmm][stitch]") {
  Scattered s;
  // 8 MiB: the 2 MiB the device has left (less than the chunk the request asks for), mapped at
  // the top, and the chunk's 6 MiB of free pages stitched after them.
  void* p = s.alloc.allocate(8 * MiB);
  REQUIRE(addr(p) == s.base + 14 * MiB);
  REQUIRE(s.alloc.stats().stitches == 1);
  REQUIRE(s.alloc.stats().ooms == 0);
  REQUIRE(s.device->used_bytes() == 16 * MiB);
  REQUIRE(s.alloc.usage().reserved == 16 * MiB);
  s.alloc.check_invariants();
  s.mark_live();
  s.fill(p, 0xCD, 8 * MiB);
  REQUIRE(s.live_intact());
  REQUIRE(s.holds(p, 0xCD, 8 * MiB));
  s.alloc.deallocate(p);
  s.expect_all_given_back();
}

TEST_CASE("stitch: a map refused at any call of a stitch with the device's last pages loses nothing",
          "[vmm][stitch][faults]") {
  // The 8 MiB request of the test above makes four maps: the device's last page, then the
  // chunk's three free pages. Each is refused in turn (and, as a check of the sweep, a fifth
  // that is never reached).
  int refused = 0;
  for (std::uint64_t n = 1; n <= 5; ++n) {
    INFO("map call " << n << " of the stitch refused");
    Scattered s;
    s.mark_live();
    s.device->fail_nth(FaultSite::map, n);
    void* p = nullptr;
    try {
      p = s.alloc.allocate(8 * MiB);
      REQUIRE(s.device->counters().faults_injected == 0);  // served: no call was refused
    } catch (const DeviceError&) {
      REQUIRE(n <= 4);
      ++refused;
    }
    s.alloc.check_invariants();
    // What is mapped is accounted for, lent or not, and the live blocks keep their bytes.
    REQUIRE(s.alloc.usage().reserved == s.device->used_bytes());
    REQUIRE(s.live_intact());
    if (p == nullptr) p = s.alloc.allocate(8 * MiB);  // the next try is served the same way
    REQUIRE(addr(p) == s.base + 14 * MiB);
    REQUIRE(s.device->used_bytes() == 16 * MiB);
    s.alloc.check_invariants();
    s.fill(p, 0xCD, 8 * MiB);
    REQUIRE(s.live_intact());
    s.alloc.deallocate(p);
    s.expect_all_given_back();
  }
  REQUIRE(refused == 4);  // every map of the stitch was refused once, and said so
}

TEST_CASE("stitch: the free block after a hole lends its pages when the request stops short of it",
          "[vmm][stitch]") {
  auto device = std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.capacity = 64 * MiB, .event_mode = EventMode::immediate});
  Allocator alloc(device, testing::deterministic_config("mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0"));
  void* c1 = alloc.allocate(14 * MiB);  // one chunk each
  void* c2 = alloc.allocate(8 * MiB);
  void* c3 = alloc.allocate(10 * MiB);
  const Address base = addr(c1);
  alloc.deallocate(c3);
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(alloc.allocate(2 * MiB));  // c3's chunk, in five
  REQUIRE(addr(p[0]) == base + 22 * MiB);
  alloc.deallocate(p[0]);
  alloc.deallocate(p[2]);
  alloc.deallocate(c2);
  alloc.empty_cache();  // c2's chunk, free whole, goes: a hole at 14-22 MiB, free pages at 22 and 26
  REQUIRE(device->used_bytes() == 24 * MiB);
  device->set_external_usage(64 * MiB - device->used_bytes());  // nothing left to create
  // 4 MiB: no free block holds it; in the hole it needs 4 of its 8 MiB, so it stops short of the
  // free page after the hole, which lends itself with the one at 26 MiB.
  void* q = alloc.allocate(4 * MiB);
  REQUIRE(addr(q) == base + 14 * MiB);
  REQUIRE(alloc.stats().stitches == 1);
  REQUIRE(device->used_bytes() == 24 * MiB);
  alloc.check_invariants();
  alloc.deallocate(q);
  for (int i : {1, 3, 4}) alloc.deallocate(p[static_cast<std::size_t>(i)]);
  alloc.deallocate(c1);
  alloc.empty_cache();
  alloc.check_invariants();
  REQUIRE(device->used_bytes() == 0);
}

TEST_CASE("stitch: off, the same request is out of memory", "[vmm][stitch]") {
  Scattered s("mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0,vmm_stitch:false");
  try {
    s.alloc.allocate(6 * MiB);
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    // 6 MiB free in pages the live blocks share: the hint says why, not "try the virtual-memory mode".
    REQUIRE(e.info().page_size == 2 * MiB);
    REQUIRE(e.info().reserved_unallocated == 6 * MiB);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("pages that live blocks share") &&
                             Catch::Matchers::Contains("whole pages of 2.00 MiB") &&
                             !Catch::Matchers::Contains("virtual-memory mode"));
  }
  REQUIRE(s.alloc.stats().stitches == 0);
  s.alloc.check_invariants();
}

TEST_CASE("stitch: empty_cache gives a free stitched range's pages back where they lie", "[vmm][stitch]") {
  Scattered s;
  void* p = s.alloc.allocate(6 * MiB);
  s.alloc.deallocate(p);
  const std::uint64_t unmaps = s.device->counters().unmaps;
  s.alloc.empty_cache();
  REQUIRE(s.device->counters().unmaps == unmaps + 3);
  REQUIRE(s.device->mapped_bytes() == 14 * MiB);  // the chunk stays: it holds live blocks
  s.alloc.check_invariants();
  void* q = s.alloc.allocate(2 * MiB);  // a lent page, free again where it lies
  REQUIRE(s.lent_page(q));
  REQUIRE(s.device->used_bytes() == 14 * MiB);
  s.alloc.deallocate(q);
  s.expect_all_given_back();
}

TEST_CASE("stitch: the allocator's end unmaps stitched ranges before it releases their memory", "[vmm][stitch]") {
  std::shared_ptr<SimulatedDevice> device;
  {
    Scattered s;
    device = s.device;
    REQUIRE(s.alloc.allocate(6 * MiB) != nullptr);  // left live, with the blocks around it
    REQUIRE(device->mapped_bytes() == 20 * MiB);
  }
  REQUIRE(device->mapped_bytes() == 0);
  REQUIRE(device->used_bytes() == 0);
}

TEST_CASE("stitch: a stitched block sleeps and wakes with its contents, and its lent pages wake once", "[vmm][stitch][sleep]") {
  Scattered s("mode:vmm,vmm_chunk_divisor:0,vmm_plan_max_blocks:0", 32 * MiB, 16 * MiB);
  void* p = s.alloc.allocate(6 * MiB);
  s.fill(p, 0x5C, 6 * MiB);
  s.fill(s.blocks[2], 0x11, 2 * MiB);
  s.alloc.sleep(Contents::keep);
  s.alloc.check_invariants();
  REQUIRE(s.device->used_bytes() == 0);
  s.device->set_external_usage(0);
  s.alloc.wake();
  s.alloc.check_invariants();
  REQUIRE(s.holds(p, 0x5C, 6 * MiB));
  REQUIRE(s.holds(s.blocks[2], 0x11, 2 * MiB));
  // The pages under live blocks woke, once each: four of the chunk's and the stitched range's
  // three. The lent pages, free where they lie, stayed with the device.
  REQUIRE(s.device->used_bytes() == 14 * MiB);
  void* q = s.alloc.allocate(2 * MiB);  // a growth maps one of them again, where it lay
  REQUIRE(s.lent_page(q));
  REQUIRE(s.device->used_bytes() == 16 * MiB);
  s.alloc.deallocate(q);
  s.alloc.deallocate(p);
  s.expect_all_given_back();
}

TEST_CASE("stitch: a refused map leaves the heap as it was", "[vmm][stitch]") {
  Scattered s;
  const std::size_t mapped = s.device->mapped_bytes();
  s.device->fail_nth(FaultSite::map, 2);  // the second page run
  REQUIRE_THROWS_AS(s.alloc.allocate(6 * MiB), DeviceError);
  REQUIRE(s.device->mapped_bytes() == mapped);
  s.alloc.check_invariants();
  void* p = s.alloc.allocate(6 * MiB);  // and the next try stitches
  REQUIRE(addr(p) == s.base + 14 * MiB);
  s.alloc.check_invariants();
  s.alloc.deallocate(p);
}

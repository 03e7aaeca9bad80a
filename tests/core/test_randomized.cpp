// Randomized test: 120k seeded operations over several streams with record_stream, out-of-order
// event completion, empty_cache, a memory limit and injected upstream faults. After every
// operation check_invariants() runs, and a shadow model checks that live blocks never overlap
// and are large enough. At the end everything is freed and reserved memory returns to zero.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "support/deterministic.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

struct Live {
  std::size_t size;
  Stream stream;
};

// LLM-like sizes: many small activations/bias tensors, fewer medium, a few large.
std::size_t random_size(std::mt19937_64& rng) {
  const unsigned r = static_cast<unsigned>(rng() % 100);
  if (r < 55) return 1 + rng() % (256 * KiB);
  if (r < 80) return 256 * KiB + rng() % (MiB);
  if (r < 95) return MiB + rng() % (12 * MiB);
  return 12 * MiB + rng() % (80 * MiB);
}

void run_random(std::uint64_t seed, int operations, const char* conf) {
  INFO("seed " << seed << ", config " << conf);
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 2 * GiB});
  Allocator alloc(device, testing::deterministic_config(conf));
  std::mt19937_64 rng(seed);
  std::vector<Stream> streams = {kDefaultStream, device->create_stream(), device->create_stream(),
                                 device->create_stream()};
  std::map<Address, Live> live;  // shadow model
  std::vector<Address> order;
  std::uint64_t ooms = 0;
  std::uint64_t device_errors = 0;
  std::vector<FaultSite> armed;
  auto pick_live = [&]() -> Address {
    const std::size_t i = rng() % order.size();
    const Address a = order[i];
    order[i] = order.back();
    order.pop_back();
    return a;
  };

  for (int op = 0; op < operations; ++op) {
    const unsigned r = static_cast<unsigned>(rng() % 1000);
    if (r < 480 || live.empty()) {
      const std::size_t size = random_size(rng);
      const Stream s = streams[rng() % streams.size()];
      try {
        const auto a = reinterpret_cast<Address>(alloc.allocate(size, s));
        // The shadow model: no overlap with any live block.
        auto next = live.lower_bound(a);
        REQUIRE((next == live.end() || next->first >= a + size));
        if (next != live.begin()) REQUIRE(std::prev(next)->first + std::prev(next)->second.size <= a);
        live.emplace(a, Live{size, s});
        order.push_back(a);
      } catch (const OutOfMemoryError&) {
        ++ooms;
      } catch (const DeviceError&) {
        ++device_errors;  // an injected map failure surfaces as DeviceError (vmm mode)
      }
    } else if (r < 900) {
      const Address a = pick_live();
      live.erase(a);
      alloc.deallocate(reinterpret_cast<void*>(a));
    } else if (r < 950) {
      alloc.record_stream(reinterpret_cast<void*>(order[rng() % order.size()]),
                          streams[rng() % streams.size()]);
    } else if (r < 985) {
      device->complete_stream(streams[rng() % streams.size()]);
    } else if (r < 990) {
      alloc.empty_cache();
    } else if (r < 995) {
      const FaultSite sites[] = {FaultSite::segment_alloc, FaultSite::physical_create, FaultSite::map};
      const FaultSite site = sites[rng() % 3];
      device->fail_nth(site, 1 + rng() % 5);
      armed.push_back(site);
    } else {
      device->fail_nth(FaultSite::event_create, 1 + rng() % 5);
    }
    alloc.check_invariants();
  }
  for (const Address a : order) alloc.deallocate(reinterpret_cast<void*>(a));
  for (FaultSite site : {FaultSite::segment_alloc, FaultSite::physical_create, FaultSite::map, FaultSite::event_create})
    device->fail_nth(site, 0);
  alloc.empty_cache();
  alloc.check_invariants();
  const Stats s = alloc.stats();
  // Only the configured vmm_reserve may stay mapped (fixed mode: nothing).
  const auto kept = static_cast<std::size_t>(s.total[Metric::reserved_bytes].current);
  REQUIRE(kept <= alloc.config().vmm_reserve);
  REQUIRE(s.total[Metric::active_bytes].current == 0);
  REQUIRE(device->used_bytes() == kept);
  if (kept == 0) REQUIRE(s.upstream_allocs == s.upstream_frees);
  REQUIRE(s.ooms == ooms);
  // The run must have exercised the interesting paths.
  CHECK(s.ooms > 0);
  CHECK(s.upstream_alloc_failures + device_errors > 0);
  CHECK(s.events_recorded > 0);
  WARN("seed " << seed << ": " << operations << " ops, " << s.upstream_allocs << " segment allocs, "
               << s.ooms << " OOMs, " << s.stream_waits << " stream waits, " << s.syncs << " syncs, "
               << s.events_recorded << " events, peak reserved "
               << format_bytes(static_cast<std::size_t>(s.total[Metric::reserved_bytes].peak)));
}

}  // namespace

TEST_CASE("randomized: 120k operations, fixed segments, invariants after each", "[random]") {
  run_random(20261129, 120000, "mode:fixed,memory_limit:1GiB");
}

TEST_CASE("randomized: oversize blocks, no cross-stream reuse", "[random]") {
  run_random(7, 40000, "mode:fixed,memory_limit:1GiB,max_split_size:32MiB,cross_stream_reuse:false");
}

TEST_CASE("randomized: tight limit, large split remainder", "[random]") {
  run_random(99, 40000, "mode:fixed,memory_limit:300MiB,min_split_remainder:1MiB");
}

TEST_CASE("randomized: default config (the virtual-memory mode here), 60k operations", "[random][vmm]") {
  run_random(20261202, 60000, "memory_limit:1GiB");
}

TEST_CASE("randomized: virtual-memory mode, 100k operations", "[random][vmm]") {
  run_random(4242, 100000, "mode:vmm,memory_limit:1GiB,vmm_max_growth:32MiB,vmm_max_chunk:32MiB");
}

TEST_CASE("randomized: virtual-memory mode, chunks of 1/8 of the request, at least 1/64 of the limit", "[random][vmm]") {
  run_random(4243, 60000, "mode:vmm,memory_limit:1GiB,vmm_chunk_divisor:8,vmm_chunk_floor_divisor:64");
}

TEST_CASE("randomized: virtual-memory mode whose idle pages are remapped often, or cycle", "[random][vmm]") {
  // A quarter of the pool may sit idle before a growth remaps it (vmm_idle_divisor:4), in small
  // chunks: the growths decide often between remapping idle pages and creating (idle_pages()).
  run_random(31, 40000, "mode:vmm,memory_limit:1GiB,vmm_idle_divisor:4,vmm_max_chunk:8MiB");
}

TEST_CASE("randomized: virtual-memory mode with a reserve", "[random][vmm]") {
  run_random(5, 40000, "mode:vmm,memory_limit:600MiB,vmm_reserve:64MiB");
}

namespace {

// One step of a program, drawn once and run again and again: allocations and frees on three
// streams, some blocks used on a second stream (record_stream), everything freed at the end.
struct StepOp {
  bool alloc;
  std::size_t value;  // alloc: bytes; free: index (into the step's allocations) of the block freed
  Stream stream;
  bool record;        // alloc: the block is also used on the next stream
};

std::vector<StepOp> random_step(std::mt19937_64& rng, const std::vector<Stream>& streams, std::size_t allocs) {
  std::vector<StepOp> ops;
  std::vector<std::size_t> alive;
  std::size_t made = 0;
  while (made < allocs || !alive.empty()) {
    if (made < allocs && (alive.empty() || rng() % 3 != 0)) {
      ops.push_back({true, random_size(rng) % (32 * MiB) + 1, streams[rng() % streams.size()], rng() % 8 == 0});
      alive.push_back(made++);
    } else {
      const std::size_t k = rng() % alive.size();
      ops.push_back({false, alive[k], 0, false});
      alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return ops;
}

// Runs the step; `perturb` (an allocation's index, or SIZE_MAX) asks for 512 more bytes there.
std::vector<Address> run_step(Allocator& alloc, SimulatedDevice& device, const std::vector<Stream>& streams,
                              const std::vector<StepOp>& ops, std::size_t perturb) {
  std::vector<void*> blocks;
  std::vector<Address> at;
  for (const StepOp& op : ops) {
    if (op.alloc) {
      const std::size_t bytes = op.value + (blocks.size() == perturb ? 512 : 0);
      void* p = alloc.allocate(bytes, op.stream);
      if (op.record) {
        const Stream other = streams[(std::find(streams.begin(), streams.end(), op.stream) - streams.begin() + 1) %
                                     streams.size()];
        alloc.record_stream(p, other);
      }
      blocks.push_back(p);
      at.push_back(reinterpret_cast<Address>(p));
    } else {
      alloc.deallocate(blocks[op.value]);
    }
    alloc.check_invariants();
  }
  // The other streams' work ends: the frees still waiting for it complete at the allocator's next
  // call (the next step's first allocation), and the heaps are empty then.
  device.complete_all();
  return at;
}

}  // namespace

TEST_CASE("randomized: a repeated step follows its planned layout with no device call, a changed one "
          "departs safely and is planned again", "[random][vmm][plan]") {
  for (const std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    INFO("seed " << seed);
    auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB,
                                                                           .event_mode = EventMode::immediate});
    Allocator alloc(device, testing::deterministic_config(""));
    std::mt19937_64 rng(seed);
    const std::vector<Stream> streams = {kDefaultStream, device->create_stream(), device->create_stream()};
    const std::vector<StepOp> step = random_step(rng, streams, 300);
    // Each heap empties many times per step; each of its epochs is planned under the one before
    // it, so from the third run on every epoch finds its plan (the first run records them, the
    // second learns which comes after the step's last one).
    for (int run = 0; run < 2; ++run) run_step(alloc, *device, streams, step, SIZE_MAX);
    const std::vector<Address> planned = run_step(alloc, *device, streams, step, SIZE_MAX);
    const DeviceCounters settled = device->counters();
    const std::size_t reserved = alloc.usage().reserved;
    for (int run = 0; run < 3; ++run) {  // the same step: the same places, no call
      INFO("run " << run);
      REQUIRE(run_step(alloc, *device, streams, step, SIZE_MAX) == planned);
      REQUIRE(device->counters().maps == settled.maps);
      REQUIRE(device->counters().physical_creates == settled.physical_creates);
      REQUIRE(device->counters().unmaps == settled.unmaps);
      REQUIRE(alloc.usage().reserved == reserved);
    }
    // A step that asks for a little more at some point: it departs there, and the changed step
    // is what the plans follow two runs later.
    const std::size_t at = 1 + rng() % 299;
    for (int run = 0; run < 2; ++run) run_step(alloc, *device, streams, step, at);
    const std::vector<Address> replanned = run_step(alloc, *device, streams, step, at);
    const DeviceCounters after = device->counters();
    for (int run = 0; run < 2; ++run) {
      REQUIRE(run_step(alloc, *device, streams, step, at) == replanned);
      REQUIRE(device->counters().maps == after.maps);
      REQUIRE(device->counters().physical_creates == after.physical_creates);
    }
    alloc.empty_cache();
    REQUIRE(alloc.usage().reserved == 0);
  }
}

// NVTX annotations (tensorpool/cuda/nvtx.hpp), observed by a fake NVTX tool that NVTX itself
// loads through NVTX_INJECTION64_PATH, the way Nsight Systems and Compute Sanitizer attach: the
// ranges and marks of nvtx:on, the heaps and regions of nvtx_mem:on (fixed and vmm modes), and
// nothing at all when both are off.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "cuda/nvtx_tool_log.hpp"
#include "support/fixed_mode.hpp"
#include "tensorpool/cuda/nvtx.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;
using namespace tensorpool::testing;

namespace {

struct Setup {
  std::shared_ptr<SimulatedDevice> sim;
  std::unique_ptr<Allocator> alloc;
};

// Fixed segments unless `conf` says mode:vmm (the simulated device would take vmm by default).
Setup make(const std::string& conf) {
  const Config c = testing::fixed_mode(Config::parse(conf));
  Setup s;
  s.sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 64 * MiB});
  s.alloc = std::make_unique<Allocator>(with_nvtx(s.sim, c), c);
  return s;
}

}  // namespace

TEST_CASE("nvtx:on: ranges around the device calls, marks for OOM and empty_cache", "[cuda][nvtx]") {
  REQUIRE(g_tool_requested);
  Setup s = make("nvtx:on");
  REQUIRE(&s.alloc->device() != s.sim.get());  // wrapped
  CHECK(attach_nvtx(*s.alloc) != 0);
  CHECK(nvtx_tool_attached());
  const auto setup_calls = tool_calls();
  CHECK(in_order(setup_calls, {"attached", "domain tensorpool"}));

  void* p = s.alloc->allocate(3000);
  CHECK(tool_calls() == std::vector<std::string>{"push segment alloc 2097152", "pop"});
  REQUIRE_THROWS_AS(s.alloc->allocate(100 * MiB), OutOfMemoryError);
  const auto oom = tool_calls();
  CHECK(oom.back() == "mark OOM 104857600");
  CHECK(count_prefix(oom, "push ") == count_prefix(oom, "pop"));
  s.alloc->deallocate(p);
  s.alloc->empty_cache();
  CHECK(tool_calls() == std::vector<std::string>{"push segment free 2097152", "pop", "mark empty_cache 2097152"});
}

TEST_CASE("nvtx_mem:on: a heap per segment, a region per block", "[cuda][nvtx]") {
  Setup s = make("nvtx_mem:on");
  attach_nvtx(*s.alloc);
  tool_calls();
  const Stream other = s.sim->create_stream();
  void* p = s.alloc->allocate(3000);
  void* q = s.alloc->allocate(5000);
  const auto snap = s.alloc->snapshot();
  REQUIRE(snap.segments.size() == 1);
  const std::string seg = hex(reinterpret_cast<void*>(snap.segments[0].address));
  CHECK(tool_calls() == std::vector<std::string>{"heap+ " + seg + " 2097152 suballocator",
                                                 "region+ " + hex(p) + " 3000 in " + seg,
                                                 "region+ " + hex(q) + " 5000 in " + seg});
  s.alloc->deallocate(p);
  CHECK(tool_calls() == std::vector<std::string>{"region- " + hex(p)});
  // A block still used by another stream stays a region until it is reusable.
  s.alloc->record_stream(q, other);
  s.alloc->deallocate(q);
  CHECK(tool_calls().empty());
  s.sim->complete_stream(other);
  void* r = s.alloc->allocate(512);
  CHECK(in_order(tool_calls(), {"region- " + hex(q), "region+ " + hex(r) + " 512 in " + seg}));
  s.alloc->deallocate(r);
  s.alloc->empty_cache();
  CHECK(tool_calls() == std::vector<std::string>{"region- " + hex(r), "heap- " + seg});
}

TEST_CASE("nvtx_mem:on in vmm mode: the reserved range is the heap", "[cuda][nvtx]") {
  Setup s = make("mode:vmm,vmm_chunk_divisor:0,nvtx:on,nvtx_mem:on");  // one chunk: the request's pages
  attach_nvtx(*s.alloc);
  tool_calls();
  void* p = s.alloc->allocate(3 * MiB);
  const auto calls = tool_calls();
  std::string all;
  for (const auto& c : calls) all += c + "; ";
  INFO(all);
  const auto snap = s.alloc->snapshot();
  REQUIRE(snap.segments.size() == 1);
  const std::string base = hex(reinterpret_cast<void*>(snap.segments[0].address));
  CHECK(in_order(calls, {"push reserve address range " + std::to_string(snap.segments[0].size),
                         "heap+ " + base + " " + std::to_string(snap.segments[0].size) + " suballocator",
                         "pop", "push physical create 4194304", "pop", "push map 4194304", "pop",
                         "region+ " + hex(p) + " 3145728 in " + base}));
  s.alloc->deallocate(p);
  CHECK(tool_calls() == std::vector<std::string>{"region- " + hex(p)});
}

TEST_CASE("nvtx off: nothing wrapped, nothing attached, no call reaches the tool", "[cuda][nvtx]") {
  const Config off;
  auto sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 64 * MiB});
  const auto backend = with_nvtx(sim, off);
  CHECK(backend == sim);
  Allocator alloc(backend, off);
  CHECK(attach_nvtx(alloc) == 0);
  tool_calls();
  void* p = alloc.allocate(3000);
  REQUIRE_THROWS_AS(alloc.allocate(100 * MiB), OutOfMemoryError);
  alloc.deallocate(p);
  alloc.empty_cache();
  CHECK(tool_calls().empty());
  // nvtx_mem needs the wrapped backend for its heaps.
  Allocator unwrapped(sim, Config::parse("nvtx_mem:on"));
  CHECK_THROWS_AS(attach_nvtx(unwrapped), UsageError);
}

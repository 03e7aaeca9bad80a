// NVTX with no tool attached (a process of its own, since NVTX initializes once per process):
// every annotation is a no-op, and an allocator with nvtx:on and nvtx_mem:on behaves exactly like
// one without them.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <vector>

#include "tensorpool/cuda/nvtx.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

// Before the first NVTX call: make sure no tool is injected (as when not under a profiler).
const bool g_no_tool = [] { return unsetenv("NVTX_INJECTION64_PATH") == 0; }();

/// A seeded workload; returns the allocator's statistics at the end.
Stats run(const std::string& conf) {
  const Config c = Config::parse(conf);
  auto sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 256 * MiB});
  Allocator alloc(with_nvtx(sim, c), c);
  attach_nvtx(alloc);
  std::uint64_t state = 12345;
  std::vector<void*> live;
  for (int i = 0; i < 5000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::uint64_t r = state >> 33;
    if (r % 3 != 0 || live.empty()) {
      try {
        live.push_back(alloc.allocate(r % (40 * MiB) + 1));
      } catch (const OutOfMemoryError&) {
      }
    } else {
      const std::size_t k = r % live.size();
      alloc.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (void* p : live) alloc.deallocate(p);
  alloc.empty_cache();
  alloc.check_invariants();
  return alloc.stats();
}

}  // namespace

TEST_CASE("without an NVTX tool the annotations are no-ops", "[cuda][nvtx]") {
  REQUIRE(g_no_tool);
  for (const char* mode : {"mode:fixed", "mode:vmm"}) {
    INFO(mode);
    const Stats plain = run(mode);
    const Stats annotated = run(std::string(mode) + ",nvtx:on,nvtx_mem:on");
    CHECK_FALSE(nvtx_tool_attached());
    CHECK(annotated.total[Metric::reserved_bytes].peak == plain.total[Metric::reserved_bytes].peak);
    CHECK(annotated.upstream_allocs == plain.upstream_allocs);
    CHECK(annotated.upstream_frees == plain.upstream_frees);
    CHECK(annotated.vm_maps == plain.vm_maps);
    CHECK(annotated.ooms == plain.ooms);
    CHECK(annotated.alloc_calls == plain.alloc_calls);
    CHECK(plain.ooms > 0);
  }
}

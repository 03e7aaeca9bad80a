// The nvtx and nvtx_mem keys through the registry and the C API (src/capi/layers.cpp), in builds
// with NVTX (the CUDA toolkit): an allocator created from TENSORPOOL_CONF or tensorpool_create()
// settings emits its annotations to an NVTX tool (the fake tool of tests/cuda, loaded by NVTX
// through NVTX_INJECTION64_PATH) with no code change in the program, and nothing when they are
// off. Every test case runs in its own process (catch_discover_tests).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/nvtx_tool_log.hpp"
#include "tensorpool/registry.hpp"
#include "tensorpool/tensorpool.h"

using namespace tensorpool;
using namespace tensorpool::testing;

TEST_CASE("registry: nvtx:on and nvtx_mem:on from TENSORPOOL_CONF reach the NVTX tool", "[layers][nvtx]") {
  REQUIRE(g_tool_requested);
  REQUIRE(setenv("TENSORPOOL_CONF", "backend:simulated,mode:fixed,nvtx:on,nvtx_mem:on", 1) == 0);
  Allocator& a = device_allocator(0);
  tool_calls();
  void* p = a.allocate(3000);
  const auto snap = a.snapshot();
  REQUIRE(snap.segments.size() == 1);
  const std::string seg = hex(reinterpret_cast<void*>(snap.segments[0].address));
  CHECK(tool_calls() == std::vector<std::string>{"push segment alloc 2097152",
                                                 "heap+ " + seg + " 2097152 suballocator", "pop",
                                                 "region+ " + hex(p) + " 3000 in " + seg});
  a.deallocate(p);
  empty_device_caches();
  CHECK(in_order(tool_calls(), {"region- " + hex(p), "push segment free 2097152", "heap- " + seg,
                                "pop", "mark empty_cache 2097152"}));
}

TEST_CASE("C API: nvtx:on in tensorpool_create() settings reaches the NVTX tool, and nothing when off",
          "[layers][nvtx][capi]") {
  tensorpool_allocator* on = nullptr;
  tensorpool_allocator* off = nullptr;
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, GiB, "mode:fixed,nvtx:on", &on) == TENSORPOOL_OK);
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 1, GiB, "mode:fixed", &off) == TENSORPOOL_OK);
  tool_calls();
  void* p = nullptr;
  REQUIRE(tensorpool_alloc(off, 3000, 0, &p) == TENSORPOOL_OK);
  REQUIRE(tensorpool_free(off, p) == TENSORPOOL_OK);
  REQUIRE(tensorpool_empty_cache(off) == TENSORPOOL_OK);
  CHECK(tool_calls().empty());
  REQUIRE(tensorpool_alloc(on, 3000, 0, &p) == TENSORPOOL_OK);
  CHECK(tool_calls() == std::vector<std::string>{"push segment alloc 2097152", "pop"});
  void* big = nullptr;
  CHECK(tensorpool_alloc(on, 2 * GiB, 0, &big) == TENSORPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(tool_calls().back() == "mark OOM 2147483648");
  REQUIRE(tensorpool_free(on, p) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(on) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(off) == TENSORPOOL_OK);
}

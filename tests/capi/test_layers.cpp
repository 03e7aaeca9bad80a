// The optional layers of the registry's and the C API's allocators (src/capi/layers.cpp), which a
// program gets with no code change: TENSORPOOL_TRACE records them (the recording replays to the
// live run's figures, empty_cache() calls included), and the nvtx / nvtx_mem keys are refused,
// naming the key, in a build without NVTX. (With NVTX, tests/capi/test_layers_nvtx.cpp checks
// that the annotations reach a tool.) Every test case runs in its own process
// (catch_discover_tests): each starts with an empty registry and no recording.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "support/allocator_workload.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "tensorpool/record.hpp"
#include "tensorpool/registry.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/tensorpool.h"
#include "tensorpool/trace/format.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;
using tensorpool::testing::run_workload;
using tensorpool::testing::TempDir;

namespace {

struct Figures {
  std::size_t peak_reserved, peak_allocated;
  std::uint64_t segment_allocs, segment_frees, ooms;
};

SimulatedDevice& simulated(Allocator& alloc) {
  auto* sim = dynamic_cast<SimulatedDevice*>(&alloc.device());
  REQUIRE(sim != nullptr);
  return *sim;
}

Figures live_figures(Allocator& alloc) {
  const SimulatedDevice* sim = &simulated(alloc);
  const Stats s = alloc.stats();
  return {static_cast<std::size_t>(s.total[Metric::reserved_bytes].peak),
          static_cast<std::size_t>(s.total[Metric::allocated_bytes].peak),
          sim->counters().segment_allocs, sim->counters().segment_frees, s.ooms};
}

/// The value of metadata line "key=value" of the trace's header.
std::string metadata(const trace::Trace& t, const std::string& key) {
  for (const std::string& line : t.info.metadata)
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  FAIL("no metadata line " << key << "= in the recording");
  return "";
}

/// Replays device `device` of the recording with the settings and capacity its header gives.
replay::ReplayResult replay_device(const trace::Trace& t, int device, bool with_empty_cache = true) {
  trace::Trace copy = t;
  if (!with_empty_cache) std::erase_if(copy.events, [](const trace::TraceEvent& e) { return e.op == trace::Op::empty_cache; });
  replay::TraceSource source(copy);
  replay::ReplayOptions o;
  o.allocator = "tensorpool";
  o.device = device;
  o.attempt_ooms = true;
  o.target.capacity = std::stoull(metadata(t, "capacity"));
  o.target.conf = metadata(t, "config");  // refused if it held a key a replay does not take
  return replay::replay(source, o).total;
}

std::size_t count_ops(const trace::Trace& t, trace::Op op, int device) {
  std::size_t n = 0;
  for (const auto& e : t.events) n += e.op == op && e.device == device;
  return n;
}

}  // namespace

TEST_CASE("TENSORPOOL_TRACE records every registry allocator, and the file replays to the live figures",
          "[layers][record]") {
  TempDir dir("tensorpool_test_layers");
  REQUIRE(setenv("TENSORPOOL_TRACE", dir.file("job-%p.tptrace").c_str(), 1) == 0);
  // The registry's simulated devices have 80 GiB: the limit makes the workload's large requests fail.
  configure_device_allocators("backend:simulated,mode:fixed,max_split_size:64MiB,memory_limit:2GiB");
  Allocator& d0 = device_allocator(0);
  Allocator& d2 = device_allocator(2);
  run_workload(d0, simulated(d0), 3000, 1, 300);  // an empty_cache() every 300 steps
  run_workload(d2, simulated(d2), 3000, 2, 300);
  empty_device_caches();
  const Figures live0 = live_figures(d0);
  const Figures live2 = live_figures(d2);
  CHECK(live0.ooms > 0);
  stop_recording_from_env();  // what the exit handler does

  const std::string path = dir.file("job-" + std::to_string(getpid()) + ".tptrace");
  REQUIRE(std::filesystem::exists(path));
  const trace::Trace t = trace::read_trace(path);
  CHECK(t.info.source == "tensorpool-recording");
  CHECK(metadata(t, "device") == "0:sim0");
  CHECK_THAT(metadata(t, "config"), Contains("max_split_size:67108864") && !Contains("backend"));
  std::set<int> devices;
  for (const auto& e : t.events) devices.insert(e.device);
  CHECK(devices == std::set<int>{0, 2});
  // Ten empty_cache() calls per workload and the one of empty_device_caches(), each an op.
  CHECK(count_ops(t, trace::Op::empty_cache, 0) == 11);
  CHECK(count_ops(t, trace::Op::empty_cache, 2) == 11);

  for (const auto& [device, live] : {std::pair{0, live0}, std::pair{2, live2}}) {
    INFO("device " << device);
    const replay::ReplayResult r = replay_device(t, device);
    CHECK(r.peak_reserved == live.peak_reserved);
    CHECK(r.peak_allocated == live.peak_allocated);
    CHECK(r.upstream.allocs == live.segment_allocs);
    CHECK(r.upstream.frees == live.segment_frees);
    CHECK(r.ooms == live.ooms);
    // Without its empty_cache ops the replay keeps segments the live run returned.
    const replay::ReplayResult without = replay_device(t, device, false);
    CHECK(without.upstream.frees < live.segment_frees);
  }
}

TEST_CASE("TENSORPOOL_TRACE records C API allocators, and a second allocator of a device gets a trace "
          "device of its own", "[layers][record][capi]") {
  TempDir dir("tensorpool_test_layers");
  const std::string path = dir.file("c.jsonl");
  REQUIRE(setenv("TENSORPOOL_TRACE", path.c_str(), 1) == 0);
  tensorpool_allocator* a = nullptr;
  tensorpool_allocator* b = nullptr;
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, GiB, nullptr, &a) == TENSORPOOL_OK);
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, GiB, "mode:vmm", &b) == TENSORPOOL_OK);
  void* p = nullptr;
  void* q = nullptr;
  REQUIRE(tensorpool_alloc(a, 3 * MiB, 0, &p) == TENSORPOOL_OK);
  REQUIRE(tensorpool_alloc(b, 5 * MiB, 0, &q) == TENSORPOOL_OK);
  REQUIRE(tensorpool_free(a, p) == TENSORPOOL_OK);
  REQUIRE(tensorpool_free(b, q) == TENSORPOOL_OK);
  REQUIRE(tensorpool_destroy(a) == TENSORPOOL_OK);  // its events stay in the recording
  REQUIRE(tensorpool_empty_cache(b) == TENSORPOOL_OK);
  REQUIRE(tensorpool_destroy(b) == TENSORPOOL_OK);
  stop_recording_from_env();

  const trace::Trace t = trace::read_trace(path);
  CHECK(count_ops(t, trace::Op::alloc, 0) == 1);
  CHECK(count_ops(t, trace::Op::alloc, kFirstDuplicateTraceDevice) == 1);
  CHECK(count_ops(t, trace::Op::segment_map, kFirstDuplicateTraceDevice) > 0);  // b is the vmm one
  CHECK(count_ops(t, trace::Op::empty_cache, kFirstDuplicateTraceDevice) == 1);
  for (const auto& e : t.events) {
    if (e.op == trace::Op::alloc) CHECK(e.size == (e.device == 0 ? 3 * MiB : 5 * MiB));
  }
}

TEST_CASE("TENSORPOOL_TRACE to an unwritable path: allocators work, unrecorded", "[layers][record]") {
  REQUIRE(setenv("TENSORPOOL_TRACE", "/nonexistent-dir/x.tptrace", 1) == 0);
  configure_device_allocators("backend:simulated");
  Allocator& a = device_allocator(0);
  a.deallocate(a.allocate(MiB));
  CHECK(a.stats().alloc_calls == 1);
  CHECK_FALSE(attach_recording_from_env(device_allocator(1)));  // gave up once, for good
  CHECK_FALSE(std::filesystem::exists("/nonexistent-dir"));
}

TEST_CASE("the nvtx keys: refused naming the key where NVTX is not built in", "[layers][nvtx]") {
  if (backend_available(Backend::async))
    TP_SKIP("NVTX is built in (tests/capi/test_layers_nvtx.cpp checks the keys; preset cpu-only runs this)");
  // The core parses them in every build (a recording's settings replay anywhere) ...
  CHECK(Config::parse("nvtx:on").nvtx);
  // ... but an allocator of the registry or the C API cannot honour them.
  CHECK_THROWS_WITH(configure_device_allocators("backend:simulated,nvtx:on"),
                    Contains("tensorpool_configure()") && Contains("'nvtx'") && Contains("CUDA toolkit"));
  REQUIRE(setenv("TENSORPOOL_CONF", "backend:simulated,nvtx_mem:true", 1) == 0);
  CHECK_THROWS_WITH(device_allocator(0), Contains("TENSORPOOL_CONF") && Contains("'nvtx_mem'"));
  CHECK(existing_device_allocator(0) == nullptr);
  tensorpool_allocator* a = nullptr;
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 0, "nvtx:on", &a) == TENSORPOOL_ERROR_CONFIG);
  CHECK(a == nullptr);
  CHECK_THAT(tensorpool_last_error(), Contains("tensorpool_create() config") && Contains("'nvtx'"));
  // Off is accepted anywhere.
  REQUIRE(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 0, "nvtx:off,nvtx_mem:off", &a) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
}

// The empty_cache() calls of a recorded run: found by mark_empty_cache_calls (rules in
// tensorpool/trace/empty_cache.hpp), imported from a PyTorch snapshot, stored by both trace
// formats (version 2), and replayed: the pytorch model then frees the segments PyTorch freed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/empty_cache.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

using namespace tensorpool;
using tensorpool::trace::Format;
using tensorpool::trace::Op;
using tensorpool::trace::Trace;
using tensorpool::trace::mark_empty_cache_calls;
using tensorpool::trace::read_trace;
using tensorpool::trace::write_trace;
namespace pytorch = tensorpool::trace::pytorch;

namespace {

trace::TraceEvent ev(Op op, std::uint64_t addr = 0, std::uint64_t size = 0, std::uint16_t device = 0) {
  return {.op = op, .device = device, .addr = addr, .size = size};
}

std::size_t count(const Trace& t, Op op) {
  return static_cast<std::size_t>(
      std::count_if(t.events.begin(), t.events.end(), [&](const trace::TraceEvent& e) { return e.op == op; }));
}

const std::filesystem::path kFixture = std::filesystem::path(TENSORPOOL_IMPORTER_FIXTURES) / "snap_empty_cache.pickle";

}  // namespace

TEST_CASE("empty_cache: a run of frees of wholly free segments becomes one call before the run",
          "[trace][empty_cache]") {
  Trace t;
  t.events = {ev(Op::segment_alloc, 0x1000, 4096), ev(Op::alloc, 0x1000, 100), ev(Op::free_requested, 0x1000, 100),
              ev(Op::free_completed, 0x1000, 100), ev(Op::segment_free, 0x1000, 4096),
              ev(Op::segment_free, 0x9000, 4096), ev(Op::iteration, 0, 1)};
  REQUIRE(mark_empty_cache_calls(t) == 1);
  REQUIRE(t.events.size() == 8);
  CHECK(t.events[4].op == Op::empty_cache);
  CHECK(t.events[5].op == Op::segment_free);
  CHECK(t.events[6].op == Op::segment_free);
  CHECK(mark_empty_cache_calls(t) == 0);  // already marked: unchanged
  CHECK(t.events.size() == 8);
}

TEST_CASE("empty_cache: not when a block is live in the segment, an oom is next to the run, or a "
          "segment_alloc follows at once", "[trace][empty_cache]") {
  Trace live;
  live.events = {ev(Op::alloc, 0x1100, 100), ev(Op::segment_free, 0x1000, 4096), ev(Op::alloc, 0x5000, 1)};
  CHECK(mark_empty_cache_calls(live) == 0);
  Trace oom_after;
  oom_after.events = {ev(Op::segment_free, 0x1000, 4096), ev(Op::oom, 0, 1 << 30)};
  CHECK(mark_empty_cache_calls(oom_after) == 0);
  Trace oom_before;
  oom_before.events = {ev(Op::oom, 0, 1 << 30), ev(Op::segment_free, 0x1000, 4096), ev(Op::alloc, 0x5000, 1)};
  CHECK(mark_empty_cache_calls(oom_before) == 0);
  Trace retried;
  retried.events = {ev(Op::segment_free, 0x1000, 4096), ev(Op::segment_alloc, 0x8000, 8192)};
  CHECK(mark_empty_cache_calls(retried) == 0);
}

TEST_CASE("empty_cache: devices are separate, a run ends where the device's frees end", "[trace][empty_cache]") {
  Trace t;
  t.events = {ev(Op::alloc, 0x1000, 100, 1),        ev(Op::segment_free, 0x9000, 4096, 0),
              ev(Op::segment_free, 0x1000, 4096, 1),  // device 1's segment holds a live block
              ev(Op::segment_free, 0xA000, 4096, 0),  // still device 0's run
              ev(Op::iteration, 0, 1, 0)};
  REQUIRE(mark_empty_cache_calls(t) == 1);
  CHECK(t.events[1].op == Op::empty_cache);
  CHECK(t.events[1].device == 0);
  CHECK(count(t, Op::empty_cache) == 1);
}

TEST_CASE("empty_cache: imported from a PyTorch snapshot, the oom path's free is not one", "[trace][empty_cache]") {
  const Trace t = pytorch::import_snapshot(kFixture);
  REQUIRE(count(t, Op::empty_cache) == 1);
  const auto call = std::find_if(t.events.begin(), t.events.end(), [](const trace::TraceEvent& e) { return e.op == Op::empty_cache; });
  REQUIRE(std::next(call)->op == Op::segment_free);
  CHECK(std::next(call)->addr == 0x7F1001000000);
  CHECK(std::next(call, 2)->op == Op::segment_free);
  CHECK(call->time_us == std::next(call)->time_us);
  CHECK(count(t, Op::segment_free) == 3);
}

TEST_CASE("empty_cache: both formats store it (version 2)", "[trace][empty_cache]") {
  Trace t;
  t.events = {ev(Op::alloc, 0x10, 1), ev(Op::empty_cache), ev(Op::free_requested, 0x10, 1)};
  const auto dir = std::filesystem::temp_directory_path() / "tp_empty_cache_test";
  std::filesystem::create_directories(dir);
  for (const auto format : {Format::binary, Format::jsonl}) {
    const auto file = dir / (format == Format::binary ? "t.tptrace" : "t.jsonl");
    write_trace(file.string(), t, format);
    const Trace back = read_trace(file.string());
    REQUIRE(back.events.size() == 3);
    CHECK(back.events[1].op == Op::empty_cache);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("empty_cache: replayed, the pytorch model frees what PyTorch freed for the call", "[trace][empty_cache]") {
  const Trace t = pytorch::import_snapshot(kFixture);
  replay::TraceSource source(t);
  const replay::ReplayResult actual = replay::baseline(source).total.result;
  CHECK(actual.upstream.allocs == 5);
  CHECK(actual.upstream.frees == 3);  // two by empty_cache(), one by the failed 100 GiB request
  CHECK(actual.peak_reserved == 76 * MiB);
  replay::ReplayOptions o;
  o.allocator = "pytorch";
  source.rewind();
  const replay::ReplayResult model = replay::replay(source, o).total;
  CHECK(model.upstream.allocs == 5);
  CHECK(model.upstream.frees == 2);  // the failed request is not in the trace: its free is not replayed
  CHECK(model.peak_reserved == 76 * MiB);
  // Without the call the model keeps both cached segments: 98 MiB at the peak.
  Trace unmarked = t;
  std::erase_if(unmarked.events, [](const trace::TraceEvent& e) { return e.op == Op::empty_cache; });
  replay::TraceSource plain(unmarked);
  const replay::ReplayResult without = replay::replay(plain, o).total;
  CHECK(without.upstream.frees == 0);
  CHECK(without.peak_reserved == 98 * MiB);
  for (const char* name : {"tensorpool", "tensorpool-vmm", "pytorch-expandable", "cub", "raw", "rmm-pool", "rmm-arena"}) {
    INFO(name);
    o.allocator = name;
    source.rewind();
    CHECK(replay::replay(source, o).total.allocs == actual.allocs);
  }
}

// The pickle writer and the PyTorch-snapshot export: what is written reads back with tensorpool's
// own pickle reader and snapshot importer, with PyTorch's layout and the allocator's figures.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include <unistd.h>

#include "support/fixed_mode.hpp"
#include "tensorpool/allocator.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/trace/pickle.hpp"
#include "tensorpool/trace/pickle_writer.hpp"
#include "tensorpool/trace/pytorch_export.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

using namespace tensorpool;
using namespace tensorpool::trace;
using Catch::Matchers::Contains;

namespace {

pickle::Document parse(std::string bytes) { return pickle::Document::parse(std::move(bytes), "<export>"); }

// An allocator with a recorder attached from its first event, as the registry attaches one.
struct Recorded {
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
  std::shared_ptr<pytorch::HistoryRecorder> history;

  explicit Recorded(const char* conf, std::size_t capacity = 4 * GiB, std::size_t max_entries = 100000)
      : device(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = capacity})),
        alloc(device, testing::fixed_mode(Config::parse(conf))),  // "": fixed segments
        history(std::make_shared<pytorch::HistoryRecorder>(max_entries)) {
    alloc.add_observer(history);
    alloc.add_oom_observer([h = history](const OutOfMemoryInfo& i) { h->on_oom(i); });
  }

  pytorch::DeviceMemory memory() const { return {0, alloc.snapshot(), history->entries()}; }
};

// Two streams, splits, a cross-stream free left pending, an OOM and frees that leave holes.
void workload(Recorded& r) {
  const Stream s1 = r.device->create_stream();
  const Stream s2 = r.device->create_stream();
  std::vector<void*> live;
  for (int i = 0; i < 24; ++i) {
    const std::size_t bytes = (i % 3 == 0) ? 300 * KiB : (3 + i) * MiB + 1234;
    live.push_back(r.alloc.allocate(bytes, i % 2 == 0 ? s1 : s2));
  }
  for (std::size_t i = 0; i < live.size(); i += 3) r.alloc.deallocate(live[i]);
  r.alloc.record_stream(live[1], s1);
  r.alloc.deallocate(live[1]);  // pending until s1's work completes
  REQUIRE_THROWS_AS(r.alloc.allocate(64 * GiB, s1), OutOfMemoryError);
  r.alloc.deallocate(live[4]);
  r.alloc.empty_cache();  // waits for s1: the pending block completes, free segments go back
  r.alloc.deallocate(live[7]);
  live[7] = r.alloc.allocate(5 * MiB, s2);
  r.alloc.record_stream(live[10], s2);  // allocated on s1, used on s2
  r.alloc.deallocate(live[10]);  // stays pending: nothing completes s1 any more
}

std::size_t count_actions(const pytorch::Snapshot& s, pytorch::Action a) {
  std::size_t n = 0;
  for (const auto& trace : s.device_traces)
    for (const auto& e : trace) n += e.action == a ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("pickle writer: every plain type reads back", "[export]") {
  pickle::Writer w;
  w.begin_dict();
  w.key("small");
  w.integer(7);
  w.key("two_bytes");
  w.integer(60000);
  w.key("negative");
  w.integer(-5);
  w.key("int32");
  w.integer(std::numeric_limits<std::int32_t>::min());
  w.key("big");
  w.integer(std::int64_t{1} << 40);
  w.key("min64");
  w.integer(std::numeric_limits<std::int64_t>::min());
  w.key("u64max");
  w.unsigned_integer(std::numeric_limits<std::uint64_t>::max());
  w.key("float");
  w.floating(-2.5e-7);
  w.key("flags");
  w.begin_list();
  w.boolean(true);
  w.boolean(false);
  w.none();
  w.end_list();
  w.key("long");
  w.string(std::string(300, 'x'));
  w.key("pair");
  w.begin_tuple();
  w.integer(0);
  w.integer(1);
  w.end_tuple();
  w.key("many");
  w.begin_list();
  for (int i = 0; i < 2500; ++i) w.integer(i);
  w.end_list();
  w.key("empty");
  w.begin_dict();
  w.end_dict();
  w.end_dict();
  const pickle::Document doc = parse(w.finish());
  const pickle::Value r = doc.root();
  REQUIRE(doc.protocol() == 4);
  CHECK(r["small"].as_int() == 7);
  CHECK(r["two_bytes"].as_int() == 60000);
  CHECK(r["negative"].as_int() == -5);
  CHECK(r["int32"].as_int() == std::numeric_limits<std::int32_t>::min());
  CHECK(r["big"].as_int() == std::int64_t{1} << 40);
  CHECK(r["min64"].as_int() == std::numeric_limits<std::int64_t>::min());
  CHECK(r["u64max"].as_uint() == std::numeric_limits<std::uint64_t>::max());
  CHECK(r["float"].as_float() == -2.5e-7);
  CHECK(r["flags"][0].as_bool());
  CHECK_FALSE(r["flags"][1].as_bool());
  CHECK(r["flags"][2].is_none());
  CHECK(r["long"].as_string() == std::string(300, 'x'));
  CHECK(r["pair"].is(pickle::Kind::tuple));
  CHECK(r["pair"][1].as_int() == 1);
  REQUIRE(r["many"].size() == 2500);
  CHECK(r["many"][2499].as_int() == 2499);
  CHECK(r["empty"].size() == 0);
}

TEST_CASE("pickle writer: misuse is refused", "[export]") {
  {
    pickle::Writer w;
    w.begin_dict();
    CHECK_THROWS_AS(w.integer(1), UsageError);  // a value where a key is due
  }
  {
    pickle::Writer w;
    w.begin_list();
    CHECK_THROWS_AS(w.end_dict(), UsageError);
    CHECK_THROWS_AS(w.finish(), UsageError);  // still open
  }
  {
    pickle::Writer w;
    CHECK_THROWS_AS(w.finish(), UsageError);  // nothing written
    w.none();
    CHECK_THROWS_AS(w.none(), UsageError);  // a second root
  }
}

TEST_CASE("export: the layout of PyTorch's snapshot, blocks tiling each segment", "[export]") {
  Recorded r("max_split_size:none");
  workload(r);
  r.alloc.check_invariants();
  const std::string bytes = pytorch::snapshot_pickle({r.memory()}, pytorch::settings_from_conf(r.alloc.config().to_string()));
  const pickle::Document doc = parse(bytes);
  const pickle::Value root = doc.root();
  const Snapshot truth = r.alloc.snapshot();
  REQUIRE(root["segments"].size() == truth.segments.size());
  for (std::size_t i = 0; i < truth.segments.size(); ++i) {
    const pickle::Value seg = root["segments"][i];
    const SegmentInfo& t = truth.segments[i];
    CHECK(seg["device"].as_int() == 0);
    CHECK(seg["address"].as_uint() == t.address);
    CHECK(seg["total_size"].as_uint() == t.size);
    CHECK(seg["stream"].as_uint() == t.stream);
    CHECK(seg["segment_type"].as_string() == (t.pool == Pool::small ? "small" : "large"));
    CHECK_FALSE(seg["is_expandable"].as_bool());
    std::uint64_t next = seg["address"].as_uint(), allocated = 0;
    REQUIRE(seg["blocks"].size() == t.blocks.size());
    for (const pickle::Value b : seg["blocks"].elements()) {
      CHECK(b["address"].as_uint() == next);  // contiguous, in address order
      next += b["size"].as_uint();
      if (b["state"].as_string() == "active_allocated") allocated += b["size"].as_uint();
      CHECK(b["frames"].size() == 0);
    }
    CHECK(next == t.address + t.size);
    CHECK(seg["allocated_size"].as_uint() == allocated);
  }
  const pickle::Value traces = root["device_traces"];
  REQUIRE(traces.size() == 1);
  bool saw_oom = false;
  for (const pickle::Value e : traces[0].elements()) {
    const std::string_view action = e["action"].as_string();
    CHECK(e.contains("size"));
    CHECK(e.contains("stream"));
    CHECK(e.contains("time_us"));
    if (action == "oom") {
      saw_oom = true;
      CHECK_FALSE(e.contains("addr"));
      CHECK(e["size"].as_uint() == 64 * GiB);
      CHECK(e["device_free"].as_uint() > 0);
    } else {
      CHECK(e.contains("addr"));
    }
  }
  CHECK(saw_oom);
  CHECK(root["allocator_settings"]["allocator"].as_string() == "tensorpool");
  CHECK(root["allocator_settings"]["max_split_size"].as_string() == "none");
}

TEST_CASE("export: our importer reads it back to the allocator's figures", "[export]") {
  Recorded r("");
  workload(r);
  const std::string bytes = pytorch::snapshot_pickle({r.memory()});
  const pickle::Document doc = parse(bytes);
  const pytorch::Snapshot s = pytorch::read_snapshot(doc.root());
  const Snapshot truth = r.alloc.snapshot();
  REQUIRE(s.segments.size() == truth.segments.size());
  std::size_t live = 0, pending = 0, truth_live = 0, truth_pending = 0;
  for (const auto& seg : s.segments)
    for (const auto& b : seg.blocks) {
      live += b.state == "active_allocated";
      pending += b.state == "active_pending_free";
      CHECK_FALSE(b.address_computed);
    }
  for (const auto& seg : truth.segments)
    for (const auto& b : seg.blocks) {
      truth_live += b.state == BlockState::allocated;
      truth_pending += b.state == BlockState::pending_free;
    }
  CHECK(live == truth_live);
  CHECK(pending == truth_pending);
  CHECK(pending == 1);
  CHECK(count_actions(s, pytorch::Action::oom) == 1);

  const Trace t = pytorch::to_trace(s, "export.pickle");
  replay::TraceSource source(t);
  const replay::BaselineReport b = replay::baseline(source, "tensorpool-actual");
  const Stats stats = r.alloc.stats();
  REQUIRE(b.total.present);
  CHECK(b.total.result.peak_reserved == static_cast<std::size_t>(stats.total[Metric::reserved_bytes].peak));
  CHECK(b.total.result.final_reserved == r.alloc.usage().reserved);
  CHECK(b.total.result.peak_requested == static_cast<std::size_t>(stats.total[Metric::requested_bytes].peak));
  CHECK(b.total.result.ooms == 1);
  CHECK(b.total.result.upstream.allocs == stats.upstream_allocs);
  CHECK(b.total.result.upstream.frees == stats.upstream_frees);
}

TEST_CASE("export: vmm heaps become expandable segments of their mapped runs", "[export]") {
  Recorded r("mode:vmm,vmm_max_chunk:8MiB");
  workload(r);
  r.alloc.check_invariants();
  const pytorch::Snapshot s = pytorch::read_snapshot(parse(pytorch::snapshot_pickle({r.memory()})).root());
  std::size_t mapped = 0;
  for (const auto& seg : r.alloc.snapshot().segments)
    for (const auto& b : seg.blocks) mapped += b.mapped ? b.size : 0;
  std::size_t exported = 0;
  for (const auto& seg : s.segments) {
    CHECK(seg.is_expandable);
    exported += seg.total_size;
  }
  CHECK(exported == mapped);
  CHECK(count_actions(s, pytorch::Action::segment_map) == r.alloc.stats().vm_maps);
  CHECK(count_actions(s, pytorch::Action::segment_alloc) == 0);  // physical pages: not shown
  // The importer accepts it: every map and unmap matches the final mapped ranges.
  const Trace t = pytorch::to_trace(s, "vmm.pickle");
  replay::TraceSource source(t);
  const replay::BaselineReport b = replay::baseline(source);
  CHECK(b.total.result.final_reserved == mapped);
  CHECK(b.total.result.peak_requested ==
        static_cast<std::size_t>(r.alloc.stats().total[Metric::requested_bytes].peak));
}

TEST_CASE("export: a history cut by max_entries still imports", "[export]") {
  Recorded r("", 4 * GiB, 7);
  workload(r);
  const pytorch::DeviceMemory m = r.memory();
  REQUIRE(m.history.size() == 7);
  CHECK(r.history->recorded() > 7);
  const pytorch::Snapshot s = pytorch::read_snapshot(parse(pytorch::snapshot_pickle({m})).root());
  CHECK_NOTHROW(pytorch::to_trace(s, "cut.pickle"));
}

TEST_CASE("export: several devices, one trace list per ordinal", "[export]") {
  Recorded r("");
  void* p = r.alloc.allocate(MiB);
  pytorch::DeviceMemory m = r.memory();
  m.device = 2;
  const pickle::Document doc = parse(pytorch::snapshot_pickle({m}));
  REQUIRE(doc.root()["device_traces"].size() == 3);
  CHECK(doc.root()["device_traces"][0].size() == 0);
  CHECK(doc.root()["device_traces"][2].size() == 2);  // segment_alloc, alloc
  CHECK(doc.root()["segments"][0]["device"].as_int() == 2);
  pytorch::DeviceMemory twice = m;
  CHECK_THROWS_AS(pytorch::snapshot_pickle({m, twice}), UsageError);
  r.alloc.deallocate(p);
}

TEST_CASE("export: files are written whole or not at all", "[export]") {
  const auto dir = std::filesystem::temp_directory_path() / ("tp-export-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "snap.pickle";
  CHECK_NOTHROW(pytorch::check_writable(file));
  CHECK_FALSE(std::filesystem::exists(file));  // the probe leaves nothing behind
  pytorch::write_file_atomically(file, "abc");
  std::ifstream in(file);
  std::string text;
  in >> text;
  CHECK(text == "abc");
  CHECK_THROWS_WITH(pytorch::check_writable(dir / "missing" / "x.pickle"), Contains("missing"));
  CHECK_THROWS_WITH(pytorch::check_writable(dir), Contains("directory"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);  // no temporary left
  std::filesystem::remove_all(dir);
}

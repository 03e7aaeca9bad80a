// The replay-target conformance suite: every target of conformance_targets() (every name in
// target_names(); in tests/cuda, the real CUB allocator) must keep its books, report consistent
// peaks, fail an impossible request cleanly and stay usable, respect its capacity, and replay
// deterministically. A new model or allocator gets the whole suite by being listed in the
// registry; the rules peculiar to one target are tested in its own file (test_models.cpp, ...).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "support/skip.hpp"
#include "conformance.hpp"
#include "random_workload.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/replay/timeline.hpp"
#include "tensorpool/trace/load.hpp"
#include "support/workloads.hpp"

using namespace tensorpool;
using namespace tensorpool::replay;
using trace::Op;
using trace::TraceEvent;

namespace {

using testing::ConformanceTarget;

std::unique_ptr<ReplayTarget> make(const ConformanceTarget& target, std::size_t capacity) {
  if (target.prepare) target.prepare(capacity);
  TargetOptions o;
  o.capacity = capacity;
  return target.make(o);
}

ReplayOptions replay_options(const ConformanceTarget& target, std::size_t capacity) {
  if (target.prepare) target.prepare(capacity);
  ReplayOptions o;
  o.allocator = target.descriptor.name;
  o.make_target = target.make;
  o.target.capacity = capacity;
  return o;
}

ReplayResult replay_total(const trace::Trace& t, const ConformanceTarget& target,
                          std::size_t capacity = 80 * GiB) {
  TraceSource source(t);
  return tensorpool::replay::replay(source, replay_options(target, capacity)).total;
}

// After everything is freed: empty_cache() gives every byte back, or, for a target that holds its
// memory until destroyed (RMM's resources: a pool never shrinks, the arena is fixed), nothing.
void check_empty_cache_when_all_freed(ReplayTarget& t, const TargetDescriptor& d) {
  REQUIRE(t.allocated() == 0);
  const std::size_t reserved = t.reserved();
  const UpstreamCounts upstream = t.upstream();
  t.empty_cache();
  if (d.holds_memory_until_destroyed) {
    REQUIRE(t.reserved() == reserved);
    REQUIRE(t.upstream().total() == upstream.total());
    REQUIRE(t.upstream().frees == 0);
  } else {
    REQUIRE(t.reserved() == 0);
    REQUIRE(t.upstream().allocs == t.upstream().frees);  // (maps and unmaps count operations
                                                        // on ranges: they need not pair up)
  }
}

// Every measured field but the host time, for comparing two replays.
auto figures(const ReplayResult& r) {
  const auto counts = [](const UpstreamCounts& u) {
    return std::make_tuple(u.allocs, u.frees, u.maps, u.unmaps, u.syncs, u.modelled_ns);
  };
  return std::make_tuple(r.allocator, r.device, r.events, r.allocs, r.frees, r.unmatched_frees,
                         r.ooms, r.peak_requested, r.peak_allocated, r.peak_reserved,
                         r.reserved_at_requested_peak, r.final_reserved, r.utilization, r.waste,
                         counts(r.upstream), counts(r.seeding), r.iterations,
                         counts(r.upstream_after_first_iteration));
}

TraceEvent ev(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream = 0) {
  TraceEvent e;
  e.op = op;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  return e;
}

// A small window that starts mid-run: seed segments and live blocks, two streams, a
// record_stream, a stream sync, an address reused, blocks live at the end.
trace::Trace seeded_trace() {
  trace::Trace t;
  t.events = {ev(Op::seed_segment, 0x10000000, 20 * MiB), ev(Op::seed_segment, 0x20000000, 2 * MiB),
              ev(Op::seed_alloc, 0x10000000, 6 * MiB), ev(Op::seed_alloc, 0x20000000, 4096),
              ev(Op::alloc, 0x30000000, 48 * MiB, 7), ev(Op::alloc, 0x40000000, 700 * KiB),
              ev(Op::record_stream, 0x40000000, 0, 7), ev(Op::free_requested, 0x40000000, 700 * KiB),
              ev(Op::stream_sync, 0, 0, 7), ev(Op::free_requested, 0x10000000, 6 * MiB),
              ev(Op::alloc, 0x10000000, 3 * MiB), ev(Op::free_requested, 0x30000000, 48 * MiB, 7)};
  t.events[4].stream = 7;
  for (auto& e : t.events)
    if (e.op == Op::seed_segment && e.size == 2 * MiB) e.flags = trace::kFlagSmallPool;
  return t;
}

trace::Trace generated_trace() { return tptest::generated(std::string(tptest::kSmallTraining) + ",steps:4"); }

// The peak figures of one replay agree with each other.
void check_peaks(const ReplayResult& r, std::size_t capacity) {
  CHECK(r.peak_reserved >= r.peak_allocated);
  CHECK(r.peak_allocated >= r.peak_requested);
  CHECK(r.reserved_at_requested_peak <= r.peak_reserved);
  CHECK(r.reserved_at_requested_peak >= r.peak_requested);
  CHECK(r.final_reserved <= r.peak_reserved);
  CHECK(r.peak_reserved <= capacity);
  CHECK(r.utilization <= 1.0);
  CHECK(r.utilization > 0.0);
  CHECK(r.waste == r.peak_reserved - r.peak_requested);
  CHECK(r.upstream.allocs + r.seeding.allocs >= r.upstream.frees + r.seeding.frees);
}

// Shared traces, loaded once for the whole suite; empty when the folder is absent.
const std::map<std::string, trace::Trace>& shared_traces() {
  static const std::map<std::string, trace::Trace> traces = [] {
    std::map<std::string, trace::Trace> out;
    const std::filesystem::path dir = TENSORPOOL_SHARED_TRACES;
    if (!std::filesystem::exists(dir)) return out;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".pickle")
        out.emplace(entry.path().filename().string(), trace::load_trace(entry.path().string()));
    return out;
  }();
  return traces;
}

}  // namespace

TEST_CASE("conformance: the books balance under a random workload", "[conformance]") {
  const std::size_t capacity = 1 * GiB;
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      auto t = make(target, capacity);
      REQUIRE(t->name() == name);
      const bool holds = target.descriptor.holds_memory_until_destroyed;
      REQUIRE(t->allocated() == 0);
      if (!holds) REQUIRE(t->reserved() == 0);  // (the others may take an initial pool)
      std::size_t reserved_before = t->reserved();
      UpstreamCounts upstream_before = t->upstream();
      // Held memory changes only with a device call, and is held iff more was taken than given;
      // a target that holds its memory until destroyed never frees any.
      const auto consistent = [&](const ReplayTarget& now) {
        const UpstreamCounts u = now.upstream();
        if (u.total() == upstream_before.total()) REQUIRE(now.reserved() == reserved_before);
        REQUIRE((now.reserved() > 0) == (u.allocs > u.frees));
        if (holds) REQUIRE(u.frees == 0);
        reserved_before = now.reserved();
        upstream_before = u;
      };
      consistent(*t);
      const testing::WorkloadResult w =
          testing::run_random_workload(*t, capacity, /*with_empty_cache=*/true, consistent);
      WARN(name << ": " << w.ooms << " OOMs, " << t->upstream().allocs << " upstream allocs, "
                << w.live.size() << " blocks live at the end");
      for (const auto& l : w.live) {
        const std::size_t before = t->allocated();
        t->deallocate(l.p, l.bytes, 0);
        REQUIRE(t->allocated() <= before);
      }
      for (Stream s = 0; s < 3; ++s) t->stream_synchronized(s);
      REQUIRE(t->allocated() == 0);  // every allocation freed
      check_empty_cache_when_all_freed(*t, target.descriptor);
    }
  }
}

TEST_CASE("conformance: an allocation grows allocated by at least its size, within reserved",
          "[conformance]") {
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      auto t = make(target, 8 * GiB);
      std::vector<std::pair<void*, std::size_t>> live;
      for (std::size_t bytes : {std::size_t{1}, std::size_t{511}, std::size_t{4097}, 1 * MiB,
                                1 * MiB + 1, 11 * MiB, 300 * MiB}) {
        INFO(bytes << " bytes");
        const std::size_t before = t->allocated();
        live.emplace_back(t->allocate(bytes, 0), bytes);
        REQUIRE(live.back().first != nullptr);
        REQUIRE(t->allocated() >= before + bytes);
        REQUIRE(t->reserved() >= t->allocated());
      }
      for (std::size_t i = 0; i < live.size(); ++i)
        for (std::size_t j = i + 1; j < live.size(); ++j) REQUIRE(live[i].first != live[j].first);
      for (const auto& [p, bytes] : live) t->deallocate(p, bytes, 0);
      REQUIRE(t->allocated() == 0);
    }
  }
}

TEST_CASE("conformance: a request above the capacity throws OutOfMemoryError and changes nothing",
          "[conformance]") {
  const std::size_t capacity = 256 * MiB;
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      auto t = make(target, capacity);
      void* kept = t->allocate(10 * MiB, 0);
      const std::size_t allocated = t->allocated();
      const std::size_t reserved = t->reserved();
      for (std::size_t bytes : {capacity + 1, 4 * capacity, std::size_t{1} << 62}) {
        INFO(bytes << " bytes");
        try {
          t->allocate(bytes, 0);
          FAIL("no OutOfMemoryError");
        } catch (const OutOfMemoryError& e) {
          REQUIRE(e.info().requested == bytes);
        }
        REQUIRE(t->allocated() == allocated);
        REQUIRE(t->reserved() <= reserved);  // it may have released cache trying
      }
      // Still usable: allocate, free, and the books close.
      void* p = t->allocate(100 * MiB, 0);
      REQUIRE(p != nullptr);
      t->deallocate(p, 100 * MiB, 0);
      t->deallocate(kept, 10 * MiB, 0);
      check_empty_cache_when_all_freed(*t, target.descriptor);
    }
  }
}

TEST_CASE("conformance: filling the device ends in OutOfMemoryError within the capacity",
          "[conformance]") {
  const std::size_t capacity = 256 * MiB;
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      auto t = make(target, capacity);
      std::vector<void*> live;
      bool refused = false;
      for (int i = 0; i < 64 && !refused; ++i) {
        try {
          live.push_back(t->allocate(30 * MiB, 0));
        } catch (const OutOfMemoryError&) {
          refused = true;
        }
        REQUIRE(t->reserved() <= capacity);
      }
      REQUIRE(refused);
      REQUIRE(live.size() >= 4);                          // ... not before a fair share is used
      REQUIRE(live.size() * 30 * MiB <= capacity);
      t->deallocate(live.back(), 30 * MiB, 0);            // room again: the next one fits
      live.back() = t->allocate(30 * MiB, 0);
      for (void* p : live) t->deallocate(p, 30 * MiB, 0);
      REQUIRE(t->allocated() == 0);
    }
  }
}

TEST_CASE("conformance: replayed traces give consistent peaks, within the capacity", "[conformance]") {
  const trace::Trace generated = generated_trace();
  const trace::Trace seeded = seeded_trace();
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      const ReplayResult g = replay_total(generated, target);
      check_peaks(g, 80 * GiB);
      CHECK(g.ooms == 0);
      CHECK(g.unmatched_frees == 0);
      CHECK(g.iterations == 4);
      const ReplayResult s = replay_total(seeded, target);
      check_peaks(s, 80 * GiB);
      CHECK(s.unmatched_frees == 0);
      CHECK(s.allocs == 5);
      CHECK(s.peak_requested == 6 * MiB + 4096 + 48 * MiB + 700 * KiB);
      // On a device too small for the generated trace: refusals, and never more than it holds.
      const std::size_t small = 1 * GiB;
      const ReplayResult tight = replay_total(generated, target, small);
      CHECK(tight.peak_reserved <= small);
      CHECK(tight.ooms > 0);
      CHECK(tight.unmatched_frees == 0);  // the frees of refused allocations are skipped
    }
  }
}

TEST_CASE("conformance: the same trace replays to the same figures", "[conformance]") {
  const trace::Trace generated = generated_trace();
  const trace::Trace seeded = seeded_trace();
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const std::string& name = target.descriptor.name;
    DYNAMIC_SECTION(name) {
      CHECK(figures(replay_total(generated, target)) == figures(replay_total(generated, target)));
      CHECK(figures(replay_total(seeded, target)) == figures(replay_total(seeded, target)));
      CHECK(figures(replay_total(generated, target, GiB)) == figures(replay_total(generated, target, GiB)));
    }
  }
}

TEST_CASE("conformance: the shared traces replay with consistent, deterministic figures",
          "[conformance][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  REQUIRE(!shared_traces().empty());
  for (const auto& [file, t] : shared_traces()) {
    for (const ConformanceTarget& target : testing::conformance_targets()) {
      INFO(file << ", " << target.descriptor.name);
      TraceSource source(t);
      const ReplayOptions o = replay_options(target, 80 * GiB);
      const ReplayReport r = tensorpool::replay::replay(source, o);
      for (const ReplayResult& d : r.devices) check_peaks(d, o.target.capacity);  // per device
      check_peaks(r.total, o.target.capacity * r.devices.size());  // separate memories add up
      CHECK(r.total.unmatched_frees == 0);
      CHECK(figures(r.total) == figures(replay_total(t, target)));
    }
  }
}

TEST_CASE("conformance: a target exports a snapshot iff its descriptor says so, and the snapshot "
          "is its memory", "[conformance][export]") {
  const trace::Trace seeded = seeded_trace();
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const TargetDescriptor& d = target.descriptor;
    DYNAMIC_SECTION(d.name) {
      REQUIRE(make(target, GiB)->record_history() == d.exports);
      TraceSource source(seeded);
      ReplayOptions o = replay_options(target, GiB);
      o.record_history = true;
      if (!d.exports) {
        CHECK_THROWS_WITH(tensorpool::replay::replay(source, o), Catch::Matchers::Contains("cannot export"));
        CHECK_THROWS_AS(tensorpool::replay::replay(source, o), UsageError);
        continue;
      }
      const ReplayReport r = tensorpool::replay::replay(source, o);
      REQUIRE(r.memory.size() == 1);
      const trace::pytorch::DeviceMemory& m = r.memory.front();
      CHECK(m.device == r.devices.front().device);
      std::size_t live_requested = 0, mapped_bytes = 0;
      bool on_stream_7 = false;
      for (const SegmentInfo& s : m.state.segments) {
        on_stream_7 = on_stream_7 || s.stream == 7;  // the trace's stream id, not the device's
        for (const BlockInfo& b : s.blocks) {
          if (b.mapped) mapped_bytes += b.size;
          if (b.state == BlockState::allocated) live_requested += b.requested;
        }
      }
      CHECK(live_requested == 4096 + 3 * MiB);  // the blocks live at the end, as asked for
      CHECK(mapped_bytes <= r.total.final_reserved);  // vmm: pages cached unmapped are not shown
      CHECK(mapped_bytes >= 4096 + 3 * MiB);
      CHECK(on_stream_7);
      std::size_t allocs = 0, frees = 0;
      for (const trace::pytorch::HistoryEntry& h : m.history) {
        allocs += h.event.type == EventType::alloc;
        frees += h.event.type == EventType::free_requested;
      }
      CHECK(allocs >= 3);  // the window's three allocations at least (seeds may add theirs)
      CHECK(frees == 3);
      CHECK(!r.settings.empty());
    }
  }
}

namespace {

// A map's structure: segments in address order, apart, each tiled exactly by its blocks; what it
// shows agrees with the target's own counts.
void check_map(const MemoryMap& m, const ReplayTarget& t) {
  Address end_of_previous = 0;
  for (const MapSegment& s : m.segments) {
    REQUIRE(s.size > 0);
    REQUIRE(s.address >= end_of_previous);
    end_of_previous = s.address + s.size;
    Address at = s.address;
    for (const MapBlock& b : s.blocks) {
      REQUIRE(b.address == at);
      REQUIRE(b.size > 0);
      REQUIRE((b.mapped || b.state == BlockState::free));
      at += b.size;
    }
    REQUIRE(at == s.address + s.size);
  }
  REQUIRE(m.mapped_bytes() <= t.reserved());      // vmm: pages cached unmapped have no address
  REQUIRE(m.allocated_bytes() >= t.allocated());  // blocks may be larger than the target counts
  REQUIRE(m.largest_free_block() <= m.mapped_bytes() - m.allocated_bytes());
}

}  // namespace

TEST_CASE("conformance: a target shows its memory map iff its descriptor says so, and the map is "
          "its memory", "[conformance][map]") {
  const std::size_t capacity = 1 * GiB;
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const TargetDescriptor& d = target.descriptor;
    DYNAMIC_SECTION(d.name) {
      auto t = make(target, capacity);
      REQUIRE(t->memory_map().has_value() == d.maps);
      if (!d.maps) continue;
      int step = 0;
      std::size_t most_allocated = 0;
      const auto check = [&](const ReplayTarget& now) {
        if (++step % 97 != 0) return;  // a map is linear in the blocks: every 97th step
        const std::optional<MemoryMap> m = now.memory_map();
        REQUIRE(m.has_value());
        check_map(*m, now);
        most_allocated = std::max(most_allocated, m->allocated_bytes());
      };
      const testing::WorkloadResult w = testing::run_random_workload(*t, capacity, true, check);
      CHECK(most_allocated > 0);
      const std::size_t live = w.live.size();
      for (const auto& l : w.live) t->deallocate(l.p, l.bytes, 0);
      for (Stream s = 0; s < 3; ++s) t->stream_synchronized(s);
      const MemoryMap end = *t->memory_map();
      check_map(end, *t);
      CHECK(end.allocated_bytes() == 0);
      INFO(live << " blocks were live before the last frees");
      t->empty_cache();
      check_map(*t->memory_map(), *t);
      if (!d.holds_memory_until_destroyed) CHECK(t->memory_map()->mapped_bytes() == 0);
    }
  }
}

TEST_CASE("conformance: the engine's map names each live block's request and allocation site",
          "[conformance][map]") {
  trace::Trace t = seeded_trace();
  const std::uint32_t site = t.intern("model.py:42 forward");
  for (auto& e : t.events)
    if (e.op == Op::alloc && e.addr == 0x10000000) e.label = site;  // the 3 MiB block live at the end
  for (const ConformanceTarget& target : testing::conformance_targets()) {
    const TargetDescriptor& d = target.descriptor;
    DYNAMIC_SECTION(d.name) {
      MapCapture at_end(0, t.events.size() - 1);
      ReplayOptions o = replay_options(target, GiB);
      o.observer = &at_end;
      TraceSource source(t);
      tensorpool::replay::replay(source, o);
      REQUIRE(at_end.map().has_value() == d.maps);
      if (!d.maps) continue;
      std::size_t requested = 0;
      bool labelled = false;
      for (const MapSegment& s : at_end.map()->segments)
        for (const MapBlock& b : s.blocks) {
          requested += b.requested;
          labelled = labelled || (b.label == site && b.requested == 3 * MiB);
          if (b.state != BlockState::allocated) CHECK(b.requested == 0);
        }
      CHECK(requested == 4096 + 3 * MiB);  // the blocks live at the end, as asked for
      CHECK(labelled);
    }
  }
}

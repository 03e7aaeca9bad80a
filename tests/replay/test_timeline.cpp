// The replay observer (observer.hpp), the progress callback, and what the timeline recorder and
// the map capture keep (timeline.hpp): the figures the report draws.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "tensorpool/replay/replay.hpp"
#include "tensorpool/replay/timeline.hpp"
#include "tensorpool/types.hpp"
#include "support/workloads.hpp"

using namespace tensorpool;
using namespace tensorpool::replay;
using trace::Op;

namespace {

trace::Trace generated(int steps = 4) {
  return tptest::generated(std::string(tptest::kSmallTraining) + ",steps:" + std::to_string(steps));
}

// Keeps every point it is shown, and the OOM reports.
struct Recorder final : ReplayObserver {
  std::vector<ReplayPoint> points;
  std::vector<Op> ops;
  std::vector<OomReport> ooms;
  void after_event(const ReplayPoint& p, const ReplayView&) override {
    points.push_back(p);
    ops.push_back(p.trace_event->op);
  }
  void on_first_oom(const OomReport& o, const ReplayView& view) override {
    ooms.push_back(o);
    CHECK(view.target().reserved() <= o.info.capacity);
  }
};

ReplayReport run(const trace::Trace& t, ReplayObserver* observer, std::size_t capacity = 80 * GiB,
                 int warmup = 0, const std::string& allocator = "tensorpool") {
  TraceSource source(t);
  ReplayOptions o;
  o.allocator = allocator;
  o.target.capacity = capacity;
  o.warmup = warmup;
  o.observer = observer;
  return tensorpool::replay::replay(source, o);
}

}  // namespace

TEST_CASE("an observer sees every event of the measured pass, with the engine's figures", "[replay][observer]") {
  const trace::Trace t = generated();
  for (int warmup : {0, 2}) {
    INFO("warmup " << warmup);
    Recorder r;
    const ReplayResult result = run(t, &r, 80 * GiB, warmup).total;
    REQUIRE(r.points.size() == t.events.size());  // once per event, warm-up passes unseen
    for (std::size_t i = 0; i < r.points.size(); ++i) {
      REQUIRE(r.points[i].event == i);
      REQUIRE(r.ops[i] == t.events[i].op);
    }
    const auto max_of = [&](auto field) {
      std::size_t m = 0;
      for (const ReplayPoint& p : r.points) m = std::max(m, p.*field);
      return m;
    };
    CHECK(max_of(&ReplayPoint::requested) == result.peak_requested);
    CHECK(max_of(&ReplayPoint::allocated) == result.peak_allocated);
    CHECK(max_of(&ReplayPoint::reserved) == result.peak_reserved);
    CHECK(r.ooms.empty());
  }
}

TEST_CASE("an observer is told of the first OOM, as the result reports it", "[replay][observer][oom]") {
  const trace::Trace t = generated();
  Recorder r;
  const ReplayResult result = run(t, &r, 256 * MiB).total;
  REQUIRE(result.ooms > 0);
  REQUIRE(r.ooms.size() == 1);
  CHECK(r.ooms[0].event == result.first_oom->event);
  CHECK(r.ooms[0].info.requested == result.first_oom->info.requested);
}

TEST_CASE("observing a replay changes none of its figures", "[replay][observer]") {
  const trace::Trace t = generated();
  Recorder r;
  const ReplayResult watched = run(t, &r, 512 * MiB).total;
  const ReplayResult plain = run(t, nullptr, 512 * MiB).total;
  CHECK(watched.peak_reserved == plain.peak_reserved);
  CHECK(watched.peak_allocated == plain.peak_allocated);
  CHECK(watched.ooms == plain.ooms);
  CHECK(watched.upstream.total() == plain.upstream.total());
}

TEST_CASE("the progress callback counts every event read, every pass", "[replay][progress]") {
  const trace::Trace t = generated();
  std::vector<std::uint64_t> calls;
  TraceSource source(t);
  ReplayOptions o;
  o.warmup = 1;
  o.progress = [&](std::uint64_t read) { calls.push_back(read); };
  o.progress_every = 1000;
  tensorpool::replay::replay(source, o);
  REQUIRE(!calls.empty());
  CHECK(calls.back() == 2 * t.events.size());
  CHECK(calls.size() == 2 * t.events.size() / 1000 + 1);
  CHECK(std::is_sorted(calls.begin(), calls.end()));
}

TEST_CASE("the timeline keeps min and max per column, so peaks survive downsampling", "[replay][timeline]") {
  const trace::Trace t = generated();
  const std::size_t columns = 100;
  TimelineRecorder recorder(0, t.events.size(), columns);
  const ReplayResult result = run(t, &recorder).total;
  const Timeline& tl = recorder.timeline();
  REQUIRE(tl.events == t.events.size());
  REQUIRE(tl.first_event.size() == columns);
  REQUIRE(tl.first_event.front() == 0);
  CHECK(std::is_sorted(tl.first_event.begin(), tl.first_event.end()));
  for (const Band* b : {&tl.requested, &tl.allocated, &tl.reserved, &tl.unallocated}) {
    REQUIRE(b->min.size() == columns);
    REQUIRE(b->max.size() == columns);
    for (std::size_t i = 0; i < columns; ++i) REQUIRE(b->min[i] <= b->max[i]);
  }
  CHECK(*std::max_element(tl.requested.max.begin(), tl.requested.max.end()) == result.peak_requested);
  CHECK(*std::max_element(tl.allocated.max.begin(), tl.allocated.max.end()) == result.peak_allocated);
  CHECK(*std::max_element(tl.reserved.max.begin(), tl.reserved.max.end()) == result.peak_reserved);
  CHECK(tl.peak_reserved == result.peak_reserved);
  CHECK(tl.iterations.size() == 4);
  for (std::uint64_t i : tl.iterations) CHECK(t.events[i].op == Op::iteration);
  REQUIRE(tl.largest_free.size() == columns);  // tensorpool keeps a map
  for (std::size_t i = 0; i < columns; ++i) CHECK(tl.largest_free[i] <= tl.reserved.max[i]);
}

TEST_CASE("a trace shorter than the columns gets one column per event", "[replay][timeline]") {
  trace::Trace t;
  for (std::uint64_t i = 0; i < 10; ++i) {
    trace::TraceEvent e;
    e.op = Op::alloc;
    e.addr = 0x1000 * (i + 1);
    e.size = MiB;
    t.events.push_back(e);
  }
  TimelineRecorder recorder(0, t.events.size(), 1000);
  run(t, &recorder);
  const Timeline& tl = recorder.timeline();
  REQUIRE(tl.first_event.size() == 10);
  for (std::size_t i = 0; i < 10; ++i) {
    CHECK(tl.first_event[i] == i);
    CHECK(tl.requested.max[i] == (i + 1) * MiB);
  }
}

TEST_CASE("the moment of peak reserved is the fullest one, and a second replay maps it", "[replay][timeline][map]") {
  const trace::Trace t = generated();
  for (const char* allocator : {"tensorpool", "pytorch", "rmm-arena", "cub"}) {
    INFO(allocator);
    TimelineRecorder recorder(0, t.events.size(), 200);
    const ReplayResult result = run(t, &recorder, 80 * GiB, 0, allocator).total;
    const Timeline& tl = recorder.timeline();
    REQUIRE(tl.peak_reserved == result.peak_reserved);
    MapCapture capture(0, tl.peak_event);
    run(t, &capture, 80 * GiB, 0, allocator);
    REQUIRE(capture.map().has_value());
    const MemoryMap& m = *capture.map();
    CHECK(m.mapped_bytes() <= tl.peak_reserved);
    CHECK(m.allocated_bytes() >= tl.allocated_at_peak);
    // No event at the peak of reserved had more allocated (rmm-arena holds its arena from the
    // first event: its moment is its fullest, not its first).
    Recorder all;
    run(t, &all, 80 * GiB, 0, allocator);
    for (const ReplayPoint& p : all.points)
      if (p.reserved == tl.peak_reserved) REQUIRE(p.allocated <= tl.allocated_at_peak);
    CHECK(all.points[tl.peak_event].reserved == tl.peak_reserved);
    CHECK(all.points[tl.peak_event].allocated == tl.allocated_at_peak);
  }
}

TEST_CASE("the first OOM's map is the memory at that moment", "[replay][timeline][oom]") {
  const trace::Trace t = generated();
  TimelineRecorder recorder(0, t.events.size(), 100);
  const ReplayResult result = run(t, &recorder, 256 * MiB).total;
  REQUIRE(result.first_oom.has_value());
  REQUIRE(recorder.first_oom().has_value());
  REQUIRE(recorder.oom_map().has_value());
  const MemoryMap& m = *recorder.oom_map();
  CHECK(m.mapped_bytes() == result.first_oom->info.reserved);
  CHECK(m.largest_free_block() == result.first_oom->info.largest_free_block);
  std::size_t requested = 0;
  for (const MapSegment& s : m.segments)
    for (const MapBlock& b : s.blocks) requested += b.requested;
  CHECK(requested <= result.first_oom->info.allocated);
  CHECK(requested > 0);
}

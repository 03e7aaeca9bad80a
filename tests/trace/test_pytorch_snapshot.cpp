// Tests of the PyTorch snapshot importer (trace/pytorch_snapshot.hpp): synthetic snapshots from
// make_fixtures.py checked event by event (mid-run window, several devices, expandable segments,
// a state-only snapshot), errors naming the path of bad values, and the real snapshots in
// shared/traces: event counts per device, and a replay of seeds + events that must stay
// consistent and end at the final segments' size.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/skip.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

namespace fs = std::filesystem;
using namespace tensorpool::trace;

// ------------------------------------------------------------------------------------------------
// The replay check, shared with test_rmm_log.cpp (declared there).

namespace importer_test {

struct ReplayResult {
  std::size_t problem_count = 0;
  std::vector<std::string> problems;            // the first few, for the test log
  std::map<std::uint16_t, std::uint64_t> held;  // segment bytes per device at the end
  std::map<std::uint16_t, std::uint64_t> live;  // live blocks per device at the end
};

ReplayResult replay(const Trace& trace, bool check_containment);

}  // namespace importer_test

namespace {

using importer_test::ReplayResult;

struct DeviceState {
  std::map<std::uint64_t, std::uint64_t> live;      // addr -> size
  std::set<std::uint64_t> pending;                  // free requested, not completed
  std::map<std::uint64_t, std::uint64_t> segments;  // addr -> size
  std::map<std::uint64_t, std::uint64_t> mapped;    // expandable: start -> end, disjoint
};

bool overlaps(const std::map<std::uint64_t, std::uint64_t>& ranges, std::uint64_t a,
              std::uint64_t b) {
  auto it = ranges.lower_bound(a);
  if (it != ranges.end() && it->first < b) return true;
  return it != ranges.begin() && std::prev(it)->second > a;
}

bool unmap(std::map<std::uint64_t, std::uint64_t>& ranges, std::uint64_t a, std::uint64_t b) {
  std::uint64_t covered = a;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> hit;
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return false;
  for (--it; covered < b; ++it) {
    if (it == ranges.end() || it->first > covered || it->second <= covered) return false;
    hit.emplace_back(*it);
    covered = it->second;
  }
  for (const auto& [s, e] : hit) ranges.erase(s);
  if (hit.front().first < a) ranges.emplace(hit.front().first, a);
  if (hit.back().second > b) ranges.emplace(b, hit.back().second);
  return true;
}

bool contains(const DeviceState& d, std::uint64_t addr) {
  auto in = [addr](const std::map<std::uint64_t, std::uint64_t>& m, bool is_size) {
    auto it = m.upper_bound(addr);
    if (it == m.begin()) return false;
    --it;
    const std::uint64_t end = is_size ? it->first + it->second : it->second;
    return addr < end;
  };
  return in(d.segments, true) || in(d.mapped, false);
}

class Replayer {
 public:
  explicit Replayer(bool check_containment) : check_containment_(check_containment) {}

  void run(const Trace& trace) {
    bool seeding = true;
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const TraceEvent& e = trace.events[i];
      index_ = i;
      const bool seed = e.op == Op::seed_alloc || e.op == Op::seed_segment;
      if (seed && !seeding) problem(e, "seed after a non-seed event");
      seeding = seeding && seed;
      apply(devices_[e.device], e);
    }
    for (const auto& [device, d] : devices_) {
      std::uint64_t held = 0;
      for (const auto& [a, size] : d.segments) held += size;
      for (const auto& [a, end] : d.mapped) held += end - a;
      result_.held[device] = held;
      result_.live[device] = d.live.size();
    }
  }

  ReplayResult result() const { return result_; }

 private:
  void problem(const TraceEvent& e, const std::string& what) {
    if (result_.problems.size() < 8) {
      result_.problems.push_back("event " + std::to_string(index_) + " (" + to_string(e.op) +
                                 " device " + std::to_string(e.device) + " addr " +
                                 std::to_string(e.addr) + "): " + what);
    }
    ++result_.problem_count;
  }

  void apply(DeviceState& d, const TraceEvent& e) {
    switch (e.op) {
      case Op::seed_alloc:
      case Op::alloc:
        if (d.live.count(e.addr) != 0 || d.pending.count(e.addr) != 0)
          problem(e, "allocates a live address");
        if (check_containment_ && !contains(d, e.addr))
          problem(e, "allocates outside every segment");
        d.live[e.addr] = e.size;
        break;
      case Op::free_requested:
        if (d.live.erase(e.addr) == 0) problem(e, "frees an address that is not live");
        d.pending.insert(e.addr);
        break;
      case Op::free_completed:
        if (d.pending.erase(e.addr) == 0) problem(e, "completes a free never requested");
        break;
      case Op::seed_segment:
        if (e.flags & kFlagExpandable) return map(d, e);
        [[fallthrough]];
      case Op::segment_alloc:
        if (!d.segments.emplace(e.addr, e.size).second) problem(e, "segment exists already");
        break;
      case Op::segment_free:
        if (d.segments.erase(e.addr) == 0) problem(e, "frees a segment not held");
        break;
      case Op::segment_map: map(d, e); break;
      case Op::segment_unmap:
        if (!unmap(d.mapped, e.addr, e.addr + e.size)) problem(e, "unmaps a range not mapped");
        break;
      default: break;
    }
  }

  void map(DeviceState& d, const TraceEvent& e) {
    if (overlaps(d.mapped, e.addr, e.addr + e.size)) problem(e, "maps a mapped range");
    d.mapped.emplace(e.addr, e.addr + e.size);
  }

  bool check_containment_;
  std::size_t index_ = 0;
  std::map<std::uint16_t, DeviceState> devices_;
  ReplayResult result_;
};

}  // namespace

namespace importer_test {

ReplayResult replay(const Trace& trace, bool check_containment) {
  Replayer r(check_containment);
  r.run(trace);
  return r.result();
}

}  // namespace importer_test

// ------------------------------------------------------------------------------------------------

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

fs::path fixture(const std::string& name) { return fs::path(TENSORPOOL_IMPORTER_FIXTURES) / name; }

struct Expected {
  Op op;
  std::uint16_t device;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint8_t flags = 0;
  std::int64_t time = 0;
  std::string label = "";
  std::uint64_t stream = 0;
};

void check_events(const Trace& trace, const std::vector<Expected>& expected) {
  REQUIRE(trace.events.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    const Expected& x = expected[i];
    INFO("event " << i << ": " << to_string(e.op) << " addr " << e.addr);
    CHECK(e.op == x.op);
    CHECK(e.device == x.device);
    CHECK(e.addr == x.addr);
    CHECK(e.size == x.size);
    CHECK(int{e.flags} == int{x.flags});
    CHECK(e.time_us == x.time);
    CHECK(e.stream == x.stream);
    REQUIRE(e.label < trace.labels.size());
    CHECK(trace.labels[e.label] == x.label);
  }
}

void check_consistent(const Trace& trace, bool containment = true) {
  const ReplayResult r = importer_test::replay(trace, containment);
  for (const auto& p : r.problems) UNSCOPED_INFO(p);
  CHECK(r.problem_count == 0);
}

template <typename F>
pytorch::SnapshotError snapshot_error(F&& f) {
  try {
    f();
  } catch (const pytorch::SnapshotError& e) {
    return e;
  }
  FAIL("expected a SnapshotError");
  throw std::logic_error("unreachable");
}

const std::string kStep = "step (/src/train.py:10)";
const std::string kForward = "forward (/src/model.py:42)";

}  // namespace

TEST_CASE("pytorch: a mid-run window gets seeds for what existed before it", "[pytorch]") {
  const Trace trace = pytorch::import_snapshot(fixture("snap_mid_window.pickle"));
  CHECK(trace.info.source == "pytorch-snapshot:snap_mid_window.pickle");
  CHECK(trace.info.metadata ==
        std::vector<std::string>{"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128",
                                 "max_split_size=134217728", "garbage_collection_threshold=0.0",
                                 "expandable_segments=False", "roundup_power2_divisions.1=0",
                                 "roundup_power2_divisions.2=4"});
  const std::uint64_t A = 0x7F0000000000, B = 0x7F0001000000, D = 0x7F0002000000,
                      E = 0x7F0003000000;
  check_events(
      trace,
      {
          {Op::seed_segment, 0, A, 20 * MiB, 0, 1000},                // held at the end, no event
          {Op::seed_segment, 0, D, 20 * MiB, 0, 1000},                // freed in the window
          {Op::seed_segment, 0, E, 2 * MiB, kFlagSmallPool, 1000},    // freed; 2 MiB: small pool
          {Op::seed_alloc, 0, A + 2 * MiB, 4000000, 0, 1000, kStep},  // live at the end, untouched
          {Op::seed_alloc, 0, A + 6 * MiB, 2000000, 0, 1000},         // freed before allocated
          {Op::seed_alloc, 0, A + 8 * MiB, 1000000, 0, 1000},         // active_pending_free
          {Op::seed_alloc, 0, A + 9 * MiB, 1000, 0, 1000},            // free_completed only
          {Op::free_requested, 0, A + 6 * MiB, 2000000, 0, 1000, kStep},
          {Op::free_completed, 0, A + 6 * MiB, 2000000, 0, 1001, kStep},
          {Op::segment_free, 0, D, 20 * MiB, 0, 1002},
          {Op::segment_alloc, 0, B, 2 * MiB, kFlagSmallPool,
           1003},  // "small" in the final segments
          {Op::alloc, 0, B, 500, 0, 1004},
          {Op::alloc, 0, A, 2000000, 0, 1005, kForward},  // first Python frame
          {Op::segment_free, 0, E, 2 * MiB, kFlagSmallPool,
           1007},                                               // (the snapshot marker is skipped)
          {Op::oom, 0, 0, std::uint64_t{1} << 40, 0, 0},        // no addr, no time
          {Op::free_requested, 0, A + 9 * MiB, 1000, 0, 1009},  // synthesized
          {Op::free_completed, 0, A + 9 * MiB, 1000, 0, 1009},
      });
  check_consistent(trace);
}

TEST_CASE("pytorch: devices are converted one after another, seeds first", "[pytorch]") {
  const Trace trace = pytorch::import_snapshot(fixture("snap_multi_device.pickle"));
  const std::uint64_t S0 = 0x100000000, S1 = 0x200000000, S3 = 0x400000000;
  check_events(
      trace, {
                 {Op::seed_segment, 1, S1, 20 * MiB, 0, 20},
                 {Op::seed_alloc, 1, S1, 20 * MiB, 0, 20, "", 7},
                 // Device 3 has a segment but no trace (device_traces has 3 lists, the last empty).
                 {Op::seed_segment, 3, S3, 2 * MiB, kFlagSmallPool, 0},
                 {Op::seed_alloc, 3, S3, 100, 0, 0},
                 {Op::segment_alloc, 0, S0, 20 * MiB, 0, 10},
                 {Op::alloc, 0, S0, 4 * MiB, 0, 11},
                 {Op::free_requested, 0, S0, 4 * MiB, 0, 12},
                 {Op::free_completed, 0, S0, 4 * MiB, 0, 13},
                 {Op::free_requested, 1, S1, 20 * MiB, 0, 20, "", 7},
                 {Op::free_completed, 1, S1, 20 * MiB, 0, 21, "", 7},
                 {Op::alloc, 1, S1, 20 * MiB, 0, 22, "", 7},
             });
  check_consistent(trace);
}

TEST_CASE("pytorch: expandable segments seed the ranges mapped at the window's start",
          "[pytorch]") {
  const Trace trace = pytorch::import_snapshot(fixture("snap_expandable.pickle"));
  const std::uint64_t R = 0x7E0000000000, S = 0x7E1000000000;
  const auto exp = kFlagExpandable;
  const auto exp_small = static_cast<std::uint8_t>(kFlagExpandable | kFlagSmallPool);
  // Final mapped: [R, R+60M) and [S, S+4M). Undone: map [R+20M, R+40M), unmap [R+60M, R+100M),
  // map + unmap [R+100M, R+120M), map [S+2M, S+4M).
  check_events(trace, {
                          {Op::seed_segment, 0, R, 20 * MiB, exp, 1},
                          {Op::seed_segment, 0, R + 40 * MiB, 60 * MiB, exp,
                           1},  // [R+40M, R+60M) + [R+60M, R+100M)
                          {Op::seed_segment, 0, S, 2 * MiB, exp_small, 1},
                          {Op::seed_alloc, 0, R, 20 * MiB, 0, 1},
                          {Op::seed_alloc, 0, S, 512, 0, 1},
                          {Op::segment_map, 0, R + 20 * MiB, 20 * MiB, 0, 1},
                          {Op::alloc, 0, R + 20 * MiB, 20 * MiB, 0, 2},
                          {Op::segment_unmap, 0, R + 60 * MiB, 40 * MiB, 0, 3},
                          {Op::segment_map, 0, R + 100 * MiB, 20 * MiB, 0, 4},
                          {Op::segment_unmap, 0, R + 100 * MiB, 20 * MiB, 0, 5},
                          {Op::segment_map, 0, S + 2 * MiB, 2 * MiB, kFlagSmallPool, 6},
                      });
  check_consistent(trace);
  const ReplayResult r = importer_test::replay(trace, true);
  CHECK(r.held.at(0) == 64 * MiB);  // the final segments: 60 MiB + 4 MiB
}

TEST_CASE("pytorch: allocations in a private pool's segments are imported under its tag", "[pytorch]") {
  const Trace trace = pytorch::import_snapshot(fixture("snap_private_pool.pickle"));
  const std::uint64_t D = 0x7C0000000000, G = 0x7C0001000000;
  std::map<std::uint64_t, const TraceEvent*> by_addr;
  for (const TraceEvent& e : trace.events)
    if (e.op == Op::alloc || e.op == Op::seed_alloc) by_addr[e.addr] = &e;
  REQUIRE(by_addr.size() == 4);
  const auto tagged = [&](std::uint64_t addr) {
    const TraceEvent& e = *by_addr.at(addr);
    return (e.flags & kFlagTagged) != 0 ? std::string(trace.labels[e.label]) : std::string();
  };
  CHECK(tagged(G) == "pytorch-pool:1,0");            // allocated in the window
  CHECK(tagged(G + 4 * MiB) == "pytorch-pool:1,0");  // live from before it: a seed
  CHECK(tagged(D).empty());                          // the default pool: its frame stays
  CHECK(trace.labels[by_addr.at(D)->label] == "step (/src/train.py:10)");
  CHECK(tagged(D + 2 * MiB).empty());
  check_consistent(trace);
}

TEST_CASE("pytorch: a state-only snapshot becomes seeds, addresses from block sizes", "[pytorch]") {
  const pytorch::Snapshot snap = pytorch::load_snapshot(fixture("snap_state_only.pickle"));
  const std::uint64_t X = 0x7D0000000000, Y = 0x7D0001000000;
  REQUIRE(snap.segments.size() == 2);
  const auto& blocks = snap.segments[0].blocks;
  REQUIRE(blocks.size() == 3);
  CHECK(blocks[0].address == X);
  CHECK(blocks[1].address == X + 4 * MiB);
  CHECK(blocks[2].address == X + 10 * MiB);
  CHECK(blocks[2].address_computed);
  CHECK(blocks[2].state == "active_pending_free");
  CHECK_FALSE(snap.segments[0].is_expandable);
  CHECK(snap.allocator_settings.empty());
  REQUIRE(snap.device_traces.size() == 1);
  CHECK(pytorch::is_state_only(snap.device_traces[0]));
  const Trace trace = pytorch::to_trace(snap, "state.pickle");
  check_events(
      trace, {
                 {Op::seed_segment, 0, X, 20 * MiB, 0, 0},
                 {Op::seed_segment, 0, Y, 2 * MiB, kFlagSmallPool, 0},
                 {Op::seed_alloc, 0, X, 4000000, 0, 0, kForward},  // label from the block's history
                 {Op::seed_alloc, 0, X + 10 * MiB, 9000000, 0, 0, kForward},
                 {Op::seed_alloc, 0, Y, 512, 0, 0, kForward},
             });  // the stray free_completed is dropped
  CHECK(trace.info.metadata.empty());
}

TEST_CASE("pytorch: the bare segment list of memory_snapshot() is read as state only",
          "[pytorch]") {
  const Trace trace = pytorch::import_snapshot(fixture("snap_bare_segments.pickle"));
  check_events(trace, {
                          {Op::seed_segment, 0, 0x300000, 2 * MiB, kFlagSmallPool, 0},
                          {Op::seed_alloc, 0, 0x300000, 7, 0, 0},
                      });
}

TEST_CASE("pytorch: read_snapshot keeps the plain facts", "[pytorch]") {
  const pytorch::Snapshot snap = pytorch::load_snapshot(fixture("snap_mid_window.pickle"));
  REQUIRE(snap.segments.size() == 2);
  CHECK(snap.segments[1].small_pool());
  CHECK(snap.segments[1].total_size == 2 * MiB);
  CHECK(snap.segments[0].blocks[3].live());
  CHECK_FALSE(snap.segments[0].blocks[4].live());
  REQUIRE(snap.device_traces.size() == 1);
  const auto& events = snap.device_traces[0];
  REQUIRE(events.size() == 10);
  CHECK(events[6].action == pytorch::Action::snapshot);
  CHECK(events[8].action == pytorch::Action::oom);
  CHECK_FALSE(events[8].time_us.has_value());
  CHECK(events[8].addr == 0);
  REQUIRE(events[5].frame.has_value());
  CHECK(events[5].frame->label() == kForward);

  pytorch::ReadOptions top;
  top.frame = pytorch::FrameChoice::top;
  const pytorch::Snapshot snap_top = pytorch::load_snapshot(fixture("snap_mid_window.pickle"), top);
  CHECK(snap_top.device_traces[0][5].frame->label() == "torch::unwind::unwind() (??:0)");
  pytorch::ReadOptions none;
  none.frame = pytorch::FrameChoice::none;
  const Trace bare = pytorch::import_snapshot(fixture("snap_mid_window.pickle"), none);
  CHECK(bare.labels.size() == 1);
}

TEST_CASE("pytorch: stacks without Python frames are named by autograd node, then operator", "[pytorch]") {
  const pytorch::Snapshot snap = pytorch::load_snapshot(fixture("snap_cpp_stacks.pickle"));
  REQUIRE(snap.device_traces.size() == 1);
  const auto& events = snap.device_traces[0];
  REQUIRE(events.size() == 3);
  CHECK(events[0].frame->label() == "torch::autograd::generated::MeanBackward0_apply_functional (Functions.cpp:0)");
  CHECK(events[1].frame->label() == "at::_ops::mm::call (??:0)");
  CHECK(events[2].frame->label() == "torch::unwind::unwind() (??:0)");  // nothing better
  pytorch::ReadOptions top;
  top.frame = pytorch::FrameChoice::top;
  CHECK(pytorch::load_snapshot(fixture("snap_cpp_stacks.pickle"), top).device_traces[0][0].frame->label() ==
        "torch::unwind::unwind() (??:0)");
}

// PyTorch pickles a frame once and refers to it from every stack that holds it; the reader
// chooses each stack and reads each frame once, by node (pytorch_snapshot_reader.cpp).
TEST_CASE("pytorch: stacks and frames shared by several events are named as when apart", "[pytorch]") {
  const pytorch::Snapshot snap = pytorch::load_snapshot(fixture("snap_shared_stacks.pickle"));
  REQUIRE(snap.device_traces.size() == 1);
  const auto& events = snap.device_traces[0];
  REQUIRE(events.size() == 5);
  for (const std::size_t i : {0, 2}) CHECK(events[i].frame->label() == "step (/src/train.py:10)");
  for (const std::size_t i : {1, 3}) CHECK(events[i].frame->label() == "at::_ops::mm::call (??:0)");
  CHECK(events[4].frame->label() == "torch::unwind::unwind() (??:0)");
  pytorch::ReadOptions top;
  top.frame = pytorch::FrameChoice::top;
  const pytorch::Snapshot tops = pytorch::load_snapshot(fixture("snap_shared_stacks.pickle"), top);
  for (const auto& e : tops.device_traces[0]) CHECK(e.frame->label() == "torch::unwind::unwind() (??:0)");
  pytorch::ReadOptions none;
  none.frame = pytorch::FrameChoice::none;
  const pytorch::Snapshot unnamed = pytorch::load_snapshot(fixture("snap_shared_stacks.pickle"), none);
  for (const auto& e : unnamed.device_traces[0]) CHECK_FALSE(e.frame.has_value());
  // A bad frame fails at its first reference, whichever frame the choice reads first.
  for (const pytorch::FrameChoice choice : {pytorch::FrameChoice::first_python, pytorch::FrameChoice::top}) {
    pytorch::ReadOptions options;
    options.frame = choice;
    const auto e = snapshot_error([&] { (void)pytorch::load_snapshot(fixture("snap_shared_bad_frame.pickle"), options); });
    CHECK(e.path() == "device_traces[0][1].frames[0]");
    CHECK(e.reason() == "missing key 'filename'");
  }
}

TEST_CASE("pytorch: pickles that are not snapshots name the bad value's path", "[pytorch]") {
  auto e =
      snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_bad_block_size.pickle")); });
  CHECK(e.path() == "segments[3].blocks[0].size");
  CHECK(e.reason() == "expected int, got str");
  CHECK_THAT(e.what(),
             Catch::EndsWith(
                 "snap_bad_block_size.pickle: segments[3].blocks[0].size: expected int, got str"));
  e = snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_missing_key.pickle")); });
  CHECK(e.path() == "segments[0]");
  CHECK(e.reason() == "missing key 'segment_type'");
  e = snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_bad_pool_int.pickle")); });
  CHECK(e.path() == "segments[0].segment_pool_id");
  CHECK(e.reason() == "expected list or tuple, got int");
  e = snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_bad_pool_three.pickle")); });
  CHECK(e.path() == "segments[1].segment_pool_id");
  CHECK(e.reason() == "a pool id of 3 numbers, expected 2");
  e = snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_root_int.pickle")); });
  CHECK(e.path().empty());
  CHECK(e.reason() == "expected dict (a PyTorch memory snapshot), got int");
  e = snapshot_error([] { (void)pytorch::load_snapshot(fixture("snap_bad_action.pickle")); });
  CHECK(e.path() == "device_traces[0][0].action");
  CHECK(e.reason() == "unknown action 'teleport'");
  e = snapshot_error([] { (void)pytorch::import_snapshot(fixture("snap_inconsistent.pickle")); });
  CHECK(e.path() == "device_traces[0][1]");
  CHECK_THAT(e.reason(), Catch::Contains("segment_alloc at 0x5000"));
  // A pickle that is refused outright keeps its byte offset.
  e = snapshot_error([] { (void)pytorch::import_snapshot(fixture("refused_object_p4.pickle")); });
  CHECK(e.has_offset());
  CHECK_THAT(e.what(), Catch::Contains("STACK_GLOBAL"));
}

// ------------------------------------------------------------------------------------------------
// The real snapshots

namespace {

using Counts = std::map<Op, std::size_t>;

struct SharedTrace {
  const char* file;
  std::vector<Counts> devices;  // expected events per device (seeds included)
};

// Event counts per device: alloc/free/segment/oom counts are those of python3's pickle module
// (Counter(e['action'] for e in device_traces[d])); the seed counts are this importer's, and
// agree with an independent Python prototype of the same rules. opt-1.3b is state-only: its
// single stray free_completed is dropped.
const std::vector<SharedTrace> kShared = {
    {"cs336-2.7b-seq128-fullstep.pickle",
     {{{Op::alloc, 6771},
       {Op::free_requested, 5894},
       {Op::free_completed, 5894},
       {Op::segment_alloc, 783},
       {Op::seed_segment, 227},
       {Op::seed_alloc, 324}}}},
    {"cs336-medium-seq1024-infer.pickle",
     {{{Op::alloc, 1280},
       {Op::free_requested, 1280},
       {Op::free_completed, 1280},
       {Op::seed_segment, 108},
       {Op::seed_alloc, 223}}}},
    {"cs336-medium-seq128-train.pickle",
     {{{Op::alloc, 6526},
       {Op::free_requested, 6305},
       {Op::free_completed, 6305},
       {Op::seed_segment, 377},
       {Op::seed_alloc, 664}}}},
    {"opt-1.3b-inference-state-only.pickle", {{{Op::seed_segment, 266}, {Op::seed_alloc, 715}}}},
    {"qwen3-0.6b-varlen-expandable-3gpu.pickle",
     {{{Op::segment_map, 175},
       {Op::alloc, 2434},
       {Op::free_requested, 1918},
       {Op::free_completed, 1918}},
      {{Op::segment_map, 40},
       {Op::alloc, 199},
       {Op::free_requested, 175},
       {Op::free_completed, 175},
       {Op::segment_unmap, 6},
       {Op::oom, 1}},
      {{Op::segment_map, 78},
       {Op::alloc, 392},
       {Op::free_requested, 206},
       {Op::free_completed, 206}}}},
    {"small-from-empty.pickle",
     {{{Op::segment_alloc, 9},
       {Op::alloc, 36},
       {Op::free_requested, 26},
       {Op::free_completed, 26}}}},
    {"tinyllama-1.1b-lora-8bit.pickle",
     {{{Op::alloc, 3505},
       {Op::free_requested, 3325},
       {Op::free_completed, 3325},
       {Op::segment_alloc, 152},
       {Op::seed_segment, 63},
       {Op::seed_alloc, 622}}}},
};

}  // namespace

TEST_CASE("pytorch: every pickle in shared/traces imports and replays", "[pytorch][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".pickle") continue;
    INFO(entry.path().filename().string());
    const Trace trace = pytorch::import_snapshot(entry.path());
    CHECK_FALSE(trace.events.empty());
    check_consistent(trace);
    ++files;
  }
  CHECK(files >= static_cast<int>(kShared.size()));
}

TEST_CASE("pytorch: every shared trace imports with the expected events", "[pytorch][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  for (const SharedTrace& st : kShared) {
    const fs::path file = dir / st.file;
    DYNAMIC_SECTION(st.file) {
      const auto t0 = std::chrono::steady_clock::now();
      const pytorch::Snapshot snap = pytorch::load_snapshot(file);
      const Trace trace = pytorch::to_trace(snap, file.filename().string());
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      UNSCOPED_INFO(st.file << ": " << trace.events.size() << " events in " << ms << " ms");
      std::vector<Counts> counts(st.devices.size());
      for (const TraceEvent& e : trace.events) {
        REQUIRE(e.device < counts.size());
        ++counts[e.device][e.op];
      }
      for (std::size_t d = 0; d < st.devices.size(); ++d) {
        INFO("device " << d);
        CHECK(counts[d] == st.devices[d]);
      }
      CHECK(trace.info.source == std::string("pytorch-snapshot:") + st.file);
      // Seeds + events replay consistently and end holding exactly the final segments.
      const ReplayResult r = importer_test::replay(trace, true);
      for (const auto& p : r.problems) UNSCOPED_INFO(p);
      CHECK(r.problem_count == 0);
      std::map<std::uint16_t, std::uint64_t> final_bytes;
      for (const auto& s : snap.segments)
        final_bytes[static_cast<std::uint16_t>(s.device)] += s.total_size;
      for (const auto& [device, bytes] : final_bytes) {
        INFO("device " << device);
        CHECK(r.held.at(device) == bytes);
      }
    }
  }
}

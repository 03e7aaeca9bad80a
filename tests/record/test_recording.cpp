// Tests of live recording (tensorpool/record.hpp): a recorded workload replays to the live
// run's figures; a recording cut mid-write, or whose process is killed, reads up to its last
// flushed batch; a full or unwritable target stops the recording with one error while the
// allocator goes on; the RMM-log option round-trips through our RMM reader; TENSORPOOL_TRACE.
#include <catch2/catch.hpp>

#include <signal.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/logging.hpp"
#include "support/deterministic.hpp"
#include "support/fixed_mode.hpp"
#include "support/allocator_workload.hpp"
#include "support/temp_dir.hpp"
#include "tensorpool/record.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/tensorpool.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/rmm_log.hpp"

namespace fs = std::filesystem;
using namespace tensorpool;
using tensorpool::testing::run_workload;
using tensorpool::testing::TempDir;

namespace {

constexpr std::size_t kCapacity = 2 * GiB;

std::shared_ptr<SimulatedDevice> make_device(int ordinal = 0) {
  // Stream work completes at once, as in the replay engine's tensorpool target.
  return std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{
      .name = "sim" + std::to_string(ordinal), .ordinal = ordinal, .capacity = kCapacity,
      .event_mode = EventMode::immediate});
}

struct LiveFigures {
  std::size_t peak_reserved, peak_allocated;
  std::uint64_t allocs, frees, maps, unmaps, ooms;
};

LiveFigures live_figures(const Allocator& alloc, const SimulatedDevice& device) {
  const Stats s = alloc.stats();
  const DeviceCounters c = device.counters();
  return {static_cast<std::size_t>(s.total[Metric::reserved_bytes].peak),
          static_cast<std::size_t>(s.total[Metric::allocated_bytes].peak),
          c.segment_allocs + c.physical_creates, c.segment_frees + c.physical_releases,
          c.maps, c.unmaps, s.ooms};
}

RecordingOptions flushing_every(int ms, std::size_t buffer_events = std::size_t{1} << 16) {
  RecordingOptions o;
  o.flush_interval = std::chrono::milliseconds(ms);
  o.buffer_events = buffer_events;
  return o;
}

/// The replay of a live recording: the same allocator, device capacity and settings, and the
/// failed requests attempted again (their side effects are part of the run).
replay::ReplayReport replay_file(const std::string& path, const std::string& conf) {
  const trace::Trace t = trace::read_trace(path);
  replay::TraceSource source(t);
  replay::ReplayOptions o;
  o.allocator = "tensorpool";
  o.target.capacity = kCapacity;
  o.target.conf = conf;
  o.attempt_ooms = true;
  return replay::replay(source, o);
}

void check_replay_matches(const replay::ReplayResult& r, const LiveFigures& live) {
  CHECK(r.peak_reserved == live.peak_reserved);
  CHECK(r.peak_allocated == live.peak_allocated);
  CHECK(r.upstream.allocs == live.allocs);
  CHECK(r.upstream.frees == live.frees);
  CHECK(r.upstream.maps == live.maps);
  CHECK(r.upstream.unmaps == live.unmaps);
  CHECK(r.ooms == live.ooms);
  CHECK(r.first_oom.has_value() == (r.ooms > 0));  // an attempted failure is an OOM like any other
}

std::vector<trace::TraceEvent> read_events(const std::string& path, trace::ReadOptions options = {}) {
  auto reader = trace::TraceReader::open(path, options);
  std::vector<trace::TraceEvent> out;
  trace::TraceEvent e;
  while (reader->next(e)) out.push_back(e);
  return out;
}

/// Counts the events an allocator reports, to compare with what the recording wrote.
struct Counter : Observer {
  std::vector<AllocatorEvent> events;
  void on_event(const AllocatorEvent& e) noexcept override { events.push_back(e); }
};

/// Captures what the "tensorpool" logger logs at error level.
class ErrorSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> messages;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::err) messages.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

/// Runs `body` in a child process (fresh process-wide state); returns its exit status, or -1
/// if it did not exit normally.
int run_in_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a recorded workload replays to the live run's peaks and upstream counts", "[record]") {
  for (const char* conf : {"", "mode:vmm", "max_split_size:64MiB"}) {
    INFO("conf " << conf);
    TempDir dir("tensorpool_test_record");
    const std::string path = dir.file("live.tptrace");
    auto device = make_device();
    Allocator alloc(device, testing::fixed_mode(testing::deterministic_config(conf)));  // as the "tensorpool" target
    Recording rec = start_recording(alloc, path);
    auto counter = std::make_shared<Counter>();
    alloc.add_observer(counter);
    const std::size_t ooms = run_workload(alloc, *device, 6000);
    CHECK(ooms > 0);
    const LiveFigures live = live_figures(alloc, *device);
    REQUIRE(rec.stop());
    const RecordingStatus st = rec.status();
    CHECK_FALSE(st.active);
    CHECK(st.events_dropped == 0);
    CHECK(st.temp_path.empty());
    // Every observed event is in the file.
    CHECK(st.events_written == counter->events.size());
    CHECK(read_events(path).size() == counter->events.size());
    const trace::Trace t = trace::read_trace(path);
    CHECK(t.info.source == "tensorpool-recording");
    const replay::ReplayReport r = replay_file(path, conf);
    REQUIRE(r.devices.size() == 1);
    check_replay_matches(r.total, live);
  }
}

TEST_CASE("the recorded events are the allocator's, field by field", "[record]") {
  TempDir dir("tensorpool_test_record");
  auto device = make_device();
  Allocator alloc(device, testing::fixed_mode());
  const Stream s = device->create_stream();
  Recording rec = start_recording(alloc, dir.file("t.tptrace"));
  void* p = alloc.allocate(3000, s);
  alloc.record_stream(p, kDefaultStream);
  alloc.deallocate(p);
  void* q = alloc.allocate(512, s);  // collects the deferred free first
  REQUIRE_THROWS_AS(alloc.allocate(3 * GiB), OutOfMemoryError);
  alloc.deallocate(q);
  alloc.empty_cache();  // its segment free, then the call itself
  REQUIRE(rec.stop());
  using trace::Op;
  const auto events = read_events(dir.file("t.tptrace"));
  std::vector<Op> ops;
  for (const auto& e : events) ops.push_back(e.op);
  CHECK(ops == std::vector<Op>{Op::segment_alloc, Op::alloc, Op::record_stream, Op::free_requested,
                               Op::free_completed, Op::alloc, Op::oom, Op::free_requested,
                               Op::free_completed, Op::segment_free, Op::empty_cache});
  REQUIRE(events.size() == 11);
  CHECK(events[0].size == 2 * MiB);
  CHECK(events[1].addr == reinterpret_cast<std::uint64_t>(p));
  CHECK(events[1].size == 3000);
  CHECK(events[1].stream == s);
  CHECK(events[2].addr == reinterpret_cast<std::uint64_t>(p));
  CHECK(events[2].stream == kDefaultStream);
  CHECK(events[4].size == 3000);
  CHECK(events[6].size == 3 * GiB);
  CHECK(events[6].addr == 0);
  CHECK(events[9].addr == events[0].addr);
  CHECK(events[10].addr == 0);
  CHECK(events[10].size == 0);
  for (std::size_t i = 1; i < events.size(); ++i) CHECK(events[i].time_us >= events[i - 1].time_us);
  // Written in the current format version (u32 LE at offset 8), which has the sleep and graph_pool ops.
  const std::string bytes = tensorpool::testing::read_bytes(dir.file("t.tptrace"));
  REQUIRE(bytes.size() > 12);
  CHECK(bytes.substr(8, 4) == std::string("\x03\x00\x00\x00", 4));
  static_assert(trace::kBinaryFormatVersion == 3);
}

TEST_CASE("a live allocator's state becomes seed events, several allocators share a file", "[record]") {
  TempDir dir("tensorpool_test_record");
  const std::string path = dir.file("two.tptrace");
  auto dev0 = make_device(0);
  auto dev1 = make_device(1);
  Allocator a0(dev0, testing::fixed_mode());
  Allocator a1(dev1, testing::fixed_mode());
  void* early = a0.allocate(5 * MiB);  // live before the recording starts
  Recording rec = start_recording(a0, path);
  rec.attach(a1);
  run_workload(a0, *dev0, 2000, 1);
  run_workload(a1, *dev1, 2000, 2);
  a0.deallocate(early);
  const LiveFigures live1 = live_figures(a1, *dev1);
  REQUIRE(rec.stop());
  const auto events = read_events(path);
  REQUIRE(events.size() > 2);
  CHECK(events[0].op == trace::Op::seed_segment);
  CHECK(events[0].device == 0);
  CHECK(events[1].op == trace::Op::seed_alloc);
  CHECK(events[1].addr == reinterpret_cast<std::uint64_t>(early));
  CHECK(events[1].size == 5 * MiB);
  bool saw_device1 = false;
  for (const auto& e : events) saw_device1 = saw_device1 || e.device == 1;
  CHECK(saw_device1);
  const replay::ReplayReport r = replay_file(path, "");
  REQUIRE(r.devices.size() == 2);
  check_replay_matches(r.devices[1], live1);  // device 1 was recorded from its start
}

TEST_CASE("a recording read while it runs gives at least every flushed event", "[record]") {
  TempDir dir("tensorpool_test_record");
  const std::string path = dir.file("running.tptrace");
  auto device = make_device();
  Allocator alloc(device, testing::fixed_mode());
  Recording rec = start_recording(alloc, path, flushing_every(5));
  const std::string partial = rec.status().temp_path;
  CHECK(partial == path + "." + std::to_string(getpid()) + ".partial");
  for (int round = 0; round < 5; ++round) {
    run_workload(alloc, *device, 500, static_cast<std::uint64_t>(round));
    REQUIRE(rec.flush());
    const std::uint64_t flushed = rec.status().events_written;
    run_workload(alloc, *device, 300, static_cast<std::uint64_t>(round) + 100);  // not flushed yet
    // A copy of the file as it is now: cut wherever the writer happens to be.
    const std::string copy = dir.file("copy.tptrace");
    fs::copy_file(partial, copy, fs::copy_options::overwrite_existing);
    auto reader = trace::TraceReader::open(copy, {.allow_truncated = true});
    trace::TraceEvent e;
    std::uint64_t n = 0;
    while (reader->next(e)) ++n;
    REQUIRE(reader->truncation().has_value());
    CHECK(n >= flushed);
    CHECK(reader->truncation()->verified_events >= flushed);
    CHECK_THROWS_AS(trace::read_trace(copy), trace::TraceFormatError);  // strict: incomplete
  }
  REQUIRE(rec.stop());
  CHECK_FALSE(fs::exists(partial));
  CHECK(fs::exists(path));
}

TEST_CASE("a recording process killed with SIGKILL leaves every flushed batch", "[record]") {
  TempDir dir("tensorpool_test_record");
  const std::string path = dir.file("killed.tptrace");
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    auto device = make_device();
    Allocator alloc(device, testing::fixed_mode());
    Recording rec = start_recording(alloc, path, flushing_every(2));
    for (std::uint64_t round = 0;; ++round) {
      run_workload(alloc, *device, 400, round);
      rec.flush();
      const std::uint64_t flushed = rec.status().events_written;
      if (write(fds[1], &flushed, sizeof flushed) != sizeof flushed) _exit(3);
    }
  }
  close(fds[1]);
  std::uint64_t last_reported = 0;
  for (int reports = 0; reports < 8; ++reports) {
    REQUIRE(read(fds[0], &last_reported, sizeof last_reported) == sizeof last_reported);
  }
  kill(child, SIGKILL);  // mid-run: the child keeps allocating and writing until now
  int status = 0;
  waitpid(child, &status, 0);
  close(fds[0]);
  REQUIRE(WIFSIGNALED(status));
  const std::string partial = path + "." + std::to_string(child) + ".partial";
  REQUIRE(fs::exists(partial));
  CHECK_FALSE(fs::exists(path));
  auto reader = trace::TraceReader::open(partial, {.allow_truncated = true});
  trace::TraceEvent e;
  std::uint64_t n = 0;
  while (reader->next(e)) ++n;
  REQUIRE(reader->truncation().has_value());
  INFO(reader->truncation()->problem);
  CHECK(last_reported > 0);
  CHECK(n >= last_reported);
  CHECK(reader->truncation()->verified_events >= last_reported);
  // The strict reader refuses the cut file; salvaged into a complete one, it replays.
  CHECK_THROWS_AS(trace::read_trace(partial), trace::TraceFormatError);
  const std::string salvaged = dir.file("salvaged.tptrace");
  const auto truncation = trace::convert_trace(partial, salvaged, trace::Format::binary, {.allow_truncated = true});
  REQUIRE(truncation.has_value());
  CHECK(truncation->events == n);
  const replay::ReplayReport r = replay_file(salvaged, "");
  CHECK(r.total.events == n);
  CHECK(r.total.allocs > 0);
}

TEST_CASE("an unwritable or full target: an error, and the allocator goes on", "[record]") {
  auto device = make_device();
  Allocator alloc(device, testing::fixed_mode());
  CHECK_THROWS_WITH(start_recording(alloc, "/nonexistent-dir/x.tptrace"),
                    Catch::Contains("/nonexistent-dir/x.tptrace") && Catch::Contains("No such file"));
  CHECK_THROWS_WITH(start_recording(alloc, "/dev/full"), Catch::Contains("No space left"));
  CHECK_THROWS_AS(start_recording(alloc, "/tmp/x.tptrace", flushing_every(0)),
                  ConfigError);
  run_workload(alloc, *device, 200);
  alloc.check_invariants();
}

TEST_CASE("a disk that fills mid-run: one error, the file removed, allocations go on", "[record]") {
  TempDir dir("tensorpool_test_record");
  const std::string path = dir.file("big.tptrace");
  const int code = run_in_child([&] {
    // The file may not grow past 64 KiB: writes then fail with EFBIG, as on a full disk.
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    auto device = make_device();
    Allocator alloc(device, testing::fixed_mode());
    std::atomic<int> errors{0};
    std::string message;
    RecordingOptions options;
    options.flush_interval = std::chrono::milliseconds(2);
    options.on_error = [&](const std::string& m) {
      message = m;
      ++errors;
    };
    Recording rec = start_recording(alloc, path, options);
    for (std::uint64_t round = 0; round < 40; ++round) {
      run_workload(alloc, *device, 1000, round);
      rec.flush();
    }
    alloc.check_invariants();  // the allocator went on
    const RecordingStatus st = rec.status();
    if (errors != 1) return 11;
    if (!st.failed || st.active) return 12;
    if (message.find("File too large") == std::string::npos) return 13;
    if (message.find(path) == std::string::npos) return 14;
    if (rec.stop()) return 15;  // reports the failure
    if (fs::exists(path) || fs::exists(path + "." + std::to_string(getpid()) + ".partial")) return 16;
    if (st.events_dropped == 0) return 17;  // events after the failure are not recorded
    return 0;
  });
  CHECK(code == 0);
}

TEST_CASE("the RMM-log option round-trips through our RMM reader", "[record]") {
  TempDir dir("tensorpool_test_record");
  auto device = make_device();
  Allocator alloc(device, testing::fixed_mode());
  // Two recordings of the same run: the native trace and RMM's log.
  Recording native = start_recording(alloc, dir.file("run.tptrace"));
  Recording rmm = start_recording(alloc, dir.file("run.csv"));
  run_workload(alloc, *device, 3000);
  REQUIRE(native.stop());
  REQUIRE(rmm.stop());
  const auto entries = trace::rmm::load_log(dir.file("run.csv"));
  std::vector<trace::TraceEvent> expected;
  for (const auto& e : read_events(dir.file("run.tptrace"))) {
    if (e.op == trace::Op::alloc || e.op == trace::Op::free_requested || e.op == trace::Op::oom) expected.push_back(e);
  }
  REQUIRE(entries.size() == expected.size());
  const auto tid = entries.front().thread;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    INFO("entry " << i);
    const auto& e = expected[i];
    const auto action = e.op == trace::Op::alloc            ? trace::rmm::Action::allocate
                        : e.op == trace::Op::free_requested ? trace::rmm::Action::free
                                                            : trace::rmm::Action::allocate_failure;
    CHECK(entries[i].action == action);
    CHECK(entries[i].pointer == e.addr);
    CHECK(entries[i].size == e.size);
    CHECK(entries[i].stream == e.stream);
    CHECK(entries[i].thread == tid);  // one thread made every call
  }
  CHECK(tid == static_cast<std::uint64_t>(gettid()));
  // The log imports and replays to the same requested peak as the native trace.
  const trace::Trace from_log = trace::rmm::to_trace(entries, "run.csv");
  replay::TraceSource log_source(from_log);
  const auto from_native = replay_file(dir.file("run.tptrace"), "");
  CHECK(replay::replay(log_source, {}).total.peak_requested == from_native.total.peak_requested);
}

TEST_CASE("a writer that falls behind makes the allocator wait, and loses nothing", "[record]") {
  TempDir dir("tensorpool_test_record");
  auto device = make_device();
  Allocator alloc(device, testing::fixed_mode());
  auto counter = std::make_shared<Counter>();
  alloc.add_observer(counter);
  Recording rec = start_recording(alloc, dir.file("small.tptrace"),
                                  flushing_every(50, 64));
  run_workload(alloc, *device, 20000);
  REQUIRE(rec.stop());
  CHECK(rec.status().events_dropped == 0);
  CHECK(read_events(dir.file("small.tptrace")).size() == counter->events.size());
}

TEST_CASE("TENSORPOOL_TRACE records every attached allocator into one file, or logs once", "[record]") {
  TempDir dir("tensorpool_test_record");
  const auto with_env = [](const std::string& value, const std::function<int(ErrorSink&)>& body) {
    return run_in_child([&] {
      setenv("TENSORPOOL_TRACE", value.c_str(), 1);
      auto sink = std::make_shared<ErrorSink>();
      detail::Logger::spdlog_logger().sinks().push_back(sink);
      return body(*sink);
    });
  };
  const std::string path = dir.file("env-%p.tptrace");
  CHECK(with_env(path, [](ErrorSink& sink) {
          auto d0 = make_device(0);
          auto d1 = make_device(1);
          Allocator a0(d0, testing::fixed_mode());
          Allocator a1(d1, testing::fixed_mode());
          if (!attach_recording_from_env(a0) || !attach_recording_from_env(a1)) return 1;
          run_workload(a0, *d0, 500, 1);
          run_workload(a1, *d1, 500, 2);
          stop_recording_from_env();
          if (attach_recording_from_env(a0)) return 2;  // stopped: not started again
          return sink.messages.empty() ? 0 : 3;
        }) == 0);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir.path())) files.push_back(entry.path());
  REQUIRE(files.size() == 1);  // env-<pid>.tptrace, complete
  const auto events = read_events(files[0].string());
  std::set<std::uint16_t> devices;
  for (const auto& e : events) devices.insert(e.device);
  CHECK(devices == std::set<std::uint16_t>{0, 1});

  for (const std::string& bad : {std::string("/nonexistent-dir/x.tptrace"), std::string("/dev/full")}) {
    INFO(bad);
    CHECK(with_env(bad, [&](ErrorSink& sink) {
            auto d0 = make_device(0);
            auto d1 = make_device(1);
            Allocator a0(d0, testing::fixed_mode());
            Allocator a1(d1, testing::fixed_mode());
            if (attach_recording_from_env(a0) || attach_recording_from_env(a1)) return 1;
            run_workload(a0, *d0, 300);  // allocations go on
            a0.check_invariants();
            if (sink.messages.size() != 1) return 2;  // one error for the process
            if (sink.messages[0].find("TENSORPOOL_TRACE=" + bad) == std::string::npos) return 3;
            return 0;
          }) == 0);
  }
  CHECK(with_env("", [](ErrorSink&) {
          auto d0 = make_device(0);
          Allocator a0(d0, testing::fixed_mode());
          return attach_recording_from_env(a0) ? 1 : 0;
        }) == 0);
}

TEST_CASE("tags, sleep and wake, and graph pools are recorded, and a replay sleeps where the program did",
          "[record][sleep][graphs]") {
  TempDir dir("tensorpool_test_record");
  auto device = make_device();
  Config vmm;
  vmm.mode = Mode::vmm;
  vmm.vmm_planner = PlannerMode::synchronous;
  Allocator alloc(device, vmm);
  const Stream s = device->create_stream();
  const std::string path = dir.file("sleep.tptrace");
  Recording rec = start_recording(alloc, path);
  void* kv = nullptr;
  {
    const Tag tag("rec.kv_cache");
    kv = alloc.allocate(600 * MiB, s);
  }
  void* weights = alloc.allocate(100 * MiB, s);
  alloc.sleep("rec.kv_cache", Contents::keep);
  void* scratch = alloc.allocate(500 * MiB, s);  // the KV cache's memory, used meanwhile
  alloc.deallocate(scratch);
  alloc.empty_cache();
  alloc.wake("rec.kv_cache");
  const GraphPool pool = alloc.begin_capture(s, 8 * MiB);
  void* captured = alloc.allocate(MiB, s);
  alloc.deallocate(captured);
  alloc.end_capture(s);
  alloc.release_graph(pool);
  alloc.deallocate(kv);
  alloc.deallocate(weights);
  REQUIRE(rec.stop());

  const trace::Trace t = trace::read_trace(path);
  using trace::Op;
  const auto find = [&](Op op, std::uint8_t flags) {
    return std::find_if(t.events.begin(), t.events.end(),
                        [&](const trace::TraceEvent& e) { return e.op == op && e.flags == flags; });
  };
  const auto tagged = find(Op::alloc, trace::kFlagTagged);
  REQUIRE(tagged != t.events.end());
  CHECK(tagged->size == 600 * MiB);
  CHECK(t.labels[tagged->label] == "rec.kv_cache");
  const auto slept = find(Op::sleep, trace::kFlagKeepContents);
  REQUIRE(slept != t.events.end());
  CHECK(t.labels[slept->label] == "rec.kv_cache");
  CHECK(slept->size >= 600 * MiB);  // what it released
  const auto woke = find(Op::sleep, trace::kFlagWake);
  REQUIRE(woke != t.events.end());
  CHECK(woke->size >= 600 * MiB);
  const auto begin = find(Op::graph_pool, trace::kGraphCaptureBegin);
  const auto end = find(Op::graph_pool, trace::kGraphCaptureEnd);
  const auto release = find(Op::graph_pool, trace::kGraphRelease);
  REQUIRE(begin != t.events.end());
  REQUIRE(end != t.events.end());
  REQUIRE(release != t.events.end());
  CHECK(begin->addr == pool.id);
  CHECK(begin->size == 8 * MiB);
  CHECK(begin->stream == s);
  CHECK(end->addr == pool.id);
  CHECK(release->addr == pool.id);
  CHECK((begin < end && end < release));
  // The pool is one block of its reserve, under the graph pools' tag; its blocks are no events.
  CHECK(std::count_if(t.events.begin(), t.events.end(), [&](const trace::TraceEvent& e) {
          return e.op == Op::alloc && (e.flags & trace::kFlagTagged) && t.labels[e.label] == "tensorpool:graphs";
        }) == 1);
  CHECK(std::none_of(t.events.begin(), t.events.end(), [&](const trace::TraceEvent& e) {
    return e.op == Op::alloc && e.addr == reinterpret_cast<std::uint64_t>(captured) && e.size == MiB;
  }));

  // Replayed: tensorpool-vmm sleeps where the program did and needs less than what stays awake
  // plus the KV cache plus the scratch; the pytorch model holds the KV cache through the sleep.
  const auto replayed = [&](const char* allocator) {
    replay::TraceSource source(t);
    replay::ReplayOptions o;
    o.allocator = allocator;
    o.target.capacity = kCapacity;
    return replay::replay(source, o).total;
  };
  const replay::ReplayResult vmm_result = replayed("tensorpool-vmm");
  const replay::ReplayResult pytorch = replayed("pytorch");
  CHECK(vmm_result.ooms == 0);
  CHECK(vmm_result.peak_reserved < 1200 * MiB);
  CHECK(pytorch.peak_reserved >= 1200 * MiB);
  CHECK(vmm_result.peak_reserved + 400 * MiB <= pytorch.peak_reserved);
}

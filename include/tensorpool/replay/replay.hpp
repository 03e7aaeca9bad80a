// tensorpool/replay/replay.hpp: drives an allocator under test through a trace and measures it.
//
// The engine reads events from an EventSource (an in-memory trace, or any source that can
// rewind), keeps one target per device, maps the trace's addresses to live pointers, honours
// streams (record_stream, stream syncs), and measures over the window:
//   peak requested     max over time of the bytes the trace's live blocks asked for;
//   peak allocated     max of the target's live bytes after its rounding;
//   peak reserved      max of the bytes the target held from its device;
//   utilization        peak requested / peak reserved (reserved_at_requested_peak is also given);
//   waste              peak reserved - peak requested;
//   upstream calls     device calls made after the seed events (the window's own cost), and
//                      those made for the seed events (building the window's start state);
//   OOMs               allocations the target refused on a device of the given capacity (and
//                      seed segments a target that adopts them had no room for);
//   host ns per op     wall time of the replay loop / (allocations + frees).
// baseline() reads the same numbers for the recording allocator from the trace's own segment
// events (PyTorch's actual behaviour), without replaying anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/replay/observer.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::replay {

/// Where the engine reads events from; a source can be replayed more than once after rewind().
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual bool next(trace::TraceEvent& out) = 0;
  virtual void rewind() = 0;
  /// The text of label `id` of the events read so far ("" when unknown): a tagged allocation's
  /// tag, a sleep's tag.
  virtual std::string_view label(std::uint32_t id) const {
    (void)id;
    return {};
  }
};

/// Events of an in-memory trace.
class TraceSource final : public EventSource {
 public:
  explicit TraceSource(const trace::Trace& trace) : trace_(trace) {}
  bool next(trace::TraceEvent& out) override {
    if (index_ >= trace_.events.size()) return false;
    out = trace_.events[index_++];
    return true;
  }
  void rewind() override { index_ = 0; }
  std::string_view label(std::uint32_t id) const override {
    return id < trace_.labels.size() ? std::string_view(trace_.labels[id]) : std::string_view();
  }

 private:
  const trace::Trace& trace_;
  std::size_t index_ = 0;
};

/// What a replay does after the measured pass's first refused allocation.
enum class OnOom {
  /// Presents the rest of the trace: every later request too (ReplayResult::ooms counts them).
  go_on,
  /// Ends the replay there (ReplayResult::stopped_at_first_oom). A search that asks only whether
  /// a trace fits needs nothing after the first OOM, and a replay that goes on presents every
  /// later request to an allocator that is out of memory: each fails through its whole
  /// out-of-memory path (fit and plan: thousands of such requests per candidate that does not
  /// fit). Warmup passes always go on: only the measured pass's OOMs count.
  stop,
};

struct ReplayOptions {
  std::string allocator = "tensorpool";
  /// When set, builds each device's target instead of make_target(allocator): a target outside
  /// the registry (e.g. the real CUB allocator over a CUDA runtime, cuda/replay/).
  std::function<std::unique_ptr<ReplayTarget>(const TargetOptions&)> make_target;
  TargetOptions target;  // capacity and target-specific conf
  int device = -1;       // replay only this device of the trace; -1: every device
  /// Replays the window this many times before the measured pass, as if the program had run it
  /// before (steady state). Each pass starts from the window's starting state: every block live
  /// when a pass ends is freed (the program frees those the window allocated later on; the seed
  /// blocks, live at the window's start, stand for them in the next pass, which allocates them
  /// again), seed segments are adopted only once, and the target and its cache carry over. Only
  /// the last pass is measured, and it asks for what the first asked for.
  int warmup = 0;
  /// Presents the requests that failed in the recording run (oom events) to the target too, as
  /// allocations expected to fail: a failed attempt has effects (the target releases cached
  /// memory before it gives up), which a replay must repeat to follow a live recording of the
  /// same allocator exactly. A request the target can serve is freed at once (the program did
  /// not get the memory); one it refuses is an OOM like any other (ooms, first_oom). Off: oom
  /// events are only read.
  bool attempt_ooms = false;
  /// Calls the target's step() at each `iteration` event of the trace, as a program that calls
  /// tensorpool.step() at the start of each step would (tensorpool targets; a no-op for the
  /// others). Off: iteration markers are only counted.
  bool step_at_iterations = false;
  /// What the measured pass does after its first OOM: go on (the default: `replay`, `compare`
  /// count every refused request) or stop there (fit's and plan's searches).
  OnOom on_oom = OnOom::go_on;
  /// Records every target's events for a snapshot export (ReplayReport::memory). Throws
  /// UsageError for a target that cannot export: before replaying anything for a registered
  /// one, when the first device's target is built for one from make_target.
  bool record_history = false;
  /// Watches the measured pass (observer.hpp); not owned, null: none. Zero cost when null but
  /// one branch per event.
  ReplayObserver* observer = nullptr;
  /// Called with the number of events read so far (every pass, every device) after each
  /// `progress_every` events, and once at the end; for progress bars. Empty: never.
  std::function<void(std::uint64_t events_read)> progress;
  std::uint64_t progress_every = 1U << 15;
};

/// The first allocation a target refused in the measured pass: where in the trace, and the
/// target's own account of its memory at that moment (request, reserved, allocated, device free,
/// largest free block, free cached bytes per stream, in the trace's stream ids).
struct OomReport {
  int device = 0;
  std::uint64_t event = 0;   // 0-based index of the refused alloc among the device's events
                             // of the measured pass
  std::int64_t time_us = 0;  // the event's trace time
  std::uint64_t addr = 0;    // the trace's address of the refused block
  std::uint32_t label = 0;   // the trace's label of the allocation (index into Trace::labels)
  OutOfMemoryInfo info;
};

/// One iteration of the measured pass: from an `iteration` marker of the trace to the next, or to
/// the pass's end (what comes before the first marker is in none).
struct IterationResult {
  UpstreamCounts upstream;         // the calls made during the iteration
  std::size_t peak_requested = 0;  // the most bytes live at once in it (requested sizes)
  std::size_t peak_reserved = 0;   // the most device memory the allocator held at once in it
};

struct ReplayResult {
  std::string allocator;
  int device = -1;  // -1: the sum over devices (peaks are per-device peaks added up)
  std::uint64_t events = 0;
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t unmatched_frees = 0;  // frees of addresses the trace never allocated
  std::uint64_t ooms = 0;
  std::size_t peak_requested = 0;
  std::size_t peak_allocated = 0;
  std::size_t peak_reserved = 0;
  std::size_t reserved_at_requested_peak = 0;
  std::size_t final_reserved = 0;
  double utilization = 0.0;  // peak_requested / peak_reserved
  std::size_t waste = 0;     // peak_reserved - peak_requested
  UpstreamCounts upstream;   // during the window (after the seed events)
  /// Calls made to build the window's start state (the seed events; first pass only). For the
  /// PyTorch models and the recorded baseline: one allocation per adopted segment, a lower bound
  /// on what the recording allocator paid before the window. seeding + upstream compares
  /// allocators that start from different states on the same footing.
  UpstreamCounts seeding;
  /// Upstream calls after the first iteration (from the second `iteration` marker on);
  /// iterations < 2 means the trace has no such markers and these are not meaningful.
  std::uint64_t iterations = 0;
  UpstreamCounts upstream_after_first_iteration;
  /// Per iteration of the measured pass, in order (empty: the trace has no `iteration` markers).
  /// A steady state shows in it as iterations that make no call and hold what the first needed.
  std::vector<IterationResult> per_iteration;
  double host_ns_per_op = 0.0;
  /// Set when ooms > 0. In a sum over devices: the earliest in trace time (ties: lowest device).
  std::optional<OomReport> first_oom;
  /// OnOom::stop ended the measured pass at its first OOM (ooms is then 1): the other figures
  /// cover the events before it only, and a device whose events came later has none.
  bool stopped_at_first_oom = false;

  /// Adds one device's figures to this sum over devices (counts and peaks add up: the devices
  /// are separate memories; iterations is the largest; host_ns_per_op is the caller's). Call
  /// finish() after the last. A field added above must be added there too (replay.cpp).
  void add_device(const ReplayResult& d);
  /// utilization and waste from the peaks.
  void finish() noexcept;
};

struct ReplayReport {
  std::vector<ReplayResult> devices;  // one per replayed device, in device order
  ReplayResult total;                 // sums (device = -1)
  /// With ReplayOptions::record_history: each device's final memory and recorded events, and the
  /// target's settings, for trace::pytorch::snapshot_pickle().
  std::vector<trace::pytorch::DeviceMemory> memory;
  std::string settings;
};

/// Replays `source` against a fresh target per device. Throws what make_target throws.
ReplayReport replay(EventSource& source, const ReplayOptions& options);

/// The recording allocator's own figures, from seed_segment and segment_* events. present is
/// false when the trace carries none (e.g. an RMM log or a generated trace).
struct Baseline {
  bool present = false;
  ReplayResult result;  // allocator "<source>-actual"; upstream.allocs = segment allocs + maps
};
struct BaselineReport {
  std::vector<Baseline> devices;
  Baseline total;
};
BaselineReport baseline(EventSource& source, const std::string& name = "pytorch-actual",
                        int device = -1);

}  // namespace tensorpool::replay

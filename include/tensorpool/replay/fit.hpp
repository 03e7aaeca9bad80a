// tensorpool/replay/fit.hpp: does it fit? The smallest device capacity at which a trace replays
// without an out-of-memory error, per allocator and per device, and the largest member of a
// family of traces (a micro-batch size, ...) that replays without one on a given capacity.
//
// Both searches are bisections, and a bisection assumes monotony: a replay that runs out of memory
// at capacity C runs out at every smaller one. That holds for an allocator whose decisions do not
// depend on the capacity until it is reached; it can fail for one that caches more, or grows
// differently, on a larger device (a replay that OOMs at C may succeed a little below C). fit()
// therefore checks its answer: the replay at the answer has no OOM (it is the smallest capacity
// seen without one), and a replay at 99% of it must have one; when that replay has none, the
// search was misled, `monotone` is set to false and the search starts again below (the answer is
// then a capacity without an OOM whose 99% has one, not necessarily the smallest). The same
// assumption for trace families: a larger member never needs less memory (largest_fitting()
// reports the replay of the next member, which has an OOM when the answer is right).
//
// Replays run in parallel on up to `threads` threads: one task per (allocator, device) for fit(),
// one per allocator for largest_fitting(), whose traces are built once per member and shared.
// A replay that runs out of memory ends at its first OOM (OnOom::stop): the answer needs no more,
// and the requests after it would each fail through the allocator's whole out-of-memory path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorpool/cost_model.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/event.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay {

/// An allocator to search with: what ReplayOptions gives replay() but the capacity and device,
/// which the search sets (the CLI builds it from the same options as replay and compare).
struct FitTarget {
  FitTarget() = default;
  FitTarget(std::string name, std::string settings = {}, std::shared_ptr<const CostModel> costs = nullptr)
      : allocator(std::move(name)), conf(std::move(settings)), cost_model(std::move(costs)) {}

  std::string allocator;
  std::string conf;                             // settings its descriptor takes
  std::shared_ptr<const CostModel> cost_model;  // of the simulated device; null: flat default
  /// ReplayOptions::step_at_iterations: every replay of the search calls the target's step() at
  /// the trace's iteration markers, as the program would (tensorpool targets; no-op for others).
  bool step_at_iterations = false;
  std::size_t device_lag = 0;  // TargetOptions::device_lag (tensorpool targets)
};

/// `targets` with the confs replay::share_conf() gave them (confs may be shorter: "" for the rest).
std::vector<FitTarget> fit_targets(const std::vector<std::string>& allocators,
                                   const std::vector<std::string>& confs);

struct FitOptions {
  std::vector<FitTarget> targets;
  int device = -1;  // search only this device of the trace; -1: every device, each on its own
  int warmup = 0;   // passes over the trace before the measured one (ReplayOptions::warmup)
  /// The bisection stops when the smallest capacity without an OOM and the largest with one are
  /// at most max(relative_tolerance * that capacity, absolute_tolerance, 1 byte) apart (the
  /// precision: `tensorpool fit --precision-pct 0.1 --precision-bytes 0` for 0.1%). The check
  /// of the answer stays at 99% of it whatever the precision.
  double relative_tolerance = 0.005;
  std::size_t absolute_tolerance = 2 * MiB;
  /// The search gives up (fits = false) when a capacity of max_ratio x the peak requested still
  /// has an OOM.
  double max_ratio = 64.0;
  unsigned threads = 0;  // 0: std::thread::hardware_concurrency()
  /// Called after each replay of the search (for progress bars), from the thread that ran it:
  /// from several threads at once when threads > 1, so it must be thread-safe. Empty: never.
  std::function<void()> on_replay;
};

/// The search for one allocator on one device of the trace.
struct DeviceFit {
  std::string allocator;
  int device = 0;
  std::size_t peak_requested = 0;  // the floor: no allocator replays the trace on less
  bool fits = false;               // false: an OOM even at max_ratio x the peak requested
  std::size_t capacity = 0;        // the smallest capacity replayed without an OOM
  double ratio = 0.0;              // capacity / peak_requested
  ReplayResult at_capacity;        // the replay at `capacity`
  /// The replay at the largest capacity below `capacity` that had an OOM (its first_oom explains
  /// it; like every replay of the search that runs out, it stopped there: OnOom::stop); absent
  /// only when the trace has no allocation.
  std::optional<ReplayResult> below;
  std::size_t below_capacity = 0;
  /// Non-empty when the target could not even be built on a device of below_capacity (its
  /// ConfigError: settings sized above that device, e.g. an rmm-arena arena_size; counted as not
  /// fitting there, and `below` then has no first_oom).
  std::string below_refused;
  /// The replay at 99% of `capacity` had an OOM (the answer is not an artefact of the bisection).
  bool verified = false;
  /// False when a capacity below one with an OOM replayed without one (the search restarted);
  /// oom_above is then the largest capacity above the answer that had an OOM (0: none seen). A
  /// device of that size does not run the trace although a smaller one does.
  bool monotone = true;
  std::size_t oom_above = 0;
  int replays = 0;
};

struct FitResult {
  std::string allocator;
  std::vector<DeviceFit> devices;  // in device order
  bool fits = false;               // every device fits
  std::size_t capacity = 0;        // the largest of the devices' capacities: a device of this
                                   // size fits every device of the trace
};

/// One FitResult per target, in the order of options.targets. A capacity the target's settings
/// do not fit (a ConfigError when it is built there) counts as one that does not fit; other
/// errors are thrown as replay() throws them (UsageError for an unknown allocator).
std::vector<FitResult> fit(const trace::Trace& trace, const FitOptions& options);

/// The capacity search behind fit(), over any replay: `replay_at_capacity(c)` replays at capacity
/// c; `floor` is the peak requested (capacities below it are known to fail and not replayed).
/// Sets every field of the result but allocator and device.
DeviceFit search_capacity(const std::function<ReplayResult(std::size_t capacity)>& replay_at_capacity,
                          std::size_t floor, const FitOptions& options);

/// The replay of `trace` against `target` on devices of `capacity` bytes. fit() and
/// largest_fitting() replay with OnOom::stop: whether a replay fits is known at its first OOM.
ReplayReport replay_at(const trace::Trace& trace, const FitTarget& target, std::size_t capacity,
                       int device = -1, int warmup = 0, OnOom on_oom = OnOom::go_on);

/// Builds the member of a trace family for a value (a micro-batch size, ...). Called at most once
/// per value, possibly from several threads at once (for different values).
using TraceFamily = std::function<std::shared_ptr<const trace::Trace>(std::uint64_t value)>;

/// For one target: the largest member of the family that replays without an OOM.
struct LargestFit {
  std::string allocator;
  std::optional<std::size_t> index;  // into the candidates; nullopt: not even the first fits
  std::optional<ReplayReport> at_best;  // the replay of candidates[*index]
  /// The replay of the candidate after the answer (index + 1, or 0 when none fits), which had an
  /// OOM and stopped there (OnOom::stop); absent when the answer is the last candidate.
  std::optional<ReplayReport> at_next;
  std::shared_ptr<const trace::Trace> next_trace;  // the member at_next replayed (its labels)
  int replays = 0;
};

/// Bisection over `candidates` (ascending) for each target: a member fits when its replay on
/// devices of `capacity` bytes has no OOM on any device. One result per target, in order.
/// `on_replay` as FitOptions::on_replay.
std::vector<LargestFit> largest_fitting(const std::vector<std::uint64_t>& candidates,
                                        const TraceFamily& family,
                                        const std::vector<FitTarget>& targets,
                                        std::size_t capacity, unsigned threads = 0,
                                        const std::function<void()>& on_replay = {});

/// Runs task(i) for every i in [0, n) on up to `threads` threads (0: hardware concurrency);
/// rethrows the first exception a task threw, after every thread has finished.
void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t)>& task);

}  // namespace tensorpool::replay

// progress.hpp: a progress bar on stderr for long work (report, and replay or compare of large
// traces): the step being done, a bar, the percentage and an estimate of the time left, redrawn
// in place at most ten times a second. It draws only when stderr is a terminal, and never with
// --quiet or --json (wanted()); otherwise every call is a no-op, so piped output stays clean.
// Thread-safe: work may be counted from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace tensorpool::cli {

/// Replays of at least this many events in all (events x passes x allocators) get a bar in
/// replay, compare, export and demo (report always has one).
inline constexpr std::uint64_t kProgressFromEvents = 1'000'000;

class Progress {
 public:
  /// Whether a bar should be drawn: stderr is a terminal, and neither --quiet nor --json.
  static bool wanted(bool quiet, bool json);

  /// A bar over `total` units of work (events replayed, ...); draws nothing unless `enabled`.
  Progress(bool enabled, std::uint64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const noexcept { return enabled_; }
  /// Names the step now under way ("replay pytorch (2/8)"); draws at once.
  void step(const std::string& name);
  /// Adds `units` of work done.
  void add(std::uint64_t units);
  /// Ends the bar: 100%, the time it took, a newline. Called by the destructor if not before.
  void finish();
  /// A callback for replay::ReplayOptions::progress (a running count of the events one replay
  /// has read): adds what was read since its last call. Empty when the bar is not drawn.
  std::function<void(std::uint64_t)> replay_counter();

 private:
  void draw(bool force);  // with mutex_ held

  const bool enabled_;
  const std::uint64_t total_;
  std::mutex mutex_;
  std::uint64_t done_ = 0;
  std::string step_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace tensorpool::cli

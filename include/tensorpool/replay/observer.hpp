// tensorpool/replay/observer.hpp: watching a replay while it runs (ReplayOptions::observer):
// after every event of the measured pass, the engine's measurements at that moment, and a view of
// the target from which the observer may take its memory map; at the first refused allocation,
// the OOM report with the same view. What `tensorpool report` builds its time series and block
// maps from (timeline.hpp).
//
// Cost: with no observer the engine pays one predictable branch per event (docs/benchmarks.md
// has the instruction counts before and after). An observer is called on the replay's thread, in
// event order, never during a warm-up pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "tensorpool/replay/memory_map.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::replay {

class ReplayTarget;
struct OomReport;

/// The engine's figures right after one event of the measured pass has been applied.
struct ReplayPoint {
  int device = 0;
  std::uint64_t event = 0;          // 0-based index among the device's events of the pass
  const trace::TraceEvent* trace_event = nullptr;  // the event (valid during the call only)
  std::size_t requested = 0;        // live bytes the trace asked for
  std::size_t allocated = 0;        // target's live bytes after its rounding
  std::size_t reserved = 0;         // target's bytes held from its device
};

/// What an observer may look at during a call; valid during that call only.
class ReplayView {
 public:
  virtual const ReplayTarget& target() const = 0;
  /// The target's memory map (nullopt for a target without one), each block holding a live
  /// allocation carrying the trace's request and label. Linear in the target's blocks.
  virtual std::optional<MemoryMap> memory_map() const = 0;

 protected:
  ~ReplayView() = default;
};

class ReplayObserver {
 public:
  virtual ~ReplayObserver() = default;
  /// After each event of the device's measured pass (seed events included).
  virtual void after_event(const ReplayPoint& point, const ReplayView& view) = 0;
  /// Right after the measured pass's first refused allocation on `oom.device` (before its
  /// after_event call).
  virtual void on_first_oom(const OomReport& /*oom*/, const ReplayView& /*view*/) {}
};

}  // namespace tensorpool::replay

// tensorpool/replay/timeline.hpp: observers of a replay (observer.hpp) that keep what a picture
// of it needs, in bounded memory whatever the trace's length:
//  - TimelineRecorder: the memory of one device over time, downsampled to a fixed number of
//    buckets (one per pixel column of a chart): the min and max of requested, allocated, reserved
//    and reserved - allocated per bucket, so peaks survive; the largest free block sampled once
//    per bucket (a map has to be built for it); the iteration markers; the moment of peak
//    reserved; the first OOM and the memory map at that moment.
//  - MapCapture: the memory map right after one given event (the moment of peak reserved found
//    by a first replay: replays are deterministic, so a second one reaches the same state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tensorpool/replay/memory_map.hpp"
#include "tensorpool/replay/observer.hpp"
#include "tensorpool/replay/replay.hpp"

namespace tensorpool::replay {

/// Per bucket, the least and the most of a quantity over the bucket's events.
struct Band {
  std::vector<std::size_t> min;
  std::vector<std::size_t> max;
};

struct Timeline {
  int device = 0;
  std::uint64_t events = 0;  // events observed
  /// Bucket b covers the events [first_event[b], first_event[b + 1]) (the last one: to `events`);
  /// buckets no event reached are dropped, so every bucket holds at least one event.
  std::vector<std::uint64_t> first_event;
  std::vector<std::int64_t> time_us;  // trace time of each bucket's first event
  Band requested;
  Band allocated;
  Band reserved;
  Band unallocated;  // reserved - allocated: cached memory no live block uses
  /// The largest free block right after each bucket's first event; empty when the target keeps
  /// no memory map (ReplayTarget::memory_map()).
  std::vector<std::size_t> largest_free;
  std::vector<std::uint64_t> iterations;  // event index of each `iteration` marker
  /// The moment of peak reserved: of the events after which reserved was at its peak, the one
  /// with the most allocated bytes (the first such) -- for a target that holds a fixed amount
  /// from the start (RMM's arena) that is its fullest moment, not its first event.
  std::uint64_t peak_event = 0;
  std::int64_t peak_time_us = 0;
  std::size_t peak_reserved = 0;
  std::size_t allocated_at_peak = 0;
};

class TimelineRecorder final : public ReplayObserver {
 public:
  /// Observes `device` (events of other devices are ignored), expecting about `expected_events`
  /// events in the measured pass (events beyond fall into the last bucket), in at most
  /// `buckets` buckets (at least 1).
  TimelineRecorder(int device, std::uint64_t expected_events, std::size_t buckets);

  void after_event(const ReplayPoint& point, const ReplayView& view) override;
  void on_first_oom(const OomReport& oom, const ReplayView& view) override;

  const Timeline& timeline() const noexcept { return timeline_; }
  /// The first OOM on the device and the memory map at that moment (nullopt: none, or no map).
  const std::optional<OomReport>& first_oom() const noexcept { return oom_; }
  const std::optional<MemoryMap>& oom_map() const noexcept { return oom_map_; }

 private:
  void open_bucket(const ReplayPoint& point, const ReplayView& view);

  int device_;
  std::uint64_t expected_;
  std::size_t buckets_;
  std::size_t bucket_ = 0;  // index of the open bucket + 1 (0: none open yet)
  bool has_map_ = true;     // false once the target was seen to keep no map
  Timeline timeline_;
  std::optional<OomReport> oom_;
  std::optional<MemoryMap> oom_map_;
};

class MapCapture final : public ReplayObserver {
 public:
  MapCapture(int device, std::uint64_t event) : device_(device), event_(event) {}
  void after_event(const ReplayPoint& point, const ReplayView& view) override;
  /// The map right after the event (nullopt: not reached yet, or the target keeps none).
  const std::optional<MemoryMap>& map() const noexcept { return map_; }

 private:
  int device_;
  std::uint64_t event_;
  std::optional<MemoryMap> map_;
};

}  // namespace tensorpool::replay

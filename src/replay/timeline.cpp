// timeline.cpp: the downsampling timeline of a replay and the map capture (timeline.hpp).
#include "tensorpool/replay/timeline.hpp"

#include <algorithm>

namespace tensorpool::replay {

namespace {

void open(Band& band, std::size_t value) {
  band.min.push_back(value);
  band.max.push_back(value);
}

void widen(Band& band, std::size_t value) {
  band.min.back() = std::min(band.min.back(), value);
  band.max.back() = std::max(band.max.back(), value);
}

}  // namespace

TimelineRecorder::TimelineRecorder(int device, std::uint64_t expected_events, std::size_t buckets)
    : device_(device), expected_(std::max<std::uint64_t>(expected_events, 1)),
      buckets_(std::max<std::size_t>(buckets, 1)) {
  timeline_.device = device;
}

void TimelineRecorder::after_event(const ReplayPoint& p, const ReplayView& view) {
  if (p.device != device_) return;
  Timeline& t = timeline_;
  ++t.events;
  const std::size_t unallocated = p.reserved > p.allocated ? p.reserved - p.allocated : 0;
  const auto bucket = static_cast<std::size_t>(
      std::min<std::uint64_t>(p.event, expected_ - 1) * buckets_ / expected_);
  if (bucket + 1 != bucket_) {  // events come in order: a later bucket
    bucket_ = bucket + 1;
    open_bucket(p, view);
  } else {
    widen(t.requested, p.requested);
    widen(t.allocated, p.allocated);
    widen(t.reserved, p.reserved);
    widen(t.unallocated, unallocated);
  }
  if (p.trace_event->op == trace::Op::iteration) t.iterations.push_back(p.event);
  if (p.reserved > t.peak_reserved || (p.reserved == t.peak_reserved && p.allocated > t.allocated_at_peak) ||
      t.events == 1) {
    t.peak_reserved = p.reserved;
    t.allocated_at_peak = p.allocated;
    t.peak_event = p.event;
    t.peak_time_us = p.trace_event->time_us;
  }
}

void TimelineRecorder::open_bucket(const ReplayPoint& p, const ReplayView& view) {
  Timeline& t = timeline_;
  t.first_event.push_back(p.event);
  t.time_us.push_back(p.trace_event->time_us);
  open(t.requested, p.requested);
  open(t.allocated, p.allocated);
  open(t.reserved, p.reserved);
  open(t.unallocated, p.reserved > p.allocated ? p.reserved - p.allocated : 0);
  if (!has_map_) return;
  const std::optional<MemoryMap> map = view.target().memory_map();  // labels not needed here
  if (!map) {
    has_map_ = false;
    t.largest_free.clear();
    return;
  }
  t.largest_free.push_back(map->largest_free_block());
}

void TimelineRecorder::on_first_oom(const OomReport& oom, const ReplayView& view) {
  if (oom.device != device_) return;
  oom_ = oom;
  oom_map_ = view.memory_map();
}

void MapCapture::after_event(const ReplayPoint& p, const ReplayView& view) {
  if (p.device == device_ && p.event == event_) map_ = view.memory_map();
}

}  // namespace tensorpool::replay

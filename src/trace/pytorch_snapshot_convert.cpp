// pytorch_snapshot_convert.cpp: converts a read snapshot (tensorpool/trace/pytorch_snapshot.hpp)
// to a tensorpool trace, with seed events for the state at the window's start. The rules are
// documented in the header; reading the pickle is pytorch_snapshot_reader.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <unordered_set>
#include <utility>

#include "tensorpool/trace/empty_cache.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

namespace tensorpool::trace::pytorch {

namespace {

constexpr std::uint64_t kMiB = 1024 * 1024;
constexpr std::uint64_t kSmallSegmentSize = 2 * kMiB;  // PyTorch's kSmallBuffer
constexpr std::uint64_t kLargeGranule = 20 * kMiB;     // PyTorch's kLargeBuffer

}  // namespace

bool is_state_only(const std::vector<TraceEntry>& device_trace) noexcept {
  return std::none_of(device_trace.begin(), device_trace.end(), [](const TraceEntry& e) {
    return e.action != Action::free_completed && e.action != Action::snapshot &&
           e.action != Action::oom;
  });
}

// ---------------------------------------------------------------------------------------------
// Conversion

namespace {

// Sizes of segments that are gone at the window's end tell their pool (see the header).
bool infer_small(std::uint64_t size, bool expandable) {
  return expandable ? size % kLargeGranule != 0 : size == kSmallSegmentSize;
}

struct Range {
  std::uint64_t end = 0;
  std::uint64_t stream = 0;
  bool small = false;
};

// Disjoint [start, end) ranges keyed by start: the mapped pages of expandable segments.
class RangeSet {
 public:
  /// False when [a, b) overlaps a range already present.
  bool add(std::uint64_t a, std::uint64_t b, std::uint64_t stream, bool small) {
    if (b < a) return false;  // wrapped around: not a range
    if (a == b) return true;
    auto it = ranges_.lower_bound(a);
    if (it != ranges_.end() && it->first < b) return false;
    if (it != ranges_.begin() && std::prev(it)->second.end > a) return false;
    ranges_.emplace(a, Range{b, stream, small});
    return true;
  }

  /// Removes [a, b); false (and no change) unless it is covered entirely.
  bool remove(std::uint64_t a, std::uint64_t b) {
    if (b < a) return false;
    if (a == b) return true;
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return false;
    --it;
    auto first = it;
    for (std::uint64_t covered = a; covered < b; ++it) {
      if (it == ranges_.end() || it->first > covered || it->second.end <= covered) return false;
      covered = it->second.end;
    }
    const auto last = std::prev(it);
    const std::pair<std::uint64_t, Range> head{first->first, first->second};
    const Range tail = last->second;
    ranges_.erase(first, it);
    if (head.first < a)
      ranges_.emplace(head.first, Range{a, head.second.stream, head.second.small});
    if (tail.end > b) ranges_.emplace(b, Range{tail.end, tail.stream, tail.small});
    return true;
  }

  /// Calls f(start, end, stream, small) for each maximal run of touching ranges that agree on
  /// stream and pool.
  template <typename F>
  void for_each_merged(F&& f) const {
    auto it = ranges_.begin();
    while (it != ranges_.end()) {
      const std::uint64_t start = it->first;
      Range run = it->second;
      for (++it; it != ranges_.end() && it->first == run.end && it->second.stream == run.stream &&
                 it->second.small == run.small;
           ++it) {
        run.end = it->second.end;
      }
      f(start, run.end, run.stream, run.small);
    }
  }

 private:
  std::map<std::uint64_t, Range> ranges_;
};

struct SegmentSeed {
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  bool small = false;
};

Op op_of(Action action) {
  switch (action) {
    case Action::alloc: return Op::alloc;
    case Action::free_requested: return Op::free_requested;
    case Action::free_completed: return Op::free_completed;
    case Action::segment_alloc: return Op::segment_alloc;
    case Action::segment_free: return Op::segment_free;
    case Action::segment_map: return Op::segment_map;
    case Action::segment_unmap: return Op::segment_unmap;
    case Action::oom: return Op::oom;
    case Action::snapshot: break;
  }
  return Op::oom;  // unreachable: snapshot markers are skipped before
}

bool is_block_action(Action a) {
  return a == Action::alloc || a == Action::free_requested || a == Action::free_completed;
}

bool is_segment_action(Action a) {
  return a == Action::segment_alloc || a == Action::segment_free || a == Action::segment_map ||
         a == Action::segment_unmap;
}

// Converts one device: its seeds, then (in a second call, after every device's seeds) its events.
class DeviceConverter {
 public:
  DeviceConverter(const Snapshot& snapshot, std::size_t device,
                  std::vector<const Segment*> final_segments, std::string_view name, Trace& trace)
      : device_(static_cast<std::uint16_t>(device)),
        name_(name),
        trace_(trace),
        final_(std::move(final_segments)) {
    if (device < snapshot.device_traces.size()) events_ = &snapshot.device_traces[device];
    std::sort(final_.begin(), final_.end(),
              [](const Segment* a, const Segment* b) { return a->address < b->address; });
    state_only_ = events_ == nullptr || is_state_only(*events_);
    if (!state_only_) {
      for (const TraceEntry& e : *events_) {
        if (e.time_us) {
          start_time_ = *e.time_us;
          break;
        }
      }
    }
  }

  void emit_seeds(std::vector<TraceEvent>& out) {
    seed_segments(out);
    seed_allocs(out);
  }

  void emit_events(std::vector<TraceEvent>& out) {
    if (state_only_) return;
    for (const TraceEntry& e : *events_) {
      if (e.action == Action::snapshot) continue;
      TraceEvent ev = convert(e);
      if (ev.op == Op::alloc) tag_private(ev);
      if (is_block_action(e.action)) track_block(ev, out);
      out.push_back(ev);
    }
  }

 private:
  TraceEvent convert(const TraceEntry& e) const {
    TraceEvent ev = make_event(op_of(e.action), e.addr, e.size, e.stream, e.time_us.value_or(0));
    ev.label = label(e.frame);
    if (is_segment_action(e.action)) {
      const bool expandable = e.action == Action::segment_map || e.action == Action::segment_unmap;
      if (small_at(e.addr, e.size, expandable)) ev.flags = kFlagSmallPool;
    }
    return ev;
  }

  // Follows each block from live to pending (free requested) to free. A free_completed of a live
  // block lost its free_requested before the window: emit one so every free is requested first.
  void track_block(const TraceEvent& ev, std::vector<TraceEvent>& out) {
    switch (ev.op) {
      case Op::alloc: live_.insert(ev.addr); break;
      case Op::free_requested:
        live_.erase(ev.addr);
        pending_.insert(ev.addr);
        break;
      case Op::free_completed:
        if (pending_.erase(ev.addr) == 0 && live_.erase(ev.addr) != 0) {
          TraceEvent requested = ev;
          requested.op = Op::free_requested;
          out.push_back(requested);
        }
        break;
      default: break;
    }
  }

  TraceEvent make_event(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                   std::int64_t time) const {
    return {.op = op, .device = device_, .stream = stream, .addr = addr, .size = size, .time_us = time};
  }

  std::uint32_t label(const std::optional<Frame>& frame) const {
    return frame ? trace_.intern(frame->label()) : 0;
  }

  [[noreturn]] void fail_event(std::size_t index, const std::string& reason) const {
    throw SnapshotError::at_path(std::string(name_),
                                 fmt::format("device_traces[{}][{}]", device_, index), reason);
  }

  // The final segment holding `addr`, or null.
  const Segment* final_segment_at(std::uint64_t addr) const {
    auto it = std::upper_bound(final_.begin(), final_.end(), addr,
                               [](std::uint64_t a, const Segment* s) { return a < s->address; });
    if (it == final_.begin()) return nullptr;
    const Segment* s = *std::prev(it);
    return addr < s->address + s->total_size ? s : nullptr;
  }

  // The pool of the final segment holding `addr`, else inferred from the size.
  bool small_at(std::uint64_t addr, std::uint64_t size, bool expandable) const {
    const Segment* s = final_segment_at(addr);
    return s != nullptr ? s->small_pool() : infer_small(size, expandable);
  }

  // An allocation in a final segment of a private pool (a CUDA graph's, a torch.cuda.MemPool's)
  // is imported under the pool's tag, so that a replay keeps it apart as PyTorch did: the
  // pytorch models in a private pool of that name, tensorpool under that tag. Segments of a
  // private pool released before the window's end are not known: their blocks are not tagged.
  void tag_private(TraceEvent& ev) const {
    const Segment* s = final_segment_at(ev.addr);
    if (s == nullptr || !s->private_pool()) return;
    ev.flags = static_cast<std::uint8_t>(ev.flags | kFlagTagged);
    ev.label = trace_.intern(s->pool_tag());
  }

  // Final segments with the window's segment events undone, newest first.
  void seed_segments(std::vector<TraceEvent>& out) const {
    std::map<std::uint64_t, SegmentSeed> fixed;
    RangeSet mapped;
    hold_final_segments(fixed, mapped);
    if (!state_only_) undo_segment_events(fixed, mapped);
    std::vector<TraceEvent> seeds;
    for (const auto& [addr, seed] : fixed) {
      seeds.push_back(make_event(Op::seed_segment, addr, seed.size, seed.stream, start_time_));
      if (seed.small) seeds.back().flags = kFlagSmallPool;
    }
    mapped.for_each_merged([&](std::uint64_t a, std::uint64_t b, std::uint64_t stream, bool small) {
      seeds.push_back(make_event(Op::seed_segment, a, b - a, stream, start_time_));
      seeds.back().flags =
          static_cast<std::uint8_t>(kFlagExpandable | (small ? kFlagSmallPool : 0));
    });
    std::sort(seeds.begin(), seeds.end(),
              [](const TraceEvent& x, const TraceEvent& y) { return x.addr < y.addr; });
    out.insert(out.end(), seeds.begin(), seeds.end());
  }

  void hold_final_segments(std::map<std::uint64_t, SegmentSeed>& fixed, RangeSet& mapped) const {
    for (const Segment* s : final_) {
      const SegmentSeed seed{s->total_size, s->stream, s->small_pool()};
      const bool ok = s->is_expandable ? mapped.add(s->address, s->address + s->total_size,
                                                    s->stream, seed.small)
                                       : fixed.emplace(s->address, seed).second;
      if (!ok) {
        throw SnapshotError::at_path(
            std::string(name_), "segments",
            fmt::format("two segments overlap at {:#x} on device {}", s->address, device_));
      }
    }
  }

  void undo_segment_events(std::map<std::uint64_t, SegmentSeed>& fixed, RangeSet& mapped) const {
    for (std::size_t i = events_->size(); i-- > 0;) {
      const TraceEntry& e = (*events_)[i];
      const std::uint64_t end = e.addr + e.size;
      switch (e.action) {
        case Action::segment_alloc:
          if (fixed.erase(e.addr) == 0) {
            fail_event(i, fmt::format("segment_alloc at {:#x} is neither in the final segments nor "
                                      "freed later in the window",
                                      e.addr));
          }
          break;
        case Action::segment_free:
          if (!fixed.emplace(e.addr, SegmentSeed{e.size, e.stream, small_at(e.addr, e.size, false)})
                   .second) {
            fail_event(i, fmt::format("segment_free at {:#x} of a segment that exists afterwards",
                                      e.addr));
          }
          break;
        case Action::segment_map:
          if (!mapped.remove(e.addr, end)) {
            fail_event(i, fmt::format("segment_map of [{:#x}, {:#x}) that is not mapped afterwards",
                                      e.addr, end));
          }
          break;
        case Action::segment_unmap:
          if (!mapped.add(e.addr, end, e.stream, small_at(e.addr, e.size, true))) {
            fail_event(i, fmt::format("segment_unmap of [{:#x}, {:#x}) that is mapped afterwards",
                                      e.addr, end));
          }
          break;
        default: break;
      }
    }
  }

  // Blocks freed before being allocated in the window, and final live blocks it never allocates.
  void seed_allocs(std::vector<TraceEvent>& out) {
    std::map<std::uint64_t, TraceEvent> seeds;
    std::unordered_set<std::uint64_t> touched;
    std::unordered_set<std::uint64_t> allocated;
    if (!state_only_) {
      for (const TraceEntry& e : *events_) {
        if (!is_block_action(e.action)) continue;
        if (touched.insert(e.addr).second && e.action != Action::alloc) {
          seeds.emplace(e.addr, make_event(Op::seed_alloc, e.addr, e.size, e.stream, start_time_));
        }
        if (e.action == Action::alloc) allocated.insert(e.addr);
      }
    }
    for (const Segment* s : final_) {
      for (const Block& b : s->blocks) {
        if (!b.live() || allocated.count(b.address) != 0 || seeds.count(b.address) != 0) continue;
        TraceEvent ev = make_event(Op::seed_alloc, b.address, b.requested_size, s->stream, start_time_);
        ev.label = label(b.frame);
        seeds.emplace(b.address, ev);
      }
    }
    for (auto& [addr, ev] : seeds) tag_private(ev);
    for (const auto& [addr, ev] : seeds) {
      out.push_back(ev);
      live_.insert(addr);
    }
  }

  std::uint16_t device_;
  std::string_view name_;
  Trace& trace_;
  std::vector<const Segment*> final_;  // the device's final segments, sorted by address
  const std::vector<TraceEntry>* events_ = nullptr;
  bool state_only_ = true;
  std::int64_t start_time_ = 0;
  std::unordered_set<std::uint64_t> live_;     // blocks live while emitting events
  std::unordered_set<std::uint64_t> pending_;  // blocks whose free is requested, not completed
};

}  // namespace

Trace to_trace(const Snapshot& snapshot, std::string_view name) {
  Trace trace;
  trace.info.source = fmt::format("pytorch-snapshot:{}", name);
  trace.info.metadata = snapshot.allocator_settings;
  std::size_t devices = snapshot.device_traces.size();
  for (const Segment& s : snapshot.segments) devices = std::max<std::size_t>(devices, s.device + 1);
  if (devices > kMaxDevices) {
    throw SnapshotError::at_path(
        std::string(name), "device_traces",
        fmt::format("{} devices, at most {} supported", devices, kMaxDevices));
  }
  std::vector<std::vector<const Segment*>> by_device(devices);
  for (const Segment& s : snapshot.segments) by_device[s.device].push_back(&s);
  std::vector<DeviceConverter> converters;
  converters.reserve(devices);
  for (std::size_t d = 0; d < devices; ++d) {
    converters.emplace_back(snapshot, d, std::move(by_device[d]), name, trace);
  }
  for (auto& c : converters) c.emit_seeds(trace.events);
  for (auto& c : converters) c.emit_events(trace.events);
  mark_empty_cache_calls(trace);
  return trace;
}

Trace import_snapshot(const std::filesystem::path& file, const ReadOptions& options) {
  return to_trace(load_snapshot(file, options), file.filename().string());
}

}  // namespace tensorpool::trace::pytorch

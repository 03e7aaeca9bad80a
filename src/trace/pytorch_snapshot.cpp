// Reads PyTorch memory snapshots (pickles of torch.cuda.memory._snapshot()) into plain structs and
// converts them to tensorpool traces with seed events for the state at the window's start. The
// rules are documented in tensorpool/trace/pytorch_snapshot.hpp.
#include "tensorpool/trace/pytorch_snapshot.hpp"

#include "tensorpool/trace/empty_cache.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <unordered_set>
#include <utility>

namespace tensorpool::trace::pytorch {

namespace {

using pickle::Kind;
using pickle::Value;

constexpr std::array<const char*, 9> kActionNames = {
    "alloc",         "free_requested", "free_completed",
    "segment_alloc", "segment_free",   "segment_map",
    "segment_unmap", "snapshot",       "oom"};

constexpr std::uint64_t kMiB = 1024 * 1024;
constexpr std::uint64_t kSmallSegmentSize = 2 * kMiB;  // PyTorch's kSmallBuffer
constexpr std::uint64_t kLargeGranule = 20 * kMiB;     // PyTorch's kLargeBuffer
constexpr std::size_t kMaxDevices = 65536;             // Event::device is 16-bit
constexpr int kMaxSettingDepth = 4;                    // nested allocator settings flattened

}  // namespace

const char* to_string(Action action) noexcept {
  const auto i = static_cast<std::size_t>(action);
  return i < kActionNames.size() ? kActionNames[i] : "unknown";
}

bool parse_action(std::string_view name, Action& out) noexcept {
  for (std::size_t i = 0; i < kActionNames.size(); ++i) {
    if (name == kActionNames[i]) {
      out = static_cast<Action>(i);
      return true;
    }
  }
  return false;
}

std::string Frame::label() const { return fmt::format("{} ({}:{})", name, filename, line); }

bool Block::live() const noexcept {
  return state == "active_allocated" || state == "active_pending_free";
}

bool is_state_only(const std::vector<TraceEntry>& device_trace) noexcept {
  return std::none_of(device_trace.begin(), device_trace.end(), [](const TraceEntry& e) {
    return e.action != Action::free_completed && e.action != Action::snapshot &&
           e.action != Action::oom;
  });
}

// ---------------------------------------------------------------------------------------------
// Reading: every accessor below throws SnapshotError with the value's path on a mismatch.

namespace {

std::uint64_t get_uint(const Value& dict, std::string_view key) { return dict[key].as_uint(); }

std::uint64_t opt_uint(const Value& dict, std::string_view key, std::uint64_t fallback) {
  const std::optional<Value> v = dict.find(key);
  return (v && !v->is_none()) ? v->as_uint() : fallback;
}

bool opt_bool(const Value& dict, std::string_view key, bool fallback) {
  const std::optional<Value> v = dict.find(key);
  return (v && !v->is_none()) ? v->as_bool() : fallback;
}

std::string get_string(const Value& dict, std::string_view key) {
  return std::string(dict[key].as_string());
}

Frame read_frame(const Value& v) {
  Frame f;
  f.name = get_string(v, "name");
  f.filename = get_string(v, "filename");
  f.line = v["line"].as_int();
  return f;
}

bool is_python_file(std::string_view filename) { return filename.ends_with(".py"); }

// The innermost C++ frame whose name starts with `prefix`, its argument list dropped.
std::optional<Frame> first_cpp_frame(const pickle::ElementRange& list, std::string_view prefix) {
  for (const Value f : list) {
    const std::string_view name = f["name"].as_string();
    if (!name.starts_with(prefix)) continue;
    Frame frame = read_frame(f);
    frame.name = std::string(name.substr(0, name.find('(')));
    return frame;
  }
  return std::nullopt;
}

std::optional<Frame> choose_frame(const Value& frames, FrameChoice choice) {
  if (choice == FrameChoice::none || frames.is_none()) return std::nullopt;
  const pickle::ElementRange list = frames.elements();
  if (list.size() == 0) return std::nullopt;
  if (choice == FrameChoice::first_python) {
    for (const Value f : list) {
      if (is_python_file(f["filename"].as_string())) return read_frame(f);
    }
    if (auto node = first_cpp_frame(list, "torch::autograd::generated::")) return node;
    if (auto op = first_cpp_frame(list, "at::_ops::")) return op;
  }
  return read_frame(frames[0]);
}

std::optional<Frame> entry_frame(const Value& entry, FrameChoice choice) {
  if (choice == FrameChoice::none) return std::nullopt;
  const std::optional<Value> frames = entry.find("frames");
  return frames ? choose_frame(*frames, choice) : std::nullopt;
}

// New snapshots give a block its allocation stack in "frames"; old ones in "history" (the last
// entry is the current allocation).
std::optional<Frame> block_frame(const Value& block, FrameChoice choice) {
  if (choice == FrameChoice::none) return std::nullopt;
  if (block.contains("frames")) return entry_frame(block, choice);
  const std::optional<Value> history = block.find("history");
  if (!history || history->is_none()) return std::nullopt;
  const std::size_t n = history->elements().size();
  return n == 0 ? std::nullopt : entry_frame((*history)[n - 1], choice);
}

// `next` is where the block starts when the snapshot has no "address" (state-only snapshots of
// old PyTorch versions): blocks tile their segment in order.
Block read_block(const Value& v, std::uint64_t next, FrameChoice choice) {
  Block b;
  b.size = get_uint(v, "size");
  b.requested_size = opt_uint(v, "requested_size", b.size);
  b.state = get_string(v, "state");
  if (const std::optional<Value> address = v.find("address")) {
    b.address = address->as_uint();
  } else {
    b.address = next;
    b.address_computed = true;
  }
  b.frame = block_frame(v, choice);
  return b;
}

Segment read_segment(const Value& v, FrameChoice choice) {
  Segment s;
  const Value device = v["device"];
  if (device.as_uint() >= kMaxDevices) device.fail("device index above 65535");
  s.device = static_cast<std::uint32_t>(device.as_uint());
  s.address = get_uint(v, "address");
  s.total_size = get_uint(v, "total_size");
  s.allocated_size = opt_uint(v, "allocated_size", 0);
  s.active_size = opt_uint(v, "active_size", 0);
  s.requested_size = opt_uint(v, "requested_size", 0);
  s.stream = opt_uint(v, "stream", 0);
  s.segment_type = get_string(v, "segment_type");
  s.is_expandable = opt_bool(v, "is_expandable", false);
  std::uint64_t next = s.address;
  for (const Value bv : v["blocks"].elements()) {
    Block b = read_block(bv, next, choice);
    // Written so that no sum can wrap around: the values are untrusted.
    const bool inside = b.address >= s.address && b.size <= s.total_size &&
                        b.address - s.address <= s.total_size - b.size;
    if (!inside) {
      bv.fail(fmt::format("block [{:#x}, {:#x}) lies outside its segment [{:#x}, {:#x})", b.address,
                          b.address + b.size, s.address, s.address + s.total_size));
    }
    next = b.address + b.size;
    s.blocks.push_back(std::move(b));
  }
  return s;
}

TraceEntry read_entry(const Value& v, FrameChoice choice) {
  TraceEntry e;
  const Value action = v["action"];
  if (!parse_action(action.as_string(), e.action)) {
    action.fail(fmt::format("unknown action '{}'", action.as_string()));
  }
  // oom events carry "device_free" instead of an address; snapshot markers carry nothing.
  const bool optional_fields = e.action == Action::oom || e.action == Action::snapshot;
  e.addr = optional_fields ? opt_uint(v, "addr", 0) : get_uint(v, "addr");
  e.size = e.action == Action::snapshot ? opt_uint(v, "size", 0) : get_uint(v, "size");
  e.stream = opt_uint(v, "stream", 0);
  if (const std::optional<Value> t = v.find("time_us"); t && !t->is_none()) e.time_us = t->as_int();
  e.frame = entry_frame(v, choice);
  return e;
}

std::string render_int(const Value& v) {
  try {
    return std::to_string(v.as_int());
  } catch (const pickle::ParseError&) {
    return std::to_string(v.as_uint());  // 2^63 .. 2^64-1
  }
}

// Python's repr of a float: always a '.' or an exponent ("0.0", "1e+300", "inf").
std::string render_float(double x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

std::string render_scalar(const Value& v) {
  switch (v.kind()) {
    case Kind::none: return "None";
    case Kind::boolean: return v.as_bool() ? "True" : "False";
    case Kind::integer: return render_int(v);
    case Kind::floating: return render_float(v.as_float());
    case Kind::string: return std::string(v.as_string());
    default: return fmt::format("<{}>", v.type_name());
  }
}

std::string render_value(const Value& v) {
  if (!v.is(Kind::list) && !v.is(Kind::tuple)) return render_scalar(v);
  std::string out;
  for (const Value item : v.elements()) {
    if (!out.empty()) out += ',';
    out += render_scalar(item);
  }
  return out;
}

std::string key_text(const Value& key) {
  return key.is(Kind::string) ? std::string(key.as_string()) : render_scalar(key);
}

// Nested dicts ("roundup_power2_divisions") become "outer.inner=value" lines.
void flatten_setting(std::vector<std::string>& out, const std::string& key, const Value& v,
                     int depth) {
  if (v.is(Kind::dict) && depth < kMaxSettingDepth) {
    for (const auto& [k, val] : v.items())
      flatten_setting(out, key + "." + key_text(k), val, depth + 1);
    return;
  }
  out.push_back(key + "=" + render_value(v));
}

void read_settings(const Value& settings, std::vector<std::string>& out) {
  if (settings.is_none()) return;
  for (const auto& [k, v] : settings.items()) flatten_setting(out, key_text(k), v, 1);
}

}  // namespace

Snapshot read_snapshot(const Value& root, const ReadOptions& options) {
  Snapshot s;
  // torch.cuda.memory_snapshot() (as opposed to _snapshot()) is the bare list of segments.
  const bool bare_segments = root.is(Kind::list);
  if (!bare_segments && !root.is(Kind::dict)) {
    root.fail_expected("dict (a PyTorch memory snapshot)");
  }
  const Value segments = bare_segments ? root : root["segments"];
  for (const Value seg : segments.elements())
    s.segments.push_back(read_segment(seg, options.frame));
  if (bare_segments) return s;
  if (const std::optional<Value> traces = root.find("device_traces");
      traces && !traces->is_none()) {
    for (const Value device : traces->elements()) {
      auto& list = s.device_traces.emplace_back();
      const pickle::ElementRange entries = device.elements();
      list.reserve(entries.size());
      for (const Value e : entries) list.push_back(read_entry(e, options.frame));
    }
  }
  if (const std::optional<Value> settings = root.find("allocator_settings")) {
    read_settings(*settings, s.allocator_settings);
  }
  return s;
}

Snapshot load_snapshot(const std::filesystem::path& file, const ReadOptions& options) {
  const pickle::Document doc = pickle::Document::load(file);
  return read_snapshot(doc.root(), options);
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

  void emit_seeds(std::vector<Event>& out) {
    seed_segments(out);
    seed_allocs(out);
  }

  void emit_events(std::vector<Event>& out) {
    if (state_only_) return;
    for (const TraceEntry& e : *events_) {
      if (e.action == Action::snapshot) continue;
      const Event ev = convert(e);
      if (is_block_action(e.action)) track_block(ev, out);
      out.push_back(ev);
    }
  }

 private:
  Event convert(const TraceEntry& e) const {
    Event ev = make_event(op_of(e.action), e.addr, e.size, e.stream, e.time_us.value_or(0));
    ev.label = label(e.frame);
    if (is_segment_action(e.action)) {
      const bool expandable = e.action == Action::segment_map || e.action == Action::segment_unmap;
      if (small_at(e.addr, e.size, expandable)) ev.flags = kFlagSmallPool;
    }
    return ev;
  }

  // Follows each block from live to pending (free requested) to free. A free_completed of a live
  // block lost its free_requested before the window: emit one so every free is requested first.
  void track_block(const Event& ev, std::vector<Event>& out) {
    switch (ev.op) {
      case Op::alloc: live_.insert(ev.addr); break;
      case Op::free_requested:
        live_.erase(ev.addr);
        pending_.insert(ev.addr);
        break;
      case Op::free_completed:
        if (pending_.erase(ev.addr) == 0 && live_.erase(ev.addr) != 0) {
          Event requested = ev;
          requested.op = Op::free_requested;
          out.push_back(requested);
        }
        break;
      default: break;
    }
  }

  Event make_event(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                   std::int64_t time) const {
    Event ev;
    ev.op = op;
    ev.device = device_;
    ev.addr = addr;
    ev.size = size;
    ev.stream = stream;
    ev.time_us = time;
    return ev;
  }

  std::uint32_t label(const std::optional<Frame>& frame) const {
    return frame ? trace_.intern(frame->label()) : 0;
  }

  [[noreturn]] void fail_event(std::size_t index, const std::string& reason) const {
    throw SnapshotError::at_path(std::string(name_),
                                 fmt::format("device_traces[{}][{}]", device_, index), reason);
  }

  // The pool of the final segment holding `addr`, else inferred from the size.
  bool small_at(std::uint64_t addr, std::uint64_t size, bool expandable) const {
    auto it = std::upper_bound(final_.begin(), final_.end(), addr,
                               [](std::uint64_t a, const Segment* s) { return a < s->address; });
    if (it != final_.begin()) {
      const Segment* s = *std::prev(it);
      if (addr < s->address + s->total_size) return s->small_pool();
    }
    return infer_small(size, expandable);
  }

  // Final segments with the window's segment events undone, newest first.
  void seed_segments(std::vector<Event>& out) const {
    std::map<std::uint64_t, SegmentSeed> fixed;
    RangeSet mapped;
    hold_final_segments(fixed, mapped);
    if (!state_only_) undo_segment_events(fixed, mapped);
    std::vector<Event> seeds;
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
              [](const Event& x, const Event& y) { return x.addr < y.addr; });
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
  void seed_allocs(std::vector<Event>& out) {
    std::map<std::uint64_t, Event> seeds;
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
        Event ev = make_event(Op::seed_alloc, b.address, b.requested_size, s->stream, start_time_);
        ev.label = label(b.frame);
        seeds.emplace(b.address, ev);
      }
    }
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

// pytorch_snapshot_reader.cpp: reads PyTorch memory snapshots (pickles of
// torch.cuda.memory._snapshot()) into the plain structs of tensorpool/trace/pytorch_snapshot.hpp,
// checking every key it uses. The conversion to a trace is pytorch_snapshot_convert.cpp's.
#include "tensorpool/trace/pytorch_snapshot.hpp"

#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace tensorpool::trace::pytorch {

namespace {

using pickle::Kind;
using pickle::Value;

constexpr std::array<const char*, 9> kActionNames = {
    "alloc",         "free_requested", "free_completed",
    "segment_alloc", "segment_free",   "segment_map",
    "segment_unmap", "snapshot",       "oom"};

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

std::string Segment::pool_tag() const { return fmt::format("pytorch-pool:{},{}", pool_id.first, pool_id.second); }

bool Block::live() const noexcept {
  return state == "active_allocated" || state == "active_pending_free";
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

// The frame chosen for each stack of one snapshot. PyTorch pickles each distinct frame once and
// refers to it from every stack that holds it (a memo reference: one node), and stacks repeat too
// (cs336-2.7b: 19,342 stacks, 12,665 distinct, 704,899 frame references to 668 frames), so each
// stack is chosen once and each frame's filename, name and fields are read once, by node; a
// stack's elements are looked at by node id (Value::element_id()), and a Value is made only for
// a frame not read before. The reads are made in the order they would be without the caches, so
// a malformed frame fails at the same place, with the same path.
class FrameChooser {
 public:
  explicit FrameChooser(FrameChoice choice) : choice_(choice) {}
  FrameChoice choice() const noexcept { return choice_; }

  std::optional<Frame> choose(const Value& frames) {
    if (choice_ == FrameChoice::none || frames.is_none()) return std::nullopt;
    if (const auto it = stacks_.find(frames.node_id()); it != stacks_.end()) return it->second;
    std::optional<Frame> chosen = choose_uncached(frames);
    stacks_.emplace(frames.node_id(), chosen);
    return chosen;
  }

 private:
  struct Seen {
    std::optional<bool> python;            // its filename ends with ".py"
    std::optional<std::string_view> name;  // into the document's bytes
    std::optional<Frame> frame;            // read_frame()
  };

  std::optional<Frame> choose_uncached(const Value& frames) {
    const std::size_t n = frames.elements().size();  // a list or tuple, else the error
    if (n == 0) return std::nullopt;
    if (choice_ == FrameChoice::first_python) {
      for (std::size_t i = 0; i < n; ++i) {
        if (is_python(frames, i)) return frame(frames, i);
      }
      if (auto node = first_cpp_frame(frames, n, "torch::autograd::generated::")) return node;
      if (auto op = first_cpp_frame(frames, n, "at::_ops::")) return op;
    }
    return frame(frames, 0);
  }
  bool is_python(const Value& frames, std::size_t i) {
    Seen& seen = frames_[frames.element_id(i)];
    if (!seen.python) seen.python = is_python_file(frames[i]["filename"].as_string());
    return *seen.python;
  }
  std::string_view name(const Value& frames, std::size_t i) {
    Seen& seen = frames_[frames.element_id(i)];
    if (!seen.name) seen.name = frames[i]["name"].as_string();
    return *seen.name;
  }
  const Frame& frame(const Value& frames, std::size_t i) {
    Seen& seen = frames_[frames.element_id(i)];
    if (!seen.frame) seen.frame = read_frame(frames[i]);
    return *seen.frame;
  }
  // The innermost C++ frame whose name starts with `prefix`, its argument list dropped.
  std::optional<Frame> first_cpp_frame(const Value& frames, std::size_t n, std::string_view prefix) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view frame_name = name(frames, i);
      if (!frame_name.starts_with(prefix)) continue;
      Frame chosen = frame(frames, i);
      chosen.name = std::string(frame_name.substr(0, frame_name.find('(')));
      return chosen;
    }
    return std::nullopt;
  }

  FrameChoice choice_;
  std::unordered_map<std::uint32_t, std::optional<Frame>> stacks_;  // by the stack's node
  std::unordered_map<std::uint32_t, Seen> frames_;                  // by the frame's node
};

std::optional<Frame> entry_frame(const Value& entry, FrameChooser& chooser) {
  if (chooser.choice() == FrameChoice::none) return std::nullopt;
  const std::optional<Value> frames = entry.find("frames");
  return frames ? chooser.choose(*frames) : std::nullopt;
}

// New snapshots give a block its allocation stack in "frames"; old ones in "history" (the last
// entry is the current allocation).
std::optional<Frame> block_frame(const Value& block, FrameChooser& chooser) {
  if (chooser.choice() == FrameChoice::none) return std::nullopt;
  if (block.contains("frames")) return entry_frame(block, chooser);
  const std::optional<Value> history = block.find("history");
  if (!history || history->is_none()) return std::nullopt;
  const std::size_t n = history->elements().size();
  return n == 0 ? std::nullopt : entry_frame((*history)[n - 1], chooser);
}

// `next` is where the block starts when the snapshot has no "address" (state-only snapshots of
// old PyTorch versions): blocks tile their segment in order.
Block read_block(const Value& v, std::uint64_t next, FrameChooser& chooser) {
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
  b.frame = block_frame(v, chooser);
  return b;
}

Segment read_segment(const Value& v, FrameChooser& chooser) {
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
  if (const std::optional<Value> pool = v.find("segment_pool_id"); pool && !pool->is_none()) {
    std::vector<std::int64_t> ids;
    for (const Value id : pool->elements()) ids.push_back(id.as_int());
    if (ids.size() != 2) pool->fail(fmt::format("a pool id of {} numbers, expected 2", ids.size()));
    s.pool_id = {ids[0], ids[1]};
  }
  std::uint64_t next = s.address;
  for (const Value bv : v["blocks"].elements()) {
    Block b = read_block(bv, next, chooser);
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

TraceEntry read_entry(const Value& v, FrameChooser& chooser) {
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
  e.frame = entry_frame(v, chooser);
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
  FrameChooser chooser(options.frame);
  for (const Value seg : segments.elements())
    s.segments.push_back(read_segment(seg, chooser));
  if (bare_segments) return s;
  if (const std::optional<Value> traces = root.find("device_traces");
      traces && !traces->is_none()) {
    for (const Value device : traces->elements()) {
      auto& list = s.device_traces.emplace_back();
      const pickle::ElementRange entries = device.elements();
      list.reserve(entries.size());
      for (const Value e : entries) list.push_back(read_entry(e, chooser));
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

}  // namespace tensorpool::trace::pytorch

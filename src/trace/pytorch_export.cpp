// Writes tensorpool memory state and event history as a PyTorch memory snapshot pickle; the layout
// and the mapping are documented in tensorpool/trace/pytorch_export.hpp.
#include "tensorpool/trace/pytorch_export.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "tensorpool/key_values.hpp"
#include "tensorpool/trace/pickle_writer.hpp"
#include "trace/format_io.hpp"

namespace tensorpool::trace::pytorch {

// ---------------------------------------------------------------------------------------------
// HistoryRecorder

void HistoryRecorder::on_event(const AllocatorEvent& event) noexcept {
  try {
    std::lock_guard lock(mutex_);
    ++recorded_;
    // A snapshot has no record_stream action: such an entry would only take a slot.
    if (max_entries_ == 0 || event.type == EventType::record_stream) return;
    if (entries_.size() == max_entries_) entries_.pop_front();
    entries_.push_back(HistoryEntry{event, 0});
  } catch (...) {
    // Out of memory while recording: the entry is lost, the allocator is not disturbed.
  }
}

void HistoryRecorder::on_oom(const OutOfMemoryInfo& info) noexcept {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->event.type == EventType::oom) {
      it->device_free = info.device_free;
      return;
    }
  }
}

void HistoryRecorder::set_max_entries(std::size_t max_entries) {
  std::lock_guard lock(mutex_);
  max_entries_ = max_entries;
  while (entries_.size() > max_entries_) entries_.pop_front();
}

void HistoryRecorder::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
}

std::uint64_t HistoryRecorder::recorded() const {
  std::lock_guard lock(mutex_);
  return recorded_;
}

std::vector<HistoryEntry> HistoryRecorder::entries() const {
  std::lock_guard lock(mutex_);
  return {entries_.begin(), entries_.end()};
}

// ---------------------------------------------------------------------------------------------
// The pickle

namespace {

const char* state_name(BlockState s) {
  switch (s) {
    case BlockState::allocated: return "active_allocated";
    case BlockState::pending_free: return "active_pending_free";
    case BlockState::free: break;
  }
  return "inactive";
}

// The PyTorch action of an event; nullptr for events a snapshot does not show.
const char* action_name(const AllocatorEvent& e) {
  switch (e.type) {
    case EventType::alloc: return "alloc";
    case EventType::free_requested: return "free_requested";
    case EventType::free_completed: return "free_completed";
    case EventType::segment_alloc: return e.address == 0 ? nullptr : "segment_alloc";
    case EventType::segment_free: return e.address == 0 ? nullptr : "segment_free";
    case EventType::segment_map: return "segment_map";
    case EventType::segment_unmap: return "segment_unmap";
    case EventType::oom: return "oom";
    case EventType::empty_cache:
    case EventType::record_stream:
    case EventType::sleep:
    case EventType::wake:
    case EventType::capture_begin:
    case EventType::capture_end:
    case EventType::graph_release: break;
  }
  return nullptr;
}

bool is_segment_event(EventType t) {
  return t == EventType::segment_alloc || t == EventType::segment_free ||
         t == EventType::segment_map || t == EventType::segment_unmap;
}

void empty_frames(pickle::Writer& w) {
  w.key("frames");
  w.begin_list();
  w.end_list();
}

// A segment as PyTorch shows it: [first, last) of a SegmentInfo's blocks.
struct SegmentView {
  const SegmentInfo* info;
  std::size_t first;
  std::size_t last;
  bool expandable;
};

void write_block(pickle::Writer& w, const BlockInfo& b) {
  w.begin_dict();
  w.key("address");
  w.unsigned_integer(b.address);
  w.key("size");
  w.unsigned_integer(b.size);
  w.key("requested_size");
  w.unsigned_integer(b.state == BlockState::free ? 0 : b.requested);
  w.key("state");
  w.string(state_name(b.state));
  empty_frames(w);
  w.end_dict();
}

void write_segment(pickle::Writer& w, int device, const SegmentView& v) {
  const auto& blocks = v.info->blocks;
  std::size_t total = 0, allocated = 0, active = 0, requested = 0;
  for (std::size_t i = v.first; i < v.last; ++i) {
    const BlockInfo& b = blocks[i];
    total += b.size;
    if (b.state == BlockState::free) continue;
    active += b.size;
    requested += b.requested;
    if (b.state == BlockState::allocated) allocated += b.size;
  }
  w.begin_dict();
  w.key("device");
  w.integer(device);
  w.key("address");
  w.unsigned_integer(blocks[v.first].address);
  w.key("total_size");
  w.unsigned_integer(total);
  w.key("allocated_size");
  w.unsigned_integer(allocated);
  w.key("active_size");
  w.unsigned_integer(active);
  w.key("requested_size");
  w.unsigned_integer(requested);
  w.key("stream");
  w.unsigned_integer(v.info->stream);
  w.key("segment_type");
  w.string(v.info->pool == Pool::small ? "small" : "large");
  w.key("segment_pool_id");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  w.key("is_expandable");
  w.boolean(v.expandable);
  empty_frames(w);
  w.key("blocks");
  w.begin_list();
  for (std::size_t i = v.first; i < v.last; ++i) write_block(w, blocks[i]);
  w.end_list();
  w.end_dict();
}

// The PyTorch segments of one SegmentInfo: itself, or a heap's runs of mapped blocks.
void add_views(const SegmentInfo& s, std::vector<SegmentView>& out) {
  if (!s.heap) {
    if (!s.blocks.empty()) out.push_back({&s, 0, s.blocks.size(), false});
    return;
  }
  std::size_t i = 0;
  while (i < s.blocks.size()) {
    if (!s.blocks[i].mapped) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < s.blocks.size() && s.blocks[j].mapped) ++j;
    out.push_back({&s, i, j, true});
    i = j;
  }
}

void write_entry(pickle::Writer& w, const HistoryEntry& h, const char* action) {
  const AllocatorEvent& e = h.event;
  w.begin_dict();
  w.key("action");
  w.string(action);
  if (e.type == EventType::oom) {
    w.key("device_free");
    w.unsigned_integer(h.device_free);
  } else {
    w.key("addr");
    w.unsigned_integer(e.address);
  }
  w.key("size");
  w.unsigned_integer(is_segment_event(e.type) ? e.size : e.requested);
  w.key("stream");
  w.unsigned_integer(e.stream);
  w.key("time_us");
  w.unsigned_integer(e.time_ns / 1000);
  empty_frames(w);
  w.end_dict();
}

void write_trace(pickle::Writer& w, const std::vector<HistoryEntry>& history) {
  w.begin_list();
  for (const HistoryEntry& h : history) {
    if (const char* action = action_name(h.event)) write_entry(w, h, action);
  }
  w.end_list();
}

}  // namespace

std::string snapshot_pickle(const std::vector<DeviceMemory>& devices,
                            const std::vector<std::pair<std::string, std::string>>& settings) {
  std::map<int, const DeviceMemory*> by_device;
  for (const DeviceMemory& d : devices) {
    if (d.device < 0 || d.device > 65535)
      throw UsageError(fmt::format("snapshot export: device ordinal {} out of range 0..65535", d.device));
    if (!by_device.emplace(d.device, &d).second)
      throw UsageError(fmt::format("snapshot export: device {} given twice", d.device));
  }
  pickle::Writer w;
  w.begin_dict();
  w.key("segments");
  w.begin_list();
  for (const auto& [device, d] : by_device) {
    std::vector<SegmentView> views;
    for (const SegmentInfo& s : d->state.segments) add_views(s, views);
    std::sort(views.begin(), views.end(), [](const SegmentView& a, const SegmentView& b) {
      return a.info->blocks[a.first].address < b.info->blocks[b.first].address;
    });
    for (const SegmentView& v : views) write_segment(w, device, v);
  }
  w.end_list();
  w.key("device_traces");
  w.begin_list();
  const int highest = by_device.empty() ? -1 : by_device.rbegin()->first;
  for (int device = 0; device <= highest; ++device) {
    const auto it = by_device.find(device);
    if (it == by_device.end()) {
      w.begin_list();
      w.end_list();
    } else {
      write_trace(w, it->second->history);
    }
  }
  w.end_list();
  w.key("allocator_settings");
  w.begin_dict();
  w.key("allocator");
  w.string("tensorpool");
  for (const auto& [key, value] : settings) {
    if (key == "allocator") continue;
    w.key(key);
    w.string(value);
  }
  w.end_dict();
  w.end_dict();
  return w.finish();
}

std::vector<std::pair<std::string, std::string>> settings_from_conf(std::string_view conf) {
  std::vector<std::pair<std::string, std::string>> out;
  for (KeyValue& item : parse_key_values(conf, "allocator settings"))
    out.emplace_back(std::move(item.key), std::move(item.value));
  return out;
}

void check_writable(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(fmt::format("cannot write {} '{}': it is a directory", what, path.string()));
  // Creating (and removing) the temporary file the real write would use proves the directory
  // exists and is writable.
  try {
    detail::FileSink probe(path.string());
    probe.discard();
  } catch (const Error& e) {
    throw Error(fmt::format("cannot write {} '{}': {}", what, path.string(), e.what()));
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, std::string_view what) {
  try {
    detail::FileSink sink(path.string());
    sink.put(bytes);
    sink.commit();
  } catch (const Error& e) {
    throw Error(fmt::format("cannot write {} '{}': {}", what, path.string(), e.what()));
  }
}

}  // namespace tensorpool::trace::pytorch

// tensorpool/trace/pytorch_export.hpp: writes an allocator's memory state and event history as a
// PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot() writes), so that
// pytorch.org/memory_viz, torch.cuda._memory_viz and tensorpool's own importer
// (pytorch_snapshot.hpp) read it.
//
// The pickle is plain data (pickle_writer.hpp) with PyTorch's layout:
//   {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
//                  "requested_size", "stream", "segment_type": "small"|"large",
//                  "segment_pool_id": (0, 0), "is_expandable",
//                  "blocks": [{"address", "size", "requested_size",
//                              "state": "active_allocated"|"active_pending_free"|"inactive",
//                              "frames": []}, ...]}, ...],
//    "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames": []}, ...],
//                      ...one list per device ordinal, 0 to the highest exported],
//    "allocator_settings": {"allocator": "tensorpool", KEY: VALUE, ...}}
//
// Mapping from tensorpool's state:
//  - a fixed segment (SegmentInfo with heap false) is one segment; its blocks tile it in address
//    order;
//  - a vmm heap (heap true) becomes one segment per contiguous run of mapped blocks, flagged
//    is_expandable (PyTorch's expandable segments are shown the same way); unmapped address
//    space is left out, and so are physical pages cached unmapped (they have no address);
//  - blocks: allocated -> active_allocated, pending_free -> active_pending_free (freed, waiting
//    for another stream), free -> inactive (requested_size 0);
//  - events: alloc, free_requested, free_completed and oom (with "device_free", no "addr") keep
//    their names and carry the requested bytes; segment_alloc / segment_free / segment_map /
//    segment_unmap carry the segment or mapping; the virtual-memory mode's physical page
//    creations and releases (address 0) and empty_cache events have no PyTorch counterpart and
//    are left out; time_us is the event's steady-clock time in microseconds.
// Stack frames are not recorded: every "frames" list is empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/hooks.hpp"
#include "tensorpool/stats.hpp"

namespace tensorpool::trace::pytorch {

/// One recorded allocator event; device_free is set for oom events (from the OOM observer).
struct HistoryEntry {
  AllocatorEvent event;
  std::size_t device_free = 0;
};

/// Records an allocator's events for a snapshot's device_traces: attach it with
/// Allocator::add_observer() and Allocator::add_oom_observer([r](auto& i) { r->on_oom(i); }).
/// Keeps the newest `max_entries`. Thread-safe.
class HistoryRecorder final : public Observer {
 public:
  explicit HistoryRecorder(std::size_t max_entries = kDefaultMaxEntries) : max_entries_(max_entries) {}

  void on_event(const AllocatorEvent& event) noexcept override;
  /// Sets device_free on the newest oom entry (the allocator notifies the oom event under its
  /// lock, then calls OOM observers without it).
  void on_oom(const OutOfMemoryInfo& info) noexcept;

  /// Changes the bound (0: keep nothing); drops the oldest entries beyond it.
  void set_max_entries(std::size_t max_entries);
  void clear();
  /// Events recorded since construction, dropped ones included (monotone).
  std::uint64_t recorded() const;
  std::vector<HistoryEntry> entries() const;

  static constexpr std::size_t kDefaultMaxEntries = 100000;

 private:
  mutable std::mutex mutex_;
  std::deque<HistoryEntry> entries_;
  std::size_t max_entries_;
  std::uint64_t recorded_ = 0;
};

/// What one device contributes to a snapshot.
struct DeviceMemory {
  int device = 0;
  Snapshot state;                     // segments and blocks now
  std::vector<HistoryEntry> history;  // oldest first; empty: state only
};

/// The snapshot pickle of these devices (in any order; device ordinals 0..65535).
/// `settings` go to "allocator_settings" as string values, after "allocator": "tensorpool".
std::string snapshot_pickle(const std::vector<DeviceMemory>& devices,
                            const std::vector<std::pair<std::string, std::string>>& settings = {});

/// Config::to_string() text ("key:value,...") as settings pairs; throws ConfigError for a
/// malformed list (tensorpool/key_values.hpp).
std::vector<std::pair<std::string, std::string>> settings_from_conf(std::string_view conf);

/// Throws Error naming `path` (as "cannot write WHAT 'path'") when it cannot be written: its
/// directory is missing or not writable, or it names a directory. Called before any work is done.
void check_writable(const std::filesystem::path& path, std::string_view what = "snapshot");

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees half a file. Throws Error naming the path (the temporary file is removed).
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                           std::string_view what = "snapshot");

}  // namespace tensorpool::trace::pytorch

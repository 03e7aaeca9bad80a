// tensorpool/trace/pytorch_snapshot.hpp: imports PyTorch memory snapshots (the pickles written by
// torch.cuda.memory._dump_snapshot) as tensorpool traces.
//
// Two steps: read_snapshot() turns the pickle into plain structs (final segments with their
// blocks, one event list per device, the allocator settings), checking every key it uses and
// naming the path of anything missing or mistyped; to_trace() converts those structs to a Trace:
//
//  - Events are emitted device after device (not interleaved by time): first the seed events of
//    every device (device 0's seed_segments then seed_allocs, then device 1's, ...), then the
//    events of device 0 in PyTorch's order, then device 1's, ... The replay engine treats devices
//    independently.
//  - Seeds describe the state at the window's start (the trace is a ring buffer that can begin
//    mid-run): seed_segment for each segment held then (the final segments with the window's
//    segment events undone, walking backwards); for expandable segments, one seed per contiguous
//    range mapped then (final mapped ranges minus the window's maps plus its unmaps), flagged
//    kFlagExpandable. seed_alloc for each block live then: an address the window frees before it
//    allocates it, or a block the final segments show live (active_allocated/active_pending_free)
//    that the window never allocates. Seeds are sorted by address and carry the time of the
//    device's first event.
//  - kFlagSmallPool comes from the final segment containing the address ("segment_type": "small");
//    for a segment that is gone at the end it is inferred from the size (PyTorch's small segments
//    are exactly 2 MiB; small expandable mappings are not multiples of 20 MiB).
//  - A device whose window holds no alloc, free_requested or segment event is state-only (e.g. a
//    snapshot recorded without trace history): it becomes seeds only and its stray events are
//    dropped.
//  - A free_completed whose free_requested fell before the window gets a free_requested
//    synthesized just before it, so that every free is requested before it completes.
//  - Labels: "name (filename:line)" of one frame of the event's stack (see FrameChoice).
//  - Private pools: an alloc or seed_alloc inside a final segment whose "segment_pool_id" is not
//    (0, 0) (a CUDA graph's pool, a torch.cuda.MemPool) carries kFlagTagged and the label
//    "pytorch-pool:A,B" instead of its frame, so that a replay keeps it apart as PyTorch did.
//    Blocks of a private pool's segments released before the window's end are not known as such.
//  - The program's empty_cache() calls, seen as runs of segment_free events of wholly free
//    segments with no oom around them, get an empty_cache event before each run
//    (mark_empty_cache_calls, tensorpool/trace/empty_cache.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorpool/trace/event.hpp"
#include "tensorpool/trace/pickle.hpp"

namespace tensorpool::trace::pytorch {

/// Errors of a pickle that parses but is not a snapshot name the path of the offending value:
/// "FILE: segments[3].blocks[0].size: expected int, got str".
using SnapshotError = pickle::ParseError;

/// The most devices a snapshot may name (TraceEvent::device is 16-bit).
inline constexpr std::size_t kMaxDevices = 65536;

/// The "action" of a device trace event.
enum class Action : std::uint8_t {
  alloc,
  free_requested,
  free_completed,
  segment_alloc,
  segment_free,
  segment_map,
  segment_unmap,
  snapshot,
  oom,
};
const char* to_string(Action action) noexcept;
bool parse_action(std::string_view name, Action& out) noexcept;

struct Frame {
  std::string name;
  std::string filename;
  std::int64_t line = 0;
  /// "name (filename:line)".
  std::string label() const;
};

/// Which frame of a stack names an event. PyTorch's C++ stacks start with the unwinder
/// ("torch::unwind::unwind()") for every event, so the literal top frame says nothing; the
/// default takes the innermost Python frame (filename ending in ".py"). Stacks without one (the
/// backward pass runs in autograd's C++ threads) are named by their innermost autograd node
/// ("torch::autograd::generated::MmBackward0::apply") or else their innermost operator
/// ("at::_ops::mm::call"), without the argument list; the top frame is the last resort.
enum class FrameChoice : std::uint8_t { none, top, first_python };

struct ReadOptions {
  FrameChoice frame = FrameChoice::first_python;
};

struct TraceEntry {
  Action action = Action::alloc;
  std::uint64_t addr = 0;  // 0 when absent (oom events have none)
  std::uint64_t size = 0;  // requested bytes for alloc/free, segment bytes for segment_*
  std::uint64_t stream = 0;
  std::optional<std::int64_t> time_us;
  std::optional<Frame> frame;  // the frame chosen by ReadOptions::frame
};

struct Block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;            // bytes of the block (rounded)
  std::uint64_t requested_size = 0;  // bytes asked for; `size` when the snapshot has none
  std::string state;                 // "active_allocated", "active_pending_free", "inactive"
  bool address_computed = false;     // the snapshot had no address: segment address + sizes
  std::optional<Frame> frame;
  /// active_allocated or active_pending_free.
  bool live() const noexcept;
};

struct Segment {
  std::uint32_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t allocated_size = 0;
  std::uint64_t active_size = 0;
  std::uint64_t requested_size = 0;
  std::uint64_t stream = 0;
  std::string segment_type;  // "large" or "small"
  bool is_expandable = false;
  /// PyTorch's MempoolId_t of the pool holding the segment: (0, 0) for the default pool, else a
  /// private pool (a CUDA graph's, or a torch.cuda.MemPool's).
  std::pair<std::int64_t, std::int64_t> pool_id{0, 0};
  std::vector<Block> blocks;
  bool small_pool() const noexcept { return segment_type == "small"; }
  bool private_pool() const noexcept { return pool_id != std::pair<std::int64_t, std::int64_t>{0, 0}; }
  /// The tag an allocation in a private pool is imported under (kFlagTagged): "pytorch-pool:A,B".
  std::string pool_tag() const;
};

struct Snapshot {
  std::vector<Segment> segments;                       // at dump time (the window's end)
  std::vector<std::vector<TraceEntry>> device_traces;  // one list per device
  std::vector<std::string> allocator_settings;         // "key=value"; nested dicts as "a.b=value"
};

/// Reads a snapshot from a parsed pickle; throws SnapshotError naming the path of a bad value.
/// The root may also be the bare list of segments that torch.cuda.memory_snapshot() returns
/// (no device traces: seeds only).
Snapshot read_snapshot(const pickle::Value& root, const ReadOptions& options = {});
/// Loads and reads a snapshot file (pickle::ParseError for a malformed pickle).
Snapshot load_snapshot(const std::filesystem::path& file, const ReadOptions& options = {});

/// True when a device's window has no alloc, free_requested or segment event.
bool is_state_only(const std::vector<TraceEntry>& device_trace) noexcept;

/// Converts a snapshot to a trace (see the rules at the top of this file). `name` is the file
/// name for TraceInfo::source ("pytorch-snapshot:<name>") and for errors. Throws SnapshotError
/// (path "device_traces[D][I]") when the segment events contradict the final segments.
Trace to_trace(const Snapshot& snapshot, std::string_view name);

/// load_snapshot() + to_trace() with the file's name.
Trace import_snapshot(const std::filesystem::path& file, const ReadOptions& options = {});

}  // namespace tensorpool::trace::pytorch

// tensorpool/trace/event.hpp: the events of an allocation trace, shared by every trace reader,
// writer, importer and the replay engine.
//
// A trace is a window of a run on one or more devices. Addresses are the trace's own (the
// recording process's pointers); the replay engine maps them to live pointers. Seed events come
// first and describe the state at the window's start: segments the recording allocator already
// held and blocks already live.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tensorpool::trace {

enum class Op : std::uint8_t {
  alloc = 0,           // addr, size (requested bytes), stream
  free_requested = 1,  // addr, size
  free_completed = 2,  // addr, size: the block became reusable (after stream events)
  record_stream = 3,   // addr: block used on `stream` as well
  stream_sync = 4,     // stream: host waited for the stream (all its work completed)
  iteration = 5,       // size: iteration number (training step marker)
  segment_alloc = 6,   // recording allocator's own events (the measured baseline): addr, size
  segment_free = 7,
  segment_map = 8,     // expandable segments: pages mapped at addr, size bytes
  segment_unmap = 9,
  oom = 10,            // size: the request that failed in the recording run
  seed_segment = 11,   // a segment held at window start: addr, size, stream; flags: kFlagSmallPool
  seed_alloc = 12,     // a block live at window start: addr, size, stream
  empty_cache = 13,    // the program called empty_cache(): the recording allocator returned its
                       // free cached segments (the segment_free events right after this one)
  sleep = 14,          // the program put memory to sleep, or woke it (flags: kFlagWake,
                       // kFlagKeepContents); label: the tag (0: all memory); size: the bytes
                       // the recording allocator released (sleep) or mapped back (wake)
  graph_pool = 15,     // a CUDA graph's private pool (flags: kGraphCaptureBegin/End/Release):
                       // addr: the pool's id; stream: the captured stream; size: the reserve
};
inline constexpr int kNumOps = 16;

const char* to_string(Op op) noexcept;
/// Parses the names printed by to_string(); false if unknown.
bool parse_op(std::string_view name, Op& out) noexcept;

inline constexpr std::uint8_t kFlagSmallPool = 1;   // seed_segment / segment_alloc: small pool
inline constexpr std::uint8_t kFlagExpandable = 2;  // seed_segment: an expandable segment
inline constexpr std::uint8_t kFlagTagged = 4;      // alloc / seed_alloc: label is the Tag the
                                                    // block was allocated under (memory of its own)
inline constexpr std::uint8_t kFlagWake = 1;          // sleep: this is the wake
inline constexpr std::uint8_t kFlagKeepContents = 2;  // sleep: contents kept in host memory
// graph_pool: what happened to the pool (the flags are one of these values).
inline constexpr std::uint8_t kGraphCaptureBegin = 0;  // `stream` is served from the pool from here
inline constexpr std::uint8_t kGraphCaptureEnd = 1;    // ... up to here
inline constexpr std::uint8_t kGraphRelease = 2;       // the graph is gone: the pool goes once empty

/// One event of a trace. (Named apart from the device's event handles of device.hpp and the
/// allocator's observer events of hooks.hpp.)
struct TraceEvent {
  Op op = Op::alloc;
  std::uint8_t flags = 0;
  std::uint16_t device = 0;
  std::uint32_t label = 0;  // index into the trace's label table; 0 = no label
  std::uint64_t stream = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::int64_t time_us = 0;  // microseconds; monotone per device when the source has times

  friend bool operator==(const TraceEvent&, const TraceEvent&) = default;
};

/// Facts about the recording that are not events.
struct TraceInfo {
  std::string source;                 // e.g. "pytorch-snapshot:foo.pickle", "rmm-log:x.csv"
  std::vector<std::string> metadata;  // "key=value" lines (allocator settings, ...)
};

/// A whole trace in memory. Label 0 is always "" (no label).
struct Trace {
  TraceInfo info;
  std::vector<std::string> labels{""};
  std::vector<TraceEvent> events;
  std::unordered_map<std::string, std::uint32_t> label_ids;  // inverse of labels (without "")

  /// Interns `text` in the label table and returns its index (0 for "").
  std::uint32_t intern(std::string_view text);
};

}  // namespace tensorpool::trace

// tensorpool/record.hpp: live trace recording of allocators (library tensorpool::record), so
// that a real job recorded once can be replayed, compared and debugged offline.
//
//   tensorpool::Recording rec = tensorpool::start_recording(alloc, "job.tptrace");
//   ... the program runs ...
//   rec.stop();  // or let rec go out of scope: job.tptrace is complete
//
// or, without code changes, TENSORPOOL_TRACE=job.tptrace and attach_recording_from_env(alloc)
// (the per-device registry calls it for every allocator it creates). docs/recording.md.
//
// Every observer event of the allocator (alloc, record_stream, free_requested, free_completed,
// segment_alloc/free, segment_map/unmap, oom, empty_cache) becomes one trace event, in the
// current format version (an empty_cache op follows the segment frees of what it released, as
// the allocator reports it). The observer only copies the event into a per-allocator ring
// buffer; a writer thread encodes and writes batches, so the allocator's lock is never held for
// I/O. After each batch the writer hands the bytes to the OS with a checkpoint record, so a
// process that is killed leaves a file that trace::ReadOptions::allow_truncated reads up to its
// last batch, verified by CRC-32.
//
// While recording, the data goes to PATH.<pid>.partial; stop() completes the file and renames it
// to PATH ("%p" in PATH is replaced by the process id, for jobs of several processes). The
// format follows the name: .tptrace (binary, the default for any other name), .jsonl, or .csv
// for RMM's logging_resource_adaptor log (alloc, free and failures only).
//
// Errors never disturb the allocator: start_recording() throws Error if the file cannot be
// created, and a write that fails later (a full disk) reports ONE error (RecordingOptions::
// on_error, by default the "tensorpool" logger), removes the partial file and stops recording
// while the allocator goes on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tensorpool/allocator.hpp"

namespace tensorpool {

namespace detail {
class Recorder;
}

enum class RecordingFormat : std::uint8_t {
  from_name,  // .csv: rmm_log; .jsonl: jsonl; anything else: binary
  binary,     // .tptrace (docs/trace-format.md), with checkpoints
  jsonl,      // JSON lines
  rmm_log,    // RMM's CSV log (trace/rmm_log_writer.hpp)
};

struct RecordingOptions {
  RecordingFormat format = RecordingFormat::from_name;
  /// The longest an event waits in memory before the writer thread writes it and hands it to
  /// the OS (what a killed process can lose).
  std::chrono::milliseconds flush_interval{100};
  /// Events each recorded allocator buffers (rounded up to a power of two, at least 64). If the
  /// writer falls this far behind, the allocating thread waits for it: a trace has no holes.
  std::size_t buffer_events = std::size_t{1} << 16;
  /// Called once, with the message, when an error stops the recording; from the writer thread.
  /// Empty: the message is logged as an error on the "tensorpool" logger.
  std::function<void(const std::string&)> on_error;
};

struct RecordingStatus {
  bool active = false;     // events are being recorded
  bool failed = false;     // an error stopped the recording (error says which)
  std::string error;
  std::uint64_t events_recorded = 0;  // events taken from the allocators so far
  std::uint64_t events_written = 0;   // of those, written to the file and handed to the OS
  std::uint64_t events_dropped = 0;   // observed after a failure or during stop(), not recorded
  std::string path;       // the final name
  std::string temp_path;  // where the data is until stop() ("" once complete or failed)
};

/// A recording in progress (or finished). Move-only; the destructor calls stop().
class Recording {
 public:
  Recording() = default;
  Recording(Recording&&) noexcept;
  Recording& operator=(Recording&&) noexcept;
  ~Recording();

  /// Records `alloc` too, into the same file, as trace device `device` (-1: the allocator's
  /// device ordinal). As with start_recording(), the live state of `alloc` becomes seed events.
  void attach(Allocator& alloc, int device = -1);
  /// Blocks until every event recorded so far is in the file and handed to the OS. False if
  /// the recording failed (or is stopped).
  bool flush();
  /// Detaches from the allocators, writes what is buffered and completes the file. Idempotent;
  /// false if the recording failed. Call it before destroying an allocator it records.
  bool stop();
  RecordingStatus status() const;

  explicit operator bool() const noexcept { return recorder_ != nullptr; }

 private:
  friend Recording start_recording(Allocator&, const std::string&, RecordingOptions);
  friend bool attach_recording_from_env(Allocator&);
  explicit Recording(std::shared_ptr<detail::Recorder> recorder);

  std::shared_ptr<detail::Recorder> recorder_;
};

/// Starts recording `alloc` to `path` (see the top of this file). The allocator's live segments
/// and blocks become the trace's seed events; attach while no other thread uses the allocator,
/// or calls made during attach may be missing. Throws Error if the file cannot be created
/// (the message names it) and ConfigError for a bad option.
Recording start_recording(Allocator& alloc, const std::string& path, RecordingOptions options = {});

/// The trace device of the first allocator attach_recording_from_env() meets on a device that
/// it already records; the next such allocator gets the next number, and so on.
inline constexpr int kFirstDuplicateTraceDevice = 256;

/// The environment hook: if TENSORPOOL_TRACE is set, records `alloc` into the process-wide
/// recording of that path (created by the first call, one file for every allocator, each as
/// its device ordinal, or from kFirstDuplicateTraceDevice on for a second allocator of a device;
/// completed at exit or by stop_recording_from_env()). The per-device registry and the C API
/// call it for every allocator they create. Returns true if `alloc` is now recorded. Never
/// throws: a file that cannot be created is logged once, and the process runs on unrecorded.
/// The recording never calls the allocator after attaching, so allocators may be destroyed at
/// any time (their events simply end; each attached allocator keeps its buffer, about 4 MiB,
/// until the recording stops).
bool attach_recording_from_env(Allocator& alloc);
/// Completes the process-wide TENSORPOOL_TRACE recording now (registered with atexit).
void stop_recording_from_env() noexcept;

}  // namespace tensorpool

// record/recorder.hpp (internal): the machinery behind tensorpool::Recording.
//
// One Recorder per file: a writer thread and a sink (the native trace writer or the RMM log
// writer), fed by one Tap per recorded allocator. A Tap is the allocator's Observer: it copies
// each event into its EventRing and, every half ring, wakes the writer. The writer wakes at least
// every flush_interval, drains the rings, converts the events and writes them, then checkpoints
// (hands the bytes to the OS). Only the writer thread touches the sink after construction.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "record/event_ring.hpp"
#include "tensorpool/record.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::detail {

/// Where the events go (record/sinks.cpp). Methods throw Error on an I/O failure.
class RecordSink {
 public:
  virtual ~RecordSink() = default;  // removes the temporary file unless finish() succeeded
  /// `thread`: the OS thread that made the call (RMM's log names it).
  virtual void write(const trace::TraceEvent& event, std::uint64_t thread) = 0;
  virtual void checkpoint() = 0;
  virtual void finish() = 0;
  virtual const std::string& temp_path() const noexcept = 0;
};

/// Opens the sink for `path` in `format` (from_name: by the name). Throws Error.
std::unique_ptr<RecordSink> open_sink(const std::string& path, RecordingFormat format,
                                      const trace::TraceInfo& info);

/// Whether to_trace_event left a tag's process-wide id in e.label (a tagged alloc, a sleep or
/// wake of a tag) for the sink to name: the writer's label table is the sink's.
inline bool carries_tag(const trace::TraceEvent& e) noexcept {
  return e.label != 0 && (e.op == trace::Op::sleep || (e.op == trace::Op::alloc && (e.flags & trace::kFlagTagged)));
}
/// The trace event of an observed allocator event; nullopt for events the format has no op for.
std::optional<trace::TraceEvent> to_trace_event(const AllocatorEvent& e, std::uint16_t device,
                                                std::uint64_t started_ns) noexcept;

/// What the taps and the writer thread share: the lock and condition of every wait.
struct RecorderSignal {
  std::mutex mutex;
  std::condition_variable wake_writer;  // work for the writer (a half-full ring, flush, stop)
  std::condition_variable batch_done;   // the writer finished a batch (flush() waits on it)
  bool pending = false;                 // guarded by mutex: wake_writer was signalled

  void notify_writer();
};

class Recorder {
 public:
  /// Opens `path` (throws Error, ConfigError for bad options) and starts the writer thread.
  /// `first` provides the header's metadata; it is not attached yet.
  Recorder(const std::string& path, RecordingOptions options, const Allocator& first);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Records `alloc` as trace device `device` (-1: its ordinal), its live state as seeds.
  /// `detach_on_stop`: stop() removes the observer (the allocator must then outlive stop()).
  void attach(Allocator& alloc, int device, bool detach_on_stop);
  bool flush();
  bool stop();
  RecordingStatus status() const;

 private:
  class Tap;

  void run() noexcept;
  /// Writes `seeds` and what the taps hold; finishes the file if `final`. False after a failure.
  bool write_batch(const std::vector<trace::TraceEvent>& seeds,
                   const std::vector<std::shared_ptr<Tap>>& taps, bool final) noexcept;
  void fail(const std::string& message) noexcept;

  const RecordingOptions options_;
  const std::string path_;
  const std::uint64_t started_ns_;  // steady clock: trace time 0
  const std::shared_ptr<RecorderSignal> signal_;
  std::unique_ptr<RecordSink> sink_;      // writer thread only; null once failed or finished
  std::vector<ObservedEvent> batch_;      // writer thread only: events popped from a ring

  // Guarded by signal_->mutex.
  std::vector<std::shared_ptr<Tap>> taps_;
  std::vector<trace::TraceEvent> pending_seeds_;  // written before any event of their tap
  std::uint64_t flush_requested_ = 0;        // flush() calls so far
  std::uint64_t flush_done_ = 0;             // flush_requested_ when the last batch began
  bool stopping_ = false;
  bool writer_done_ = false;
  bool stopped_ = false;
  std::string error_;
  std::string temp_path_;

  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> events_written_{0};
  std::thread writer_;  // last: started once everything above is ready
};

}  // namespace tensorpool::detail

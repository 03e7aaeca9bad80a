// sinks.cpp: what the recorder writes. Observed allocator events become trace events; the native
// sink writes them with trace::TraceWriter (checkpoints after each batch), the RMM sink as the
// lines of RMM's logging_resource_adaptor log (allocations, frees and failures only).
#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <ctime>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "record/recorder.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/rmm_log_writer.hpp"

namespace tensorpool::detail {

namespace {

using trace::Op;

bool ends_with_lower(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (std::size_t i = 0; i < suffix.size(); ++i) {
    const char c = s[s.size() - suffix.size() + i];
    if (std::tolower(static_cast<unsigned char>(c)) != suffix[i]) return false;
  }
  return true;
}

RecordingFormat resolve(RecordingFormat format, const std::string& path) {
  if (format != RecordingFormat::from_name) return format;
  if (ends_with_lower(path, ".csv")) return RecordingFormat::rmm_log;
  if (ends_with_lower(path, ".jsonl")) return RecordingFormat::jsonl;
  return RecordingFormat::binary;
}

/// The data's name until the recording completes: next to the target, one per process.
std::string partial_name(const std::string& path) { return fmt::format("{}.{}.partial", path, ::getpid()); }

class NativeSink final : public RecordSink {
 public:
  NativeSink(const std::string& path, trace::Format format, const trace::TraceInfo& info)
      : writer_(trace::TraceWriter::open(path, format, info,
                                         trace::WriteOptions{partial_name(path)})) {}
  void write(const trace::TraceEvent& event, std::uint64_t /*thread*/) override {
    if (!carries_tag(event)) return writer_->write(event);
    trace::TraceEvent named = event;  // its label holds a tag id (to_trace_event): name it here
    named.label = writer_->intern(tag_name(static_cast<std::uint16_t>(event.label)));
    writer_->write(named);
  }
  void checkpoint() override { writer_->checkpoint(); }
  void finish() override { writer_->finish(); }
  const std::string& temp_path() const noexcept override { return writer_->temp_path(); }

 private:
  std::unique_ptr<trace::TraceWriter> writer_;
};

/// Microseconds since local midnight now, the clock RMM's log prints.
std::int64_t local_time_of_day_us() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
                  1'000'000;
  return (static_cast<std::int64_t>(tm.tm_hour) * 3600 + tm.tm_min * 60 + tm.tm_sec) * 1'000'000 + us;
}

class RmmSink final : public RecordSink {
 public:
  explicit RmmSink(const std::string& path)
      : writer_(trace::rmm::LogWriter::open(path, trace::WriteOptions{partial_name(path)})),
        clock_at_start_us_(local_time_of_day_us()) {}

  void write(const trace::TraceEvent& e, std::uint64_t thread) override {
    trace::rmm::LogEntry entry;
    switch (e.op) {
      case Op::alloc: entry.action = trace::rmm::Action::allocate; break;
      case Op::free_requested: entry.action = trace::rmm::Action::free; break;
      case Op::oom: entry.action = trace::rmm::Action::allocate_failure; break;
      default: return;  // RMM's log has no such line
    }
    entry.thread = thread;
    entry.time_us = clock_at_start_us_ + e.time_us;
    entry.pointer = e.addr;
    entry.size = e.size;
    entry.stream = e.stream;
    writer_->write(entry);
  }
  void checkpoint() override { writer_->checkpoint(); }
  void finish() override { writer_->finish(); }
  const std::string& temp_path() const noexcept override { return writer_->temp_path(); }

 private:
  std::unique_ptr<trace::rmm::LogWriter> writer_;
  const std::int64_t clock_at_start_us_;  // trace time 0 on the local clock
};

}  // namespace

std::unique_ptr<RecordSink> open_sink(const std::string& path, RecordingFormat format,
                                      const trace::TraceInfo& info) {
  switch (resolve(format, path)) {
    case RecordingFormat::rmm_log: return std::make_unique<RmmSink>(path);
    case RecordingFormat::jsonl: return std::make_unique<NativeSink>(path, trace::Format::jsonl, info);
    default: return std::make_unique<NativeSink>(path, trace::Format::binary, info);
  }
}

std::optional<trace::TraceEvent> to_trace_event(const AllocatorEvent& e, std::uint16_t device,
                                                std::uint64_t started_ns) noexcept {
  const trace::TraceEvent at{
      .device = device,
      .stream = e.stream,
      .addr = e.address,
      .time_us = e.time_ns > started_ns ? static_cast<std::int64_t>((e.time_ns - started_ns) / 1000) : 0};
  const auto with = [&at](Op op, std::uint64_t size) {
    trace::TraceEvent out = at;
    out.op = op;
    out.size = size;
    return out;
  };
  const auto graph_pool = [&](std::uint8_t what, std::uint64_t size) {
    trace::TraceEvent out = with(Op::graph_pool, size);
    out.flags = what;
    return out;
  };
  const auto sleep = [&](std::uint8_t flags) {
    trace::TraceEvent out = with(Op::sleep, e.size);
    out.addr = 0;
    out.stream = 0;
    out.flags = flags;
    out.label = e.tag;  // the sink names it
    return out;
  };
  switch (e.type) {
    case EventType::alloc: {
      trace::TraceEvent out = with(Op::alloc, e.requested);
      if (e.tag != 0) {  // the sink names it
        out.flags = trace::kFlagTagged;
        out.label = e.tag;
      }
      return out;
    }
    case EventType::free_requested: return with(Op::free_requested, e.requested);
    case EventType::free_completed: return with(Op::free_completed, e.requested);
    case EventType::record_stream: return with(Op::record_stream, 0);
    case EventType::segment_alloc: return with(Op::segment_alloc, e.size);
    case EventType::segment_free: return with(Op::segment_free, e.size);
    case EventType::segment_map: return with(Op::segment_map, e.size);
    case EventType::segment_unmap: return with(Op::segment_unmap, e.size);
    case EventType::oom: {
      trace::TraceEvent out = with(Op::oom, e.requested);
      out.addr = 0;
      return out;
    }
    // After the segment_free (segment_unmap) events of what it released: the allocator reports
    // the call once it has run. The trace op has no fields.
    case EventType::empty_cache: return trace::TraceEvent{.op = Op::empty_cache, .device = at.device, .time_us = at.time_us};
    case EventType::sleep: return sleep(e.requested != 0 ? trace::kFlagKeepContents : 0);
    case EventType::wake: return sleep(trace::kFlagWake);
    case EventType::capture_begin: return graph_pool(trace::kGraphCaptureBegin, e.size);
    case EventType::capture_end: return graph_pool(trace::kGraphCaptureEnd, 0);
    case EventType::graph_release: {
      trace::TraceEvent out = graph_pool(trace::kGraphRelease, 0);
      out.stream = 0;
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace tensorpool::detail

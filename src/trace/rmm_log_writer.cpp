// Writes RMM's logging_resource_adaptor CSV (tensorpool/trace/rmm_log_writer.hpp), through the
// same temporary-file sink as the native trace writers.
#include "tensorpool/trace/rmm_log_writer.hpp"

#include <fmt/format.h>

#include <iterator>
#include <utility>

#include "trace/format_io.hpp"

namespace tensorpool::trace::rmm {

namespace {

constexpr std::int64_t kSecondUs = 1'000'000;
constexpr std::int64_t kDayUs = 86'400 * kSecondUs;

/// One CSV line of `e`, with its line end.
std::string format_line(const LogEntry& e) {
  std::int64_t t = e.time_us % kDayUs;
  if (t < 0) t += kDayUs;
  const std::int64_t seconds = t / kSecondUs;
  std::string line;
  auto out = std::back_inserter(line);
  fmt::format_to(out, "{},{:02}:{:02}:{:02}.{:06},{},", e.thread, seconds / 3600, seconds / 60 % 60,
                 seconds % 60, t % kSecondUs, to_string(e.action));
  if (e.pointer == 0) {
    line += "(nil)";
  } else {
    fmt::format_to(out, "0x{:x}", e.pointer);
  }
  if (e.stream == 0) {
    fmt::format_to(out, ",{},0\n", e.size);
  } else {
    fmt::format_to(out, ",{},0x{:x}\n", e.size, e.stream);
  }
  return line;
}

}  // namespace

LogWriter::LogWriter(std::unique_ptr<detail::FileSink> sink) : sink_(std::move(sink)) {
  sink_->put("Thread,Time,Action,Pointer,Size,Stream\n");
}

LogWriter::~LogWriter() = default;  // ~FileSink removes the temporary unless committed

std::unique_ptr<LogWriter> LogWriter::open(const std::string& path, const WriteOptions& options) {
  return std::unique_ptr<LogWriter>(
      new LogWriter(std::make_unique<detail::FileSink>(path, options.temp_path)));
}

template <class Step>
void LogWriter::guarded(Step&& step) {
  if (failed_ || finished_) {
    throw Error(fmt::format("RMM log writer for '{}': {}", sink_->target(),
                            finished_ ? "already finished" : "unusable after an error"));
  }
  detail::write_or_discard(*sink_, failed_, std::forward<Step>(step));
}

void LogWriter::write(const LogEntry& entry) {
  guarded([&] {
    sink_->put(format_line(entry));
    ++entries_;
  });
}

void LogWriter::checkpoint() {
  guarded([&] { sink_->flush_to_os(); });
}

void LogWriter::finish() {
  guarded([&] {
    sink_->commit();
    finished_ = true;
  });
}

const std::string& LogWriter::path() const noexcept { return sink_->target(); }
const std::string& LogWriter::temp_path() const noexcept { return sink_->temp_path(); }

}  // namespace tensorpool::trace::rmm

// tensorpool/trace/rmm_log.hpp: imports the CSV logs of RMM's logging_resource_adaptor.
//
// The format (rmm/src/mr/detail/logging_resource_adaptor_impl.cpp): a header line
// "Thread,Time,Action,Pointer,Size,Stream", then one line per call written with the spdlog pattern
// "%t,%H:%M:%S.%f,%v": a decimal thread id, the wall-clock time "18:19:50.427419" (RMM's replay
// benchmark documents "18:19:50:427419": both separators are read, as is "1634567890.123456",
// seconds since the epoch, shown in RMM's user guide), the action ("allocate", "free" or
// "allocate failure"; "deallocate" is read as "free"), the pointer printed by %p ("0x7f..." or
// "(nil)"), the size in decimal bytes and the stream in hex ("0" for the default stream).
// A trailing newline, blank lines and CRLF line ends are tolerated.
//
// Conversion: allocate -> alloc; free -> free_requested then free_completed; a failure -> oom.
// Every event is on one device (ConvertOptions::device): RMM logs do not name it. Times are made
// non-decreasing (threads interleave by a few microseconds) and continue past midnight. A pointer
// freed before the log allocates it becomes a seed_alloc (the log began mid-run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::trace::rmm {

/// A malformed log line. what() reads "FILE:LINE:COLUMN: FIELD: reason", e.g.
/// "log.csv:7:31: Size: expected a decimal byte count, got '12x'".
class LogError : public Error {
 public:
  LogError(std::string source, std::size_t line, std::size_t column, std::string field,
           std::string reason);
  const std::string& source() const noexcept { return source_; }
  std::size_t line() const noexcept { return line_; }           // 1-based
  std::size_t column() const noexcept { return column_; }       // 1-based, start of the field
  const std::string& field() const noexcept { return field_; }  // "" for whole-line errors
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string source_;
  std::size_t line_;
  std::size_t column_;
  std::string field_;
  std::string reason_;
};

enum class Action : std::uint8_t { allocate, free, allocate_failure };
const char* to_string(Action action) noexcept;  // the log's spelling

struct LogEntry {
  std::uint64_t thread = 0;
  std::int64_t time_us = 0;  // since midnight of the first line's day (or the epoch)
  Action action = Action::allocate;
  std::uint64_t pointer = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::size_t line = 0;  // 1-based line in the file
};

/// Parses a whole log; `source` names it in errors.
std::vector<LogEntry> parse_log(std::string_view text, std::string_view source);
/// Reads and parses a log file (errors name the path as given).
std::vector<LogEntry> load_log(const std::filesystem::path& file);

struct ConvertOptions {
  std::uint16_t device = 0;
};

/// Converts parsed entries; `name` goes into TraceInfo::source ("rmm-log:<name>").
Trace to_trace(const std::vector<LogEntry>& entries, std::string_view name,
               const ConvertOptions& options = {});
/// load_log() + to_trace() with the file's name.
Trace import_log(const std::filesystem::path& file, const ConvertOptions& options = {});

}  // namespace tensorpool::trace::rmm

// tensorpool/trace/rmm_log_writer.hpp: writes the CSV log of RMM's logging_resource_adaptor, the
// format tensorpool/trace/rmm_log.hpp reads (and RMM's own replay tools take).
//
// A header line "Thread,Time,Action,Pointer,Size,Stream", then one line per entry: the thread id
// in decimal, the clock time "HH:MM:SS.ffffff" (LogEntry::time_us modulo a day), the action
// ("allocate", "free", "allocate failure"), the pointer as %p prints it ("0x7f..." or "(nil)"),
// the size in decimal and the stream in hex ("0" for the default stream).
//
// Like TraceWriter, the data goes to a temporary file that finish() renames to the target (a
// device or a FIFO is written in place), and checkpoint() hands what was written to the OS.
#pragma once

#include <memory>
#include <string>

#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/rmm_log.hpp"

namespace tensorpool::trace {
namespace detail {
class FileSink;
}

namespace rmm {

class LogWriter {
 public:
  /// Creates the temporary file and writes the header line. Throws Error if it cannot.
  static std::unique_ptr<LogWriter> open(const std::string& path, const WriteOptions& options = {});
  ~LogWriter();
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  /// Appends one line (LogEntry::line is ignored). Throws Error on an I/O error; the writer is
  /// then unusable.
  void write(const LogEntry& entry);
  /// Hands every line written so far to the OS. Throws Error.
  void checkpoint();
  /// Flushes, syncs and renames the file to its target. Throws Error.
  void finish();

  const std::string& path() const noexcept;
  const std::string& temp_path() const noexcept;
  std::uint64_t entries_written() const noexcept { return entries_; }

 private:
  explicit LogWriter(std::unique_ptr<detail::FileSink> sink);
  template <class Step>
  void guarded(Step&& step);

  std::unique_ptr<detail::FileSink> sink_;  // never null
  std::uint64_t entries_ = 0;
  bool failed_ = false;
  bool finished_ = false;
};

}  // namespace rmm
}  // namespace tensorpool::trace

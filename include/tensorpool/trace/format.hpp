// tensorpool/trace/format.hpp: reading and writing traces in tensorpool's native formats.
//
// Two formats carry the same content (TraceInfo, a label table, the events of trace/event.hpp):
//   - binary ".tptrace": compact, versioned, checksummed (docs/trace-format.md gives the layout);
//   - JSON lines ".jsonl": one header object, then one object per event, for humans and for other
//     tools that produce traces.
// Both are streamed: a reader or writer holds one buffer and the label table, never the events,
// so a trace of any length is read or written in memory independent of its event count.
//
// Errors: a malformed file throws TraceFormatError (file, byte offset or line, what was expected);
// an I/O failure (cannot open, read or write) throws tensorpool::Error.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::trace {

namespace detail {
class FileSource;  // buffered input (src/trace/format_io.hpp)
class FileSink;    // buffered output to a temporary file (src/trace/format_io.hpp)
}  // namespace detail

enum class Format : std::uint8_t {
  binary = 0,  // ".tptrace"
  jsonl = 1,   // ".jsonl"
};

/// "binary" or "jsonl".
const char* to_string(Format format) noexcept;

/// The format a file name asks for: ".tptrace" or ".jsonl"; throws Error for any other name.
Format format_from_extension(const std::string& path);

/// The version of each format this library writes, and the newest it reads.
/// Version 2 added the op empty_cache, version 3 the ops sleep and graph_pool; older files are
/// read as well (version 1: ops 0..12; version 2: ops 0..13).
inline constexpr std::uint32_t kBinaryFormatVersion = 3;
inline constexpr std::uint32_t kJsonlFormatVersion = 3;
inline constexpr int kOpsInVersion1 = 13;
inline constexpr int kOpsInVersion2 = 14;
/// The ops a file of `version` may hold (0..ops_in_version(version) - 1).
constexpr int ops_in_version(std::uint32_t version) noexcept {
  return version <= 1 ? kOpsInVersion1 : version == 2 ? kOpsInVersion2 : kNumOps;
}

/// A trace file that is not what its format says: the message names the file, where (byte offset
/// for binary files, line number for JSON lines) and what was expected there.
class TraceFormatError : public Error {
 public:
  enum class Where : std::uint8_t { byte, line };

  TraceFormatError(std::string file, Where where, std::uint64_t position, std::string problem);

  const std::string& file() const noexcept { return file_; }
  Where where() const noexcept { return where_; }
  /// The byte offset (Where::byte) or the 1-based line number (Where::line).
  std::uint64_t position() const noexcept { return position_; }
  /// The message without the file and position.
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string file_;
  Where where_;
  std::uint64_t position_;
  std::string problem_;
};

struct ReadOptions {
  /// Accept a file that ends early, such as a live recording cut by a crash or a kill: next()
  /// returns false where the file is cut and truncation() says where and what was cut. Only the
  /// end of the file is forgiven (an incomplete last record, a missing end record or, in JSON
  /// lines, an unfinished last line); every other error is thrown as in the strict mode, and a
  /// file cut inside its header still fails to open.
  bool allow_truncated = false;
};

/// How a file read with ReadOptions::allow_truncated ended early.
struct Truncation {
  std::uint64_t position = 0;  // byte offset (binary) or line (JSON lines) of the cut record
  std::uint64_t file_bytes = 0;      // the size of the file
  std::uint64_t events = 0;          // events before the cut, all returned by next()
  /// The last checkpoint record (binary files of a live recording, docs/trace-format.md): the
  /// first verified_events events, the file's first verified_bytes bytes, passed its CRC-32.
  std::uint64_t verified_events = 0;
  std::uint64_t verified_bytes = 0;
  std::string problem;  // the strict reader's error message
};

class TraceReader;
namespace detail {
/// TraceReader::open on an opened source (src/trace/format.cpp; load.cpp uses it too).
std::unique_ptr<TraceReader> open_reader(std::unique_ptr<FileSource> source, const ReadOptions& options);
}  // namespace detail

/// Streams the events of a trace file, in file order.
class TraceReader {
 public:
  /// Opens `path` and reads its header; the format is chosen from the file's first bytes (the
  /// binary magic, or '{' for JSON lines), not from its name.
  static std::unique_ptr<TraceReader> open(const std::string& path);
  static std::unique_ptr<TraceReader> open(const std::string& path, const ReadOptions& options);

  virtual ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  /// Reads the next event into `out`; false at the clean end of the trace (and on every later
  /// call). `out.label` is always a defined label id. Throws TraceFormatError on a malformed file
  /// (Error on a read error); after an exception every later call throws the same exception.
  bool next(TraceEvent& out);

  Format format() const noexcept { return format_; }
  const std::string& path() const noexcept { return path_; }
  const TraceInfo& info() const noexcept { return info_; }

  /// The text of label `id` (0 is ""); ids grow as the reader meets definitions. Throws Error for
  /// an id not defined yet.
  const std::string& label(std::uint32_t id) const;
  /// The labels defined so far, indexed by id; labels()[0] == "".
  const std::vector<std::string>& labels() const noexcept { return labels_; }
  std::uint64_t events_read() const noexcept { return events_read_; }

  /// Bytes consumed so far (both formats), for error messages and progress.
  std::uint64_t offset() const noexcept;
  /// The number of the line read last (JSON lines); 0 for binary files.
  virtual std::uint64_t line() const noexcept { return 0; }

  /// Set once next() has returned false at a cut, with ReadOptions::allow_truncated.
  const std::optional<Truncation>& truncation() const noexcept { return truncation_; }

 protected:
  TraceReader(std::unique_ptr<detail::FileSource> source, Format format);

  /// Called by a format just before it throws the error of a file that ends early, so that the
  /// tolerant mode ends the trace there instead.
  void mark_cut() noexcept { cut_ = true; }
  /// Called by a format after verifying a checkpoint.
  void mark_verified(std::uint64_t events, std::uint64_t bytes) noexcept {
    verified_events_ = events;
    verified_bytes_ = bytes;
  }

  /// The format's next(): the next event, or false at the end (checked). Called until it returns
  /// false or throws, never after.
  virtual bool read_next(TraceEvent& out) = 0;

  std::unique_ptr<detail::FileSource> source_;  // never null
  std::string path_;
  Format format_;
  TraceInfo info_;
  std::vector<std::string> labels_{""};
  std::uint64_t events_read_ = 0;

 private:
  friend std::unique_ptr<TraceReader> detail::open_reader(std::unique_ptr<detail::FileSource>,
                                                         const ReadOptions&);
  bool end_at_cut(const TraceFormatError& error);

  ReadOptions options_;  // set once by detail::open_reader
  bool done_ = false;
  bool cut_ = false;  // the error being thrown is that of a file ending early
  std::uint64_t verified_events_ = 0;
  std::uint64_t verified_bytes_ = 0;
  std::optional<Truncation> truncation_;
  std::exception_ptr error_;  // the exception read_next() threw, rethrown by later calls
};

struct WriteOptions {
  /// The name of the temporary file finish() renames to the target ("": TARGET.tmp-<random>).
  /// A live recording names it, so that a process killed before finish() leaves a file one
  /// can find. It is created exclusively all the same.
  std::string temp_path;
};

/// Writes a trace file as a stream of events. The data goes to a temporary file next to `path`
/// that finish() renames to `path`: a failed or abandoned write never leaves a partial file under
/// the target name, and an existing file there stays intact until finish() replaces it. The
/// destructor removes the temporary unless finish() succeeded.
class TraceWriter {
 public:
  /// Creates the temporary file and writes the header. Throws Error if it cannot be created.
  static std::unique_ptr<TraceWriter> open(const std::string& path, Format format,
                                           const TraceInfo& info);
  static std::unique_ptr<TraceWriter> open(const std::string& path, Format format,
                                           const TraceInfo& info, const WriteOptions& options);

  virtual ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  /// The id of label `text` in this file, defining it if new (0 for ""). Ids are handed out
  /// 1, 2, 3... in order of definition.
  std::uint32_t intern(std::string_view text);

  /// Appends `event`, whose `label` must be 0 or an id returned by intern(). Throws Error for an
  /// undefined label id or an op outside Op; the writer is then unusable (finish() throws).
  void write(const TraceEvent& event);
  /// Appends `event` with its label given as text (interned; "" = no label).
  void write(TraceEvent event, std::string_view label_text);

  /// Hands everything written so far to the OS, after a checkpoint record in binary files (the
  /// event count and the CRC-32 of every byte before it): a process killed afterwards leaves a
  /// temporary file that ReadOptions::allow_truncated reads up to here, verified. Throws Error
  /// like write().
  void checkpoint();

  /// Writes the end of the trace, flushes and syncs the file and renames it to path(). Throws
  /// Error on failure, after removing the temporary file.
  void finish();
  /// The file the data goes to until finish() (path() itself for a device or a FIFO).
  const std::string& temp_path() const noexcept;

  Format format() const noexcept { return format_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t events_written() const noexcept { return events_written_; }
  const std::vector<std::string>& labels() const noexcept { return labels_; }

 protected:
  TraceWriter(std::unique_ptr<detail::FileSink> sink, Format format);

  /// Format hooks, each appending to sink_: a new label, a (validated) event, the end of the
  /// trace. A hook that throws leaves the writer failed.
  virtual void on_label(std::uint32_t id, std::string_view text) = 0;
  virtual void on_event(const TraceEvent& event) = 0;
  virtual void on_finish() = 0;
  /// Appends a checkpoint record, in formats that have one.
  virtual void on_checkpoint() {}

  /// Owns the temporary file: its destructor removes it unless committed. Never null.
  std::unique_ptr<detail::FileSink> sink_;
  std::string path_;
  Format format_;
  std::vector<std::string> labels_{""};
  std::uint64_t events_written_ = 0;
  bool failed_ = false;
  bool finished_ = false;

 private:
  void check_usable() const {
    if (finished_ || failed_) [[unlikely]] throw_unusable();
  }
  [[noreturn]] void throw_unusable() const;
  /// Runs `step` (a hook); on any exception marks the writer failed and removes the temporary.
  template <class Step>
  void guarded(Step&& step);

  struct LabelIndex;
  std::unique_ptr<LabelIndex> label_index_;  // text -> id, for intern()
};

/// Reads a whole trace into memory. Label ids are the file's (for binary files, those of the
/// writer; for JSON lines, the order in which labels first appear).
Trace read_trace(const std::string& path);

/// Writes `trace` to `path` in `format` (atomically, like TraceWriter). Every label of the trace's
/// table is defined up front, so a binary file keeps the trace's label ids (duplicate texts in the
/// table are merged); a JSON-lines file keeps only the labels events use.
void write_trace(const std::string& path, const Trace& trace, Format format);

/// Streams `in` (either format) into `out` in `out_format`; memory is independent of the length.
void convert_trace(const std::string& in, const std::string& out, Format out_format);
/// The same with `options`: with allow_truncated, a file that ends early (a killed recording) is
/// converted up to its cut into a complete file, and the truncation is returned.
std::optional<Truncation> convert_trace(const std::string& in, const std::string& out,
                                        Format out_format, const ReadOptions& options);

}  // namespace tensorpool::trace

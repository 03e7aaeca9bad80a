// trace/format_io.hpp (internal): the byte-level pieces shared by the trace formats: buffered
// file input and output (the output goes to a temporary file renamed on commit), CRC-32,
// LEB128 varints and zigzag integers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "tensorpool/trace/format.hpp"

namespace tensorpool::trace::detail {

/// CRC-32 (IEEE 802.3, the zlib/PNG one) of `n` bytes, continuing from `crc` (0 to start).
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) noexcept;

/// The 8 bytes every .tptrace file starts with (PNG-style: a non-ASCII byte, then CR LF, ^Z, LF,
/// so text-mode transfers that rewrite line ends are detected).
inline constexpr std::uint8_t kBinaryMagic[8] = {0x89, 'T', 'P', 'T', '\r', '\n', 0x1A, '\n'};

/// The most bytes one LEB128 varint of a 64-bit value takes.
inline constexpr std::size_t kMaxVarintBytes = 10;

inline std::uint64_t zigzag(std::int64_t v) noexcept {
  // C++20: >> of a negative value is arithmetic, so the mask is all ones for v < 0.
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t unzigzag(std::uint64_t z) noexcept {
  return static_cast<std::int64_t>((z >> 1) ^ (0 - (z & 1)));
}

/// Writes `v` as LEB128 at `p` (room for kMaxVarintBytes); returns the byte after it.
inline std::uint8_t* put_varint(std::uint8_t* p, std::uint64_t v) noexcept {
  while (v >= 0x80) {
    *p++ = static_cast<std::uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<std::uint8_t>(v);
  return p;
}

/// Buffered reading of a file, with the absolute offset of every byte and, on request, the CRC-32
/// of the bytes consumed so far. Memory: one fixed buffer.
class FileSource {
 public:
  /// Opens `path` for reading; throws Error (with the OS's reason) if it cannot.
  explicit FileSource(const std::string& path);
  ~FileSource();
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  const std::string& path() const noexcept { return path_; }

  /// The unconsumed bytes in the buffer: [data(), data() + available()).
  const std::uint8_t* data() const noexcept { return pos_; }
  std::size_t available() const noexcept { return static_cast<std::size_t>(end_ - pos_); }
  /// Consumes `n` <= available() bytes.
  void advance(std::size_t n) noexcept { pos_ += n; }

  /// When the buffer is empty, reads the next chunk; false at the end of the file (nothing
  /// available). Does nothing while bytes are available. Throws Error on a read error.
  bool refill();
  /// available() > 0 after refilling if needed.
  bool has_more() { return pos_ != end_ || refill(); }

  /// The offset in the file of the next unconsumed byte.
  std::uint64_t offset() const noexcept {
    return base_ + static_cast<std::uint64_t>(pos_ - buffer_.get());
  }

  /// The CRC-32 of every byte consumed so far (from offset 0).
  std::uint32_t crc() noexcept;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<std::uint8_t[]> buffer_;
  std::uint8_t* pos_ = nullptr;
  std::uint8_t* end_ = nullptr;
  std::uint8_t* crc_mark_ = nullptr;  // bytes before it (in this buffer) are in crc_
  std::uint32_t crc_ = 0;
  std::uint64_t base_ = 0;  // file offset of buffer_[0]
};

/// Buffered writing to a temporary file next to a target path; commit() syncs it and renames it
/// to the target, the destructor (or discard()) removes it otherwise. Keeps the CRC-32 of every
/// byte written. A target that exists and is not a regular file (a device such as /dev/null or
/// /dev/full, a FIFO) is written in place: there is no file to replace, and nothing is removed.
class FileSink {
 public:
  /// The largest reserve() request.
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 16;

  /// Creates the temporary file exclusively (never reusing an existing file); throws Error.
  /// `temp` names it; "" picks a fresh TARGET.tmp-<random>.
  explicit FileSink(std::string target, std::string temp = {});
  ~FileSink();
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  const std::string& target() const noexcept { return target_; }
  /// Where the bytes go until commit(): the temporary file, or the target written in place.
  const std::string& temp_path() const noexcept { return temp_; }

  /// Room for `n` <= kBufferBytes bytes: write them at the returned pointer, then call
  /// commit_reserved() with the end of what was written.
  std::uint8_t* reserve(std::size_t n);
  void commit_reserved(std::uint8_t* end) noexcept { used_ = static_cast<std::size_t>(end - buffer_.get()); }

  void put(const void* data, std::size_t n);
  void put(std::string_view text) { put(text.data(), text.size()); }
  void put_byte(std::uint8_t b) { *reserve(1) = b; ++used_; }
  void put_varint(std::uint64_t v) { commit_reserved(detail::put_varint(reserve(kMaxVarintBytes), v)); }

  /// The CRC-32 of every byte written so far.
  std::uint32_t crc() noexcept;
  std::uint64_t bytes_written() const noexcept { return flushed_ + used_; }

  /// Hands the buffered bytes to the OS: a process killed afterwards leaves them in the file.
  /// Throws Error.
  void flush_to_os();
  /// Flushes, syncs and closes the temporary file, then renames it to the target. Throws Error
  /// (the temporary file is then removed).
  void commit();
  /// Closes and removes the temporary file; idempotent.
  void discard() noexcept;

 private:
  void flush();
  /// The file for error messages: "'TARGET' (temporary 'TEMP')", or "'TARGET'" in place.
  std::string describe() const;

  std::string target_;
  std::string temp_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<std::uint8_t[]> buffer_;
  std::size_t used_ = 0;
  std::size_t crc_mark_ = 0;  // buffer_[0, crc_mark_) is in crc_
  std::uint32_t crc_ = 0;
  std::uint64_t flushed_ = 0;
  bool committed_ = false;
  bool in_place_ = false;  // the target is not a regular file: written directly, never removed
};

/// Runs `step`, a write to `sink`; if it throws, sets `failed` and discards the sink (removing its
/// temporary file) before the exception goes on: a writer is unusable after an error.
template <class Step>
void write_or_discard(FileSink& sink, bool& failed, Step&& step) {
  try {
    step();
  } catch (...) {
    failed = true;
    sink.discard();
    throw;
  }
}

// -----------------------------------------------------------------------------------------------
// The two formats (binary_format.cpp, jsonl_format.cpp), created by TraceReader::open and
// TraceWriter::open once the format is known.

/// Limits that keep hostile input from driving allocations: a string (label, source, metadata
/// line) and a JSON line may not be longer. Strings are also read chunk by chunk, so memory only
/// grows with bytes actually present in the file.
inline constexpr std::uint64_t kMaxStringBytes = std::uint64_t{16} << 20;
inline constexpr std::size_t kMaxLineBytes = std::size_t{64} << 20;

/// `source` is positioned at offset 0 with the magic available.
std::unique_ptr<TraceReader> open_binary_reader(std::unique_ptr<FileSource> source);
/// `source` is positioned at offset 0.
std::unique_ptr<TraceReader> open_jsonl_reader(std::unique_ptr<FileSource> source);

/// TraceReader::open on a source already opened (and possibly refilled, nothing consumed).
std::unique_ptr<TraceReader> open_reader(std::unique_ptr<FileSource> source,
                                         const ReadOptions& options = {});
/// The rest of `reader`'s events in memory (read_trace's body).
Trace read_all(TraceReader& reader);
/// The rest of `reader`'s events written to `out` (convert_trace's body); the reader's
/// truncation(), if it was opened with allow_truncated and the file is cut.
std::optional<Truncation> copy_trace(TraceReader& reader, const std::string& out, Format out_format);

std::unique_ptr<TraceWriter> open_binary_writer(std::unique_ptr<FileSink> sink, const TraceInfo& info);
std::unique_ptr<TraceWriter> open_jsonl_writer(std::unique_ptr<FileSink> sink, const TraceInfo& info);

}  // namespace tensorpool::trace::detail

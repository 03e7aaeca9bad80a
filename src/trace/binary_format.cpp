// The binary trace format (.tptrace, version 3): its reader and writer. docs/trace-format.md is
// the specification; the constants below are its tables.
//
// A file is: magic, version (u32 LE), header (source, metadata), then records, each starting with
// a tag byte: an event (tag < 0x80), a label definition (0x80), an extension (0xC0..0xFF, skipped)
// or the end record (0x81: event count, CRC-32 of every byte before the CRC); a live recording
// also writes checkpoints (extension 0xC0 with the same two fields) after each flushed batch,
// which a reader verifies and a tolerant reader reports. Events are coded
// against the previous event (device, stream, time, address), so the reader and writer carry
// that state and nothing that grows with the number of events.
#include <fmt/format.h>

#include <limits>

#include "trace/format_io.hpp"

// The per-event decoding helpers are templates called in the hot loop; GCC would otherwise keep
// them out of line.
#if defined(__GNUC__)
#define TP_ALWAYS_INLINE [[gnu::always_inline]] inline
#else
#define TP_ALWAYS_INLINE inline
#endif

namespace tensorpool::trace::detail {

namespace {

// Event tag: bits 0-3 the op, then which optional parts follow.
constexpr std::uint8_t kTagOpMask = 0x0F;
constexpr std::uint8_t kTagContext = 0x10;  // a context byte follows
constexpr std::uint8_t kTagLabel = 0x20;    // a label id follows (else label 0)
constexpr std::uint8_t kTagTime = 0x40;     // a time delta follows (else the previous time)
// Context byte: which fields differ from their defaults.
constexpr std::uint8_t kCtxFlags = 0x01;    // a flags byte follows (else flags 0)
constexpr std::uint8_t kCtxDevice = 0x02;   // a device follows (else the previous event's)
constexpr std::uint8_t kCtxStream = 0x04;   // a stream follows (else the previous event's)
constexpr std::uint8_t kCtxNoAddr = 0x08;   // addr is 0 (no address delta; the base stays)
constexpr std::uint8_t kCtxReserved = 0xF0;
// Other records.
constexpr std::uint8_t kRecordLabel = 0x80;
constexpr std::uint8_t kRecordEnd = 0x81;
constexpr std::uint8_t kRecordExtension = 0xC0;  // 0xC0..0xFF: length-prefixed, skipped
constexpr std::uint8_t kRecordCheckpoint = 0xC0;  // the extension a live recorder writes

/// The longest event record: tag, context, flags and six varints of at most 10 bytes.
constexpr std::size_t kMaxEventBytes = 3 + 6 * kMaxVarintBytes;

// =============================================================================================
// Reader

class BinaryReader final : public TraceReader {
 public:
  explicit BinaryReader(std::unique_ptr<FileSource> source)
      : TraceReader(std::move(source), Format::binary) {
    read_header();
  }

 private:
  /// Reads bytes straight from the buffer: only used when a whole record of the longest kind is
  /// buffered, so it needs no bounds checks.
  struct FastCursor {
    const std::uint8_t* p;
    std::uint8_t byte() noexcept { return *p++; }
  };
  /// Reads bytes one at a time, refilling the buffer; the end of the file is a truncation error.
  struct SlowCursor {
    BinaryReader* reader;
    const char* what;  // the record being read, for the error
    std::uint8_t byte() { return reader->get_byte(what); }
  };

  bool read_next(TraceEvent& out) override;

  void read_header();
  void read_label();
  std::uint32_t version_ = kBinaryFormatVersion;  // of the file, from its header
  void read_end();
  void read_checkpoint();
  void skip_extension(std::uint8_t tag);
  std::uint32_t read_crc(SlowCursor& c);
  [[noreturn]] void fail_cut(std::string problem) {
    mark_cut();
    fail(std::move(problem));
  }
  std::string read_string(const char* what, const char* field);

  template <class Cursor>
  void decode_event(Cursor& c, std::uint8_t tag, TraceEvent& e);
  template <class Cursor>
  std::uint64_t varint(Cursor& c, const char* field);
  template <class Cursor>
  std::uint64_t varint_tail(Cursor& c, std::uint8_t first, const char* field);
  std::uint8_t get_byte(const char* what);

  [[noreturn]] void fail(std::string problem) const { fail_at(record_start_, std::move(problem)); }
  [[noreturn]] void fail_at(std::uint64_t offset, std::string problem) const {
    throw TraceFormatError(path_, TraceFormatError::Where::byte, offset, std::move(problem));
  }

  std::uint64_t record_start_ = 0;  // offset of the record (or header field) being read
  // The previous event's fields that the next one is coded against. Time and address are kept
  // as uint64 so that deltas wrap (any int64/uint64 pair has a delta).
  std::uint16_t device_ = 0;
  std::uint64_t stream_ = 0;
  std::uint64_t time_ = 0;
  std::uint64_t addr_ = 0;
};

std::uint8_t BinaryReader::get_byte(const char* what) {
  if (!source_->has_more()) {
    fail_cut(fmt::format("truncated {}: the file ends at byte {}", what, source_->offset()));
  }
  const std::uint8_t b = *source_->data();
  source_->advance(1);
  return b;
}

template <class Cursor>
TP_ALWAYS_INLINE std::uint64_t BinaryReader::varint(Cursor& c, const char* field) {
  const std::uint8_t first = c.byte();
  if (first < 0x80) return first;  // the common case, kept small enough to inline
  return varint_tail(c, first, field);
}

template <class Cursor>
std::uint64_t BinaryReader::varint_tail(Cursor& c, std::uint8_t first, const char* field) {
  std::uint64_t v = first & 0x7Fu;
  for (unsigned shift = 7;; shift += 7) {
    const std::uint8_t b = c.byte();
    // The 10th byte holds bit 63 only: anything more does not fit (and ends the loop).
    if (shift == 63 && b > 1) fail(fmt::format("varint overflow in {}: more than 64 bits", field));
    v |= std::uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80) == 0) return v;
  }
}

template <class Cursor>
TP_ALWAYS_INLINE void BinaryReader::decode_event(Cursor& c, std::uint8_t tag, TraceEvent& e) {
  const unsigned op = tag & kTagOpMask;
  const auto known = static_cast<unsigned>(ops_in_version(version_));
  if (op >= known) {
    fail(fmt::format("unknown op {} in event record (tag 0x{:02X}); known ops are 0..{} in version {}",
                     op, tag, known - 1, version_));
  }
  const std::uint8_t ctx = (tag & kTagContext) ? c.byte() : 0;
  if (ctx & kCtxReserved) fail(fmt::format("reserved bits set in event context byte 0x{:02X}", ctx));
  e.op = static_cast<Op>(op);
  e.flags = (ctx & kCtxFlags) ? c.byte() : 0;
  if (ctx & kCtxDevice) {
    const std::uint64_t device = varint(c, "device");
    if (device > std::numeric_limits<std::uint16_t>::max()) {
      fail(fmt::format("device {} out of range (at most 65535)", device));
    }
    device_ = static_cast<std::uint16_t>(device);
  }
  e.device = device_;
  if (ctx & kCtxStream) stream_ = varint(c, "stream");
  e.stream = stream_;
  e.label = 0;
  if (tag & kTagLabel) {
    const std::uint64_t label = varint(c, "label");
    if (label >= labels_.size()) {
      fail(fmt::format("label id {} not defined yet ({} labels defined; a label is defined before "
                       "the first event that uses it)", label, labels_.size() - 1));
    }
    e.label = static_cast<std::uint32_t>(label);
  }
  if (tag & kTagTime) time_ += static_cast<std::uint64_t>(unzigzag(varint(c, "time delta")));
  e.time_us = static_cast<std::int64_t>(time_);
  e.addr = 0;
  if (!(ctx & kCtxNoAddr)) e.addr = addr_ += static_cast<std::uint64_t>(unzigzag(varint(c, "address delta")));
  e.size = varint(c, "size");
}

bool BinaryReader::read_next(TraceEvent& out) {
  for (;;) {
    record_start_ = source_->offset();
    if (!source_->has_more()) {
      fail_cut(fmt::format("truncated: missing end record (the file ends after {} events)", events_read_));
    }
    const std::uint8_t* p = source_->data();
    const std::uint8_t tag = *p;
    if (tag < kRecordLabel) {
      if (source_->available() >= kMaxEventBytes) {
        FastCursor c{p + 1};
        decode_event(c, tag, out);
        source_->advance(static_cast<std::size_t>(c.p - p));
      } else {
        source_->advance(1);
        SlowCursor c{this, "event record"};
        decode_event(c, tag, out);
      }
      return true;
    }
    source_->advance(1);
    if (tag == kRecordLabel) {
      read_label();
    } else if (tag == kRecordEnd) {
      read_end();
      return false;
    } else if (tag == kRecordCheckpoint) {
      read_checkpoint();
    } else if (tag >= kRecordExtension) {
      skip_extension(tag);
    } else {
      fail(fmt::format("unknown record type 0x{:02X}", tag));
    }
  }
}

std::string BinaryReader::read_string(const char* what, const char* field) {
  SlowCursor c{this, what};
  const std::uint64_t n = varint(c, field);
  if (n > kMaxStringBytes) {
    fail(fmt::format("{} of {} bytes is longer than the limit of {} bytes", field, n, kMaxStringBytes));
  }
  // Chunk by chunk: the string only grows by bytes that are really in the file.
  std::string s;
  for (std::uint64_t left = n; left > 0;) {
    if (!source_->has_more()) {
      fail_cut(fmt::format("truncated {}: the file ends at byte {} inside a {}-byte {}", what,
                           source_->offset(), n, field));
    }
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(left, source_->available()));
    s.append(reinterpret_cast<const char*>(source_->data()), k);
    source_->advance(k);
    left -= k;
  }
  return s;
}

void BinaryReader::read_header() {
  source_->advance(sizeof kBinaryMagic);  // checked by TraceReader::open
  record_start_ = source_->offset();
  std::uint32_t version = 0;
  for (int i = 0; i < 4; ++i) version |= std::uint32_t{get_byte("header (format version)")} << (8 * i);
  if (version < 1 || version > kBinaryFormatVersion) {
    fail(fmt::format("unsupported .tptrace format version {} (this reader supports versions 1 to {}; "
                     "a newer tensorpool may read it)", version, kBinaryFormatVersion));
  }
  version_ = version;
  record_start_ = source_->offset();
  info_.source = read_string("header", "source");
  record_start_ = source_->offset();
  SlowCursor c{this, "header"};
  const std::uint64_t count = varint(c, "metadata count");
  // No reserve(count): each line takes at least one byte, so the loop is bounded by the file.
  for (std::uint64_t i = 0; i < count; ++i) {
    record_start_ = source_->offset();
    info_.metadata.push_back(read_string("header", "metadata line"));
  }
}

void BinaryReader::read_label() {
  if (labels_.size() > std::numeric_limits<std::uint32_t>::max()) fail("too many labels (2^32)");
  labels_.push_back(read_string("label definition", "label"));
}

// Reads the stored CRC-32 that follows and checks it against every byte before it.
std::uint32_t BinaryReader::read_crc(SlowCursor& c) {
  const std::uint32_t actual = source_->crc();  // every byte before the checksum field
  std::uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= std::uint32_t{c.byte()} << (8 * i);
  if (stored != actual) {
    fail(fmt::format("checksum mismatch: the {} says 0x{:08X} but the file's bytes give "
                     "0x{:08X} (the file is corrupted)", c.what, stored, actual));
  }
  return stored;
}

void BinaryReader::read_end() {
  SlowCursor c{this, "end record"};
  const std::uint64_t count = varint(c, "event count");
  read_crc(c);
  if (count != events_read_) {
    fail(fmt::format("event count mismatch: the end record says {} events but the file has {}",
                     count, events_read_));
  }
  if (source_->has_more()) fail_at(source_->offset(), "unexpected data after the end record");
}

// A checkpoint: extension length, event count, CRC-32 of every byte before the CRC.
void BinaryReader::read_checkpoint() {
  SlowCursor c{this, "checkpoint record"};
  const std::uint64_t length = varint(c, "checkpoint length");
  const std::uint64_t payload_start = source_->offset();
  const std::uint64_t count = varint(c, "checkpoint event count");
  read_crc(c);
  if (source_->offset() - payload_start != length) {
    fail(fmt::format("malformed checkpoint record: its length says {} bytes but its event count "
                     "and checksum take {}", length, source_->offset() - payload_start));
  }
  if (count != events_read_) {
    fail(fmt::format("event count mismatch: the checkpoint says {} events but the file has {} "
                     "before it", count, events_read_));
  }
  mark_verified(events_read_, source_->offset());
}

void BinaryReader::skip_extension(std::uint8_t tag) {
  SlowCursor c{this, "extension record"};
  for (std::uint64_t left = varint(c, "extension length"); left > 0;) {
    if (!source_->has_more()) {
      fail_cut(fmt::format("truncated extension record 0x{:02X}: the file ends at byte {}", tag,
                           source_->offset()));
    }
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(left, source_->available()));
    source_->advance(k);
    left -= k;
  }
}

// =============================================================================================
// Writer

class BinaryWriter final : public TraceWriter {
 public:
  BinaryWriter(std::unique_ptr<FileSink> sink, const TraceInfo& info)
      : TraceWriter(std::move(sink), Format::binary) {
    write_header(info);
  }

 private:
  void write_header(const TraceInfo& info);
  void put_string(std::string_view s, const char* field);
  void on_label(std::uint32_t id, std::string_view text) override;
  void on_event(const TraceEvent& e) override;
  void on_finish() override;
  void on_checkpoint() override;
  /// The CRC-32 of every byte written so far, as the end and checkpoint records store it.
  void put_crc();

  // The previous event's fields (see BinaryReader).
  std::uint16_t device_ = 0;
  std::uint64_t stream_ = 0;
  std::uint64_t time_ = 0;
  std::uint64_t addr_ = 0;
};

void BinaryWriter::put_string(std::string_view s, const char* field) {
  if (s.size() > kMaxStringBytes) {
    throw Error(fmt::format("cannot write trace '{}': a {} of {} bytes is longer than the format's "
                            "limit of {} bytes", path_, field, s.size(), kMaxStringBytes));
  }
  sink_->put_varint(s.size());
  sink_->put(s);
}

void BinaryWriter::write_header(const TraceInfo& info) {
  sink_->put(kBinaryMagic, sizeof kBinaryMagic);
  for (int i = 0; i < 4; ++i) sink_->put_byte(static_cast<std::uint8_t>(kBinaryFormatVersion >> (8 * i)));
  put_string(info.source, "source");
  sink_->put_varint(info.metadata.size());
  for (const std::string& line : info.metadata) put_string(line, "metadata line");
}

void BinaryWriter::on_label(std::uint32_t /*id: implied by the order of definitions*/,
                            std::string_view text) {
  sink_->put_byte(kRecordLabel);
  put_string(text, "label");
}

void BinaryWriter::on_event(const TraceEvent& e) {
  std::uint8_t* const start = sink_->reserve(kMaxEventBytes);
  std::uint8_t ctx = 0;
  if (e.flags != 0) ctx |= kCtxFlags;
  if (e.device != device_) ctx |= kCtxDevice;
  if (e.stream != stream_) ctx |= kCtxStream;
  if (e.addr == 0) ctx |= kCtxNoAddr;
  const auto time = static_cast<std::uint64_t>(e.time_us);
  std::uint8_t tag = static_cast<std::uint8_t>(e.op);
  if (ctx != 0) tag |= kTagContext;
  if (e.label != 0) tag |= kTagLabel;
  if (time != time_) tag |= kTagTime;

  // The same order as BinaryReader::decode_event.
  std::uint8_t* p = start;
  *p++ = tag;
  if (ctx != 0) *p++ = ctx;
  if (ctx & kCtxFlags) *p++ = e.flags;
  if (ctx & kCtxDevice) p = put_varint(p, e.device);
  if (ctx & kCtxStream) p = put_varint(p, e.stream);
  if (tag & kTagLabel) p = put_varint(p, e.label);
  if (tag & kTagTime) p = put_varint(p, zigzag(static_cast<std::int64_t>(time - time_)));
  if (!(ctx & kCtxNoAddr)) p = put_varint(p, zigzag(static_cast<std::int64_t>(e.addr - addr_)));
  p = put_varint(p, e.size);
  sink_->commit_reserved(p);

  device_ = e.device;
  stream_ = e.stream;
  time_ = time;
  if (e.addr != 0) addr_ = e.addr;
}

void BinaryWriter::put_crc() {
  const std::uint32_t crc = sink_->crc();  // every byte before the checksum field
  for (int i = 0; i < 4; ++i) sink_->put_byte(static_cast<std::uint8_t>(crc >> (8 * i)));
}

void BinaryWriter::on_finish() {
  sink_->put_byte(kRecordEnd);
  sink_->put_varint(events_written_);
  put_crc();
}

void BinaryWriter::on_checkpoint() {
  std::uint8_t count[kMaxVarintBytes];
  const auto count_bytes = static_cast<std::size_t>(put_varint(count, events_written_) - count);
  sink_->put_byte(kRecordCheckpoint);
  sink_->put_varint(count_bytes + 4);  // the payload: event count and CRC
  sink_->put(count, count_bytes);
  put_crc();
}

}  // namespace

std::unique_ptr<TraceReader> open_binary_reader(std::unique_ptr<FileSource> source) {
  return std::make_unique<BinaryReader>(std::move(source));
}

std::unique_ptr<TraceWriter> open_binary_writer(std::unique_ptr<FileSink> sink, const TraceInfo& info) {
  return std::make_unique<BinaryWriter>(std::move(sink), info);
}

}  // namespace tensorpool::trace::detail

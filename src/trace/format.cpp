// The format-independent half of trace reading and writing: TraceFormatError, choosing the format
// (from a file's first bytes or a name's extension), the label bookkeeping and failure handling
// of TraceReader/TraceWriter, and the whole-trace conveniences.
#include "tensorpool/trace/format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "trace/format_io.hpp"

namespace tensorpool::trace {

namespace {

std::string format_error_message(const std::string& file, TraceFormatError::Where where,
                                 std::uint64_t position, const std::string& problem) {
  const char* unit = where == TraceFormatError::Where::byte ? "byte" : "line";
  return fmt::format("{}: {} {}: {}", file, unit, position, problem);
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string hex_bytes(const std::uint8_t* p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += fmt::format("{}{:02X}", i ? " " : "", p[i]);
  return out;
}

/// The format of the file whose first chunk `source` holds: the binary magic, or JSON lines if
/// the first byte after an optional UTF-8 byte-order mark and whitespace is '{'.
Format detect_format(detail::FileSource& source) {
  const std::uint8_t* p = source.data();
  const std::size_t n = source.available();
  const std::size_t magic_n = sizeof detail::kBinaryMagic;
  const auto fail = [&](std::uint64_t where, std::string problem) {
    throw TraceFormatError(source.path(), TraceFormatError::Where::byte, where, std::move(problem));
  };
  if (n == 0) fail(0, "truncated: the file is empty (expected a .tptrace magic or a JSON-lines header)");
  if (std::memcmp(p, detail::kBinaryMagic, std::min(n, magic_n)) == 0) {
    if (n < magic_n) fail(n, "truncated: the file ends inside the .tptrace magic");
    return Format::binary;
  }
  std::size_t i = (n >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) ? 3 : 0;
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n')) ++i;
  if (i == n || p[i] == '{') return Format::jsonl;  // all blank: the JSON reader reports it
  fail(0, fmt::format("bad magic: not a tensorpool trace (expected the .tptrace magic {} or a "
                      "JSON-lines header starting with '{{'; found {})",
                      hex_bytes(detail::kBinaryMagic, magic_n), hex_bytes(p, std::min(n, magic_n))));
  return Format::binary;  // not reached
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const char* to_string(Format format) noexcept {
  switch (format) {
    case Format::binary: return "binary";
    case Format::jsonl: return "jsonl";
  }
  return "unknown";
}

Format format_from_extension(const std::string& path) {
  const std::string lower = lowercase(path);
  if (ends_with(lower, ".tptrace")) return Format::binary;
  if (ends_with(lower, ".jsonl")) return Format::jsonl;
  throw Error(fmt::format("cannot tell the trace format of '{}' from its name: expected a name "
                          "ending in .tptrace (binary) or .jsonl (JSON lines)", path));
}

TraceFormatError::TraceFormatError(std::string file, Where where, std::uint64_t position,
                                   std::string problem)
    : Error(format_error_message(file, where, position, problem)),
      file_(std::move(file)),
      where_(where),
      position_(position),
      problem_(std::move(problem)) {}

// ---------------------------------------------------------------------------------------------
// TraceReader

TraceReader::TraceReader(std::unique_ptr<detail::FileSource> source, Format format)
    : source_(std::move(source)), path_(source_->path()), format_(format) {}

TraceReader::~TraceReader() = default;

std::unique_ptr<TraceReader> detail::open_reader(std::unique_ptr<FileSource> source,
                                                 const ReadOptions& options) {
  source->refill();
  std::unique_ptr<TraceReader> reader = detect_format(*source) == Format::binary
                                            ? open_binary_reader(std::move(source))
                                            : open_jsonl_reader(std::move(source));
  reader->options_ = options;
  return reader;
}

std::unique_ptr<TraceReader> TraceReader::open(const std::string& path) {
  return open(path, ReadOptions{});
}

std::unique_ptr<TraceReader> TraceReader::open(const std::string& path, const ReadOptions& options) {
  return detail::open_reader(std::make_unique<detail::FileSource>(path), options);
}

const std::string& TraceReader::label(std::uint32_t id) const {
  if (id >= labels_.size()) {
    throw Error(fmt::format("trace '{}': label id {} is not defined ({} labels so far)", path_, id,
                            labels_.size()));
  }
  return labels_[id];
}

std::uint64_t TraceReader::offset() const noexcept { return source_->offset(); }

bool TraceReader::next(TraceEvent& out) {
  if (error_) std::rethrow_exception(error_);
  if (done_) return false;
  try {
    if (read_next(out)) {
      ++events_read_;
      return true;
    }
    done_ = true;
    return false;
  } catch (const TraceFormatError& e) {
    if (end_at_cut(e)) return false;
    error_ = std::current_exception();
    throw;
  } catch (...) {
    error_ = std::current_exception();
    throw;
  }
}

bool TraceReader::end_at_cut(const TraceFormatError& error) {
  if (!cut_ || !options_.allow_truncated) return false;
  done_ = true;
  truncation_ = Truncation{error.position(), source_->offset(), events_read_, verified_events_,
                           verified_bytes_, error.what()};
  return true;
}

// ---------------------------------------------------------------------------------------------
// TraceWriter

/// Heterogeneous lookup, so interning a string_view allocates only for a new label.
struct TraceWriter::LabelIndex {
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> ids;
};

TraceWriter::TraceWriter(std::unique_ptr<detail::FileSink> sink, Format format)
    : sink_(std::move(sink)),
      path_(sink_->target()),
      format_(format),
      label_index_(std::make_unique<LabelIndex>()) {}

TraceWriter::~TraceWriter() = default;  // ~FileSink removes the temporary unless committed

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, Format format,
                                               const TraceInfo& info) {
  return open(path, format, info, WriteOptions{});
}

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, Format format,
                                               const TraceInfo& info, const WriteOptions& options) {
  auto sink = std::make_unique<detail::FileSink>(path, options.temp_path);
  if (format == Format::binary) return detail::open_binary_writer(std::move(sink), info);
  return detail::open_jsonl_writer(std::move(sink), info);
}

void TraceWriter::throw_unusable() const {
  if (finished_) throw Error(fmt::format("trace writer for '{}': already finished", path_));
  throw Error(fmt::format("trace writer for '{}': unusable after an error", path_));
}

template <class Step>
void TraceWriter::guarded(Step&& step) {
  check_usable();
  detail::write_or_discard(*sink_, failed_, std::forward<Step>(step));
}

std::uint32_t TraceWriter::intern(std::string_view text) {
  check_usable();
  if (text.empty()) return 0;
  if (auto it = label_index_->ids.find(text); it != label_index_->ids.end()) return it->second;
  std::uint32_t id = 0;
  guarded([&] {
    if (labels_.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw Error(fmt::format("trace writer for '{}': too many labels", path_));
    }
    id = static_cast<std::uint32_t>(labels_.size());
    on_label(id, text);
    labels_.emplace_back(text);
    label_index_->ids.emplace(labels_.back(), id);
  });
  return id;
}

void TraceWriter::write(const TraceEvent& event) {
  guarded([&] {
    if (static_cast<int>(event.op) >= kNumOps) {
      throw Error(fmt::format("trace writer for '{}': event {} has op {}, not a trace::Op", path_,
                              events_written_, static_cast<int>(event.op)));
    }
    if (event.label >= labels_.size()) {
      throw Error(fmt::format("trace writer for '{}': event {} uses label id {}, but only {} "
                              "labels are defined (ids come from intern())",
                              path_, events_written_, event.label, labels_.size()));
    }
    on_event(event);
    ++events_written_;
  });
}

void TraceWriter::write(TraceEvent event, std::string_view label_text) {
  event.label = intern(label_text);
  write(event);
}

void TraceWriter::checkpoint() {
  guarded([&] {
    on_checkpoint();
    sink_->flush_to_os();
  });
}

const std::string& TraceWriter::temp_path() const noexcept { return sink_->temp_path(); }

void TraceWriter::finish() {
  guarded([&] {
    on_finish();
    sink_->commit();
    finished_ = true;
  });
}

// ---------------------------------------------------------------------------------------------
// Whole traces

Trace detail::read_all(TraceReader& reader) {
  Trace trace;
  trace.info = reader.info();
  TraceEvent e;
  while (reader.next(e)) trace.events.push_back(e);
  trace.labels = reader.labels();
  for (std::size_t i = 1; i < trace.labels.size(); ++i) {
    trace.label_ids.emplace(trace.labels[i], static_cast<std::uint32_t>(i));  // first one wins
  }
  return trace;
}

Trace read_trace(const std::string& path) { return detail::read_all(*TraceReader::open(path)); }

void write_trace(const std::string& path, const Trace& trace, Format format) {
  auto writer = TraceWriter::open(path, format, trace.info);
  std::vector<std::uint32_t> ids(trace.labels.size(), 0);  // trace's id -> file's id
  for (std::size_t i = 1; i < trace.labels.size(); ++i) ids[i] = writer->intern(trace.labels[i]);
  std::uint64_t index = 0;
  for (TraceEvent e : trace.events) {
    if (e.label >= ids.size()) {
      throw Error(fmt::format("cannot write trace '{}': event {} uses label id {}, outside the "
                              "trace's label table ({} labels)", path, index, e.label, ids.size()));
    }
    e.label = ids[e.label];
    writer->write(e);
    ++index;
  }
  writer->finish();
}

std::optional<Truncation> detail::copy_trace(TraceReader& reader, const std::string& out,
                                             Format out_format) {
  auto writer = TraceWriter::open(out, out_format, reader.info());
  std::vector<std::uint32_t> ids{0};  // reader's id -> writer's id, grown as labels appear
  TraceEvent e;
  while (reader.next(e)) {
    while (ids.size() < reader.labels().size()) ids.push_back(writer->intern(reader.labels()[ids.size()]));
    e.label = ids[e.label];
    writer->write(e);
  }
  writer->finish();
  return reader.truncation();
}

void convert_trace(const std::string& in, const std::string& out, Format out_format) {
  detail::copy_trace(*TraceReader::open(in), out, out_format);
}

std::optional<Truncation> convert_trace(const std::string& in, const std::string& out,
                                        Format out_format, const ReadOptions& options) {
  return detail::copy_trace(*TraceReader::open(in, options), out, out_format);
}

}  // namespace tensorpool::trace

// The JSON-lines trace format (.jsonl, version 3): its reader and writer. docs/trace-format.md is
// the specification.
//
// Line 1 is a header object, then one object per event, then optionally an end object
// {"end":true,"events":N} that lets readers detect a file cut at a line boundary. Labels are
// inline text; the reader numbers them in order of first appearance. Lines are read one at a
// time (at most kMaxLineBytes) and parsed with nlohmann::json, so memory is one line plus the
// label table.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "trace/format_io.hpp"

namespace tensorpool::trace::detail {

namespace {

using nlohmann::json;

constexpr const char* kFormatName = "tensorpool-trace";

// Which keys an event must have, by op (the fields event.hpp lists for it); the others default
// to 0 / "".
enum Field : unsigned { kAddr = 1, kSize = 2, kStream = 4 };
constexpr std::array<unsigned, kNumOps> kRequiredFields = {
    kAddr | kSize,    // alloc
    kAddr | kSize,    // free_requested
    kAddr | kSize,    // free_completed
    kAddr | kStream,  // record_stream
    kStream,          // stream_sync
    kSize,            // iteration
    kAddr | kSize,    // segment_alloc
    kAddr | kSize,    // segment_free
    kAddr | kSize,    // segment_map
    kAddr | kSize,    // segment_unmap
    kSize,            // oom
    kAddr | kSize,    // seed_segment
    kAddr | kSize,    // seed_alloc
    0,                // empty_cache
    0,                // sleep
    kAddr,            // graph_pool
};

/// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as JSON requires.
bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) { ++i; continue; }
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return false;
    if (n - i < len) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
    }
    i += len;
  }
  return true;
}

/// Appends `s` as a JSON string literal (the caller checked it is UTF-8).
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else out += ch;
    }
  }
  out += '"';
}

/// "string \"abc\"", "number -5", ... for error messages (at most ~60 characters of the value).
std::string describe(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", v.type_name(), text);
}

/// nlohmann's parse error without its exception id, and with columns only (the line is ours).
std::string parse_error_text(const json::exception& e) {
  std::string s = e.what();
  if (const auto pos = s.find("] "); s.rfind("[json.exception", 0) == 0 && pos != std::string::npos) {
    s = s.substr(pos + 2);
  }
  if (const auto pos = s.find("at line 1, column "); pos != std::string::npos) {
    s.replace(pos, 18, "at column ");
  }
  return s;
}

/// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted.
/// Checked before parsing because deep values would recurse (dump, comparisons) without bound.
std::size_t nesting_depth(std::string_view text) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Events are flat objects and the header holds one array: anything deeper is not a trace.
constexpr std::size_t kMaxJsonDepth = 8;

bool is_blank(std::string_view s) noexcept {
  return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

// =============================================================================================
// Reader

class JsonlReader final : public TraceReader {
 public:
  explicit JsonlReader(std::unique_ptr<FileSource> source)
      : TraceReader(std::move(source), Format::jsonl) {
    read_header();
  }

  std::uint64_t line() const noexcept override { return line_no_; }

 private:
  bool read_next(TraceEvent& out) override;

  bool read_line();
  std::uint32_t version_ = kJsonlFormatVersion;  // of the file, from its header
  bool next_nonblank_line();
  json parse_line();
  void read_header();
  void read_end_line(const json& j) const;
  void parse_event(const json& j, TraceEvent& e);
  void set_field(const std::string& key, const json& v, TraceEvent& e, unsigned& seen);

  std::uint64_t get_uint(const char* key, const json& v, std::uint64_t max) const;
  std::uint64_t get_uint_or_hex(const char* key, const json& v) const;
  std::int64_t get_int(const char* key, const json& v) const;
  std::uint32_t intern(const std::string& text);

  [[noreturn]] void fail(std::string problem) const {
    throw TraceFormatError(path_, TraceFormatError::Where::line, line_no_, std::move(problem));
  }

  std::string line_;            // the current line, without its line end
  std::uint64_t line_no_ = 0;   // 1-based number of line_
  bool line_ended_ = false;     // line_ ended with '\n' (false: the last line of the file)
  bool ended_ = false;          // the end object was read
  std::unordered_map<std::string, std::uint32_t> label_ids_;  // inverse of labels_
};

bool JsonlReader::read_line() {
  line_.clear();
  if (!source_->has_more()) return false;
  ++line_no_;
  for (;;) {
    const std::uint8_t* p = source_->data();
    const std::size_t n = source_->available();
    const auto* nl = static_cast<const std::uint8_t*>(std::memchr(p, '\n', n));
    const std::size_t k = nl != nullptr ? static_cast<std::size_t>(nl - p) : n;
    if (k > kMaxLineBytes - line_.size()) fail(fmt::format("line longer than {} bytes", kMaxLineBytes));
    line_.append(reinterpret_cast<const char*>(p), k);
    source_->advance(nl != nullptr ? k + 1 : k);
    line_ended_ = nl != nullptr;
    if (nl != nullptr || !source_->has_more()) break;
  }
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  if (line_no_ == 1 && line_.rfind("\xEF\xBB\xBF", 0) == 0) line_.erase(0, 3);  // UTF-8 BOM
  return true;
}

bool JsonlReader::next_nonblank_line() {
  while (read_line()) {
    if (!is_blank(line_)) return true;
  }
  return false;
}

json JsonlReader::parse_line() {
  if (nesting_depth(line_) > kMaxJsonDepth) {
    fail(fmt::format("JSON nested deeper than {} levels (events are flat objects)", kMaxJsonDepth));
  }
  try {
    return json::parse(line_);
  } catch (const json::exception& e) {
    if (!line_ended_) mark_cut();  // the last line, without its line end: the file was cut
    fail("malformed JSON: " + parse_error_text(e));
  }
}

void JsonlReader::read_header() {
  if (!next_nonblank_line()) {
    line_no_ = std::max<std::uint64_t>(line_no_, 1);
    fail("truncated: no header line (expected {\"format\":\"tensorpool-trace\",\"version\":1,...})");
  }
  const json h = parse_line();
  const auto format = h.is_object() ? h.find("format") : h.end();
  if (!h.is_object() || format == h.end() || *format != kFormatName) {
    fail("expected the header object {\"format\":\"tensorpool-trace\",\"version\":1,...} as the "
         "first line");
  }
  const auto version = h.find("version");
  if (version == h.end()) fail("missing key \"version\" in the header");
  const std::uint64_t number = get_uint("version", *version, std::numeric_limits<std::uint64_t>::max());
  if (number < 1 || number > kJsonlFormatVersion) {
    fail(fmt::format("unsupported tensorpool-trace JSON-lines version {} (this reader supports "
                     "versions 1 to {}; a newer tensorpool may read it)", version->dump(), kJsonlFormatVersion));
  }
  version_ = static_cast<std::uint32_t>(number);
  for (auto it = h.begin(); it != h.end(); ++it) {
    const json& v = it.value();
    if (it.key() == "format" || it.key() == "version") continue;
    if (it.key() == "source") {
      if (!v.is_string()) fail("key \"source\" must be a string, found " + describe(v));
      info_.source = v.get<std::string>();
    } else if (it.key() == "metadata") {
      if (!v.is_array()) fail("key \"metadata\" must be an array of strings, found " + describe(v));
      for (const json& item : v) {
        if (!item.is_string()) fail("key \"metadata\" must be an array of strings, found " + describe(item));
        info_.metadata.push_back(item.get<std::string>());
      }
    } else {
      fail(fmt::format("unknown key \"{}\" in the header (known: format, version, source, "
                       "metadata)", it.key()));
    }
  }
}

bool JsonlReader::read_next(TraceEvent& out) {
  while (next_nonblank_line()) {
    if (ended_) fail("unexpected data after the end object");
    const json j = parse_line();
    if (!j.is_object()) fail("expected an event object {\"op\":...}, found " + describe(j));
    if (j.contains("end")) {
      read_end_line(j);
      ended_ = true;
      continue;
    }
    parse_event(j, out);
    return true;
  }
  return false;
}

void JsonlReader::read_end_line(const json& j) const {
  if (j["end"] != true) fail("key \"end\" must be true, found " + describe(j["end"]));
  const auto events = j.find("events");
  if (events == j.end()) fail("missing key \"events\" in the end object");
  const std::uint64_t count = get_uint("events", *events, std::numeric_limits<std::uint64_t>::max());
  if (count != events_read_) {
    fail(fmt::format("event count mismatch: the end object says {} events but the file has {}",
                     count, events_read_));
  }
  if (j.size() != 2) fail("unknown key in the end object (known: end, events)");
}

void JsonlReader::parse_event(const json& j, TraceEvent& e) {
  e = TraceEvent{};
  unsigned seen = 0;
  bool has_op = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "op") {
      if (!it->is_string()) fail("key \"op\" must be a string, found " + describe(*it));
      if (!parse_op(it->get_ref<const std::string&>(), e.op) ||
          static_cast<int>(e.op) >= ops_in_version(version_)) {
        fail(fmt::format("unknown op {}{}", it->dump(-1, ' ', false, json::error_handler_t::replace),
                         version_ < kJsonlFormatVersion ? fmt::format(" in version {}", version_) : ""));
      }
      has_op = true;
    } else {
      set_field(it.key(), it.value(), e, seen);
    }
  }
  if (!has_op) fail("missing key \"op\"");
  const unsigned missing = kRequiredFields[static_cast<std::size_t>(e.op)] & ~seen;
  if (missing != 0) {
    const char* key = (missing & kAddr) ? "addr" : (missing & kSize) ? "size" : "stream";
    fail(fmt::format("missing key \"{}\" (a {} event needs it)", key, to_string(e.op)));
  }
}

void JsonlReader::set_field(const std::string& key, const json& v, TraceEvent& e, unsigned& seen) {
  if (key == "addr") {
    e.addr = get_uint_or_hex("addr", v);
    seen |= kAddr;
  } else if (key == "size") {
    e.size = get_uint("size", v, std::numeric_limits<std::uint64_t>::max());
    seen |= kSize;
  } else if (key == "stream") {
    e.stream = get_uint_or_hex("stream", v);
    seen |= kStream;
  } else if (key == "device") {
    e.device = static_cast<std::uint16_t>(get_uint("device", v, std::numeric_limits<std::uint16_t>::max()));
  } else if (key == "time_us") {
    e.time_us = get_int("time_us", v);
  } else if (key == "flags") {
    e.flags = static_cast<std::uint8_t>(get_uint("flags", v, std::numeric_limits<std::uint8_t>::max()));
  } else if (key == "label") {
    if (!v.is_string()) fail("key \"label\" must be a string, found " + describe(v));
    e.label = intern(v.get_ref<const std::string&>());
  } else {
    fail(fmt::format("unknown key \"{}\" (known: op, device, stream, addr, size, time_us, flags, "
                     "label)", key));
  }
}

std::uint64_t JsonlReader::get_uint(const char* key, const json& v, std::uint64_t max) const {
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (x > max) fail(fmt::format("key \"{}\": {} is out of range (at most {})", key, x, max));
    return x;
  }
  if (v.is_number_integer()) fail(fmt::format("negative {} {}", key, v.get<std::int64_t>()));
  fail(fmt::format("key \"{}\" must be a non-negative integer, found {}", key, describe(v)));
}

std::uint64_t JsonlReader::get_uint_or_hex(const char* key, const json& v) const {
  if (!v.is_string()) {
    if (v.is_number_unsigned() || v.is_number_integer()) {
      return get_uint(key, v, std::numeric_limits<std::uint64_t>::max());
    }
    fail(fmt::format("key \"{}\" must be a hex string like \"0x7f00\" or a non-negative integer, "
                     "found {}", key, describe(v)));
  }
  const auto& s = v.get_ref<const std::string&>();
  const bool prefixed = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  std::uint64_t x = 0;
  bool ok = prefixed && s.size() <= 2 + 16;
  for (std::size_t i = 2; ok && i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int digit = std::isdigit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    ok = digit >= 0;
    x = x << 4 | static_cast<std::uint64_t>(digit & 0xF);
  }
  if (!ok) {
    fail(fmt::format("key \"{}\" must be a hex string of 1 to 16 digits like \"0x7f00\", found {}",
                     key, describe(v)));
  }
  return x;
}

std::int64_t JsonlReader::get_int(const char* key, const json& v) const {
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(fmt::format("key \"{}\": {} is out of range (a signed 64-bit integer)", key, x));
    }
    return static_cast<std::int64_t>(x);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  fail(fmt::format("key \"{}\" must be an integer, found {}", key, describe(v)));
}

std::uint32_t JsonlReader::intern(const std::string& text) {
  if (text.empty()) return 0;
  if (auto it = label_ids_.find(text); it != label_ids_.end()) return it->second;
  if (labels_.size() > std::numeric_limits<std::uint32_t>::max()) fail("too many labels (2^32)");
  const auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.push_back(text);
  label_ids_.emplace(text, id);
  return id;
}

// =============================================================================================
// Writer

class JsonlWriter final : public TraceWriter {
 public:
  JsonlWriter(std::unique_ptr<FileSink> sink, const TraceInfo& info)
      : TraceWriter(std::move(sink), Format::jsonl) {
    write_header(info);
  }

 private:
  void write_header(const TraceInfo& info);
  void append_string(std::string_view s, const char* what);
  void on_label(std::uint32_t id, std::string_view text) override;
  void on_event(const TraceEvent& e) override;
  void on_finish() override;

  std::string line_;  // reused for every line
};

void JsonlWriter::append_string(std::string_view s, const char* what) {
  if (!valid_utf8(s)) {
    throw Error(fmt::format("cannot write trace '{}' as JSON lines: a {} is not valid UTF-8 "
                            "(use the binary format for arbitrary bytes)", path_, what));
  }
  append_json_string(line_, s);
}

void JsonlWriter::write_header(const TraceInfo& info) {
  line_ = fmt::format("{{\"format\":\"{}\",\"version\":{},\"source\":", kFormatName, kJsonlFormatVersion);
  append_string(info.source, "source");
  line_ += ",\"metadata\":[";
  for (std::size_t i = 0; i < info.metadata.size(); ++i) {
    if (i != 0) line_ += ',';
    append_string(info.metadata[i], "metadata line");
  }
  line_ += "]}\n";
  sink_->put(line_);
}

void JsonlWriter::on_label(std::uint32_t /*id*/, std::string_view text) {
  // Labels are written inline with each event; check now that they can be.
  if (!valid_utf8(text)) {
    throw Error(fmt::format("cannot write trace '{}' as JSON lines: a label is not valid UTF-8 "
                            "(use the binary format for arbitrary bytes)", path_));
  }
}

void JsonlWriter::on_event(const TraceEvent& e) {
  line_.clear();
  auto out = std::back_inserter(line_);
  fmt::format_to(out, "{{\"op\":\"{}\",\"device\":{},\"stream\":{},\"addr\":\"{:#x}\",\"size\":{},\"time_us\":{}",
                 to_string(e.op), e.device, e.stream, e.addr, e.size, e.time_us);
  if (e.flags != 0) fmt::format_to(out, ",\"flags\":{}", e.flags);
  if (e.label != 0) {
    line_ += ",\"label\":";
    append_json_string(line_, labels_[e.label]);  // checked by on_label
  }
  line_ += "}\n";
  sink_->put(line_);
}

void JsonlWriter::on_finish() {
  sink_->put(fmt::format("{{\"end\":true,\"events\":{}}}\n", events_written_));
}

}  // namespace

std::unique_ptr<TraceReader> open_jsonl_reader(std::unique_ptr<FileSource> source) {
  return std::make_unique<JsonlReader>(std::move(source));
}

std::unique_ptr<TraceWriter> open_jsonl_writer(std::unique_ptr<FileSink> sink, const TraceInfo& info) {
  return std::make_unique<JsonlWriter>(std::move(sink), info);
}

}  // namespace tensorpool::trace::detail

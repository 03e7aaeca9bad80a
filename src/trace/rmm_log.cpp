// Reads the CSV logs of RMM's logging_resource_adaptor and converts them to tensorpool traces.
// The accepted format and the conversion rules are documented in tensorpool/trace/rmm_log.hpp.
#include "tensorpool/trace/rmm_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <unordered_set>

namespace tensorpool::trace::rmm {

LogError::LogError(std::string source, std::size_t line, std::size_t column, std::string field,
                   std::string reason)
    : Error(field.empty() ? fmt::format("{}:{}:{}: {}", source, line, column, reason)
                          : fmt::format("{}:{}:{}: {}: {}", source, line, column, field, reason)),
      source_(std::move(source)),
      line_(line),
      column_(column),
      field_(std::move(field)),
      reason_(std::move(reason)) {}

const char* to_string(Action action) noexcept {
  switch (action) {
    case Action::allocate: return "allocate";
    case Action::free: return "free";
    case Action::allocate_failure: return "allocate failure";
  }
  return "unknown";
}

namespace {

constexpr std::array<std::string_view, 6> kColumns = {"Thread",  "Time", "Action",
                                                      "Pointer", "Size", "Stream"};
constexpr std::int64_t kSecondUs = 1'000'000;
constexpr std::int64_t kDayUs = 86'400 * kSecondUs;
constexpr std::string_view kHeader = "Thread,Time,Action,Pointer,Size,Stream";
constexpr std::string_view kBom = "\xEF\xBB\xBF";

struct Field {
  std::string_view text;  // trimmed
  std::size_t column;     // 1-based column of the field's first character
};

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Parses all of `s` as an unsigned number in `base`; false on anything else or overflow.
bool parse_unsigned(std::string_view s, int base, std::uint64_t& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && end == s.data() + s.size();
}

class LogParser {
 public:
  explicit LogParser(std::string_view source) : source_(source) {}

  std::vector<LogEntry> run(std::string_view text) {
    std::vector<LogEntry> entries;
    bool seen_header = false;
    std::size_t start = 0;
    line_ = 0;
    while (start < text.size()) {
      const std::size_t nl = text.find('\n', start);
      std::string_view line =
          text.substr(start, nl == std::string_view::npos ? text.size() - start : nl - start);
      start = nl == std::string_view::npos ? text.size() : nl + 1;
      ++line_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line_ == 1 && line.starts_with(kBom)) line.remove_prefix(kBom.size());
      if (trim(line).empty()) continue;  // blank lines, the trailing newline
      if (!seen_header) {
        check_header(line);
        seen_header = true;
        continue;
      }
      entries.push_back(entry(split(line)));
    }
    if (!seen_header)
      fail(line_ == 0 ? 1 : line_, 1, "",
           fmt::format("empty log: expected the header '{}'", header_text()));
    return entries;
  }

 private:
  static std::string_view header_text() { return kHeader; }

  [[noreturn]] void fail(std::size_t line, std::size_t column, std::string_view field,
                         std::string reason) const {
    throw LogError(std::string(source_), line, column, std::string(field), std::move(reason));
  }
  [[noreturn]] void fail(const Field& f, std::size_t index, std::string_view expected) const {
    fail(line_, f.column, kColumns[index], fmt::format("expected {}, got '{}'", expected, f.text));
  }

  std::vector<Field> split(std::string_view line) const {
    std::vector<Field> fields;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = line.find(',', start);
      const std::string_view raw =
          line.substr(start, comma == std::string_view::npos ? line.size() - start : comma - start);
      const std::string_view text = trim(raw);
      const std::size_t lead =
          text.empty() ? 0 : static_cast<std::size_t>(text.data() - raw.data());
      fields.push_back(Field{text, start + lead + 1});
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (fields.size() != kColumns.size()) {
      fail(line_, 1, "",
           fmt::format("expected {} comma-separated fields ({}), got {}", kColumns.size(),
                       header_text(), fields.size()));
    }
    return fields;
  }

  void check_header(std::string_view line) const {
    std::vector<std::string_view> names;
    std::size_t start = 0;
    for (std::size_t comma; (comma = line.find(',', start)) != std::string_view::npos;
         start = comma + 1) {
      names.push_back(trim(line.substr(start, comma - start)));
    }
    names.push_back(trim(line.substr(start)));
    if (!std::equal(names.begin(), names.end(), kColumns.begin(), kColumns.end())) {
      fail(line_, 1, "", fmt::format("expected the header '{}', got '{}'", header_text(), line));
    }
  }

  LogEntry entry(const std::vector<Field>& f) {
    LogEntry e;
    e.line = line_;
    e.thread = thread(f[0]);
    e.time_us = time(f[1]);
    e.action = action(f[2]);
    e.pointer = hex(f[3], 3, "a pointer such as 0x7f8a40000000 or (nil)");
    if (!parse_unsigned(f[4].text, 10, e.size)) fail(f[4], 4, "a decimal byte count");
    e.stream = hex(f[5], 5, "a hexadecimal stream such as 0 or 0x55d0c3a1e2f0");
    return e;
  }

  std::uint64_t thread(const Field& f) const {
    std::uint64_t v = 0;
    const bool hex_form = f.text.starts_with("0x") || f.text.starts_with("0X");
    const bool ok =
        hex_form ? parse_unsigned(f.text.substr(2), 16, v) : parse_unsigned(f.text, 10, v);
    if (!ok) fail(f, 0, "a decimal thread id");
    return v;
  }

  // %p prints "(nil)" for a null pointer on glibc; streams print as bare hex digits.
  std::uint64_t hex(const Field& f, std::size_t index, std::string_view expected) const {
    if (f.text == "(nil)") return 0;
    std::string_view digits = f.text;
    if (digits.starts_with("0x") || digits.starts_with("0X")) digits.remove_prefix(2);
    std::uint64_t v = 0;
    if (!parse_unsigned(digits, 16, v)) fail(f, index, expected);
    return v;
  }

  Action action(const Field& f) const {
    if (f.text == "allocate") return Action::allocate;
    if (f.text == "free" || f.text == "deallocate") return Action::free;
    if (f.text == "allocate failure" || f.text == "allocate_failure")
      return Action::allocate_failure;
    fail(f, 2, "allocate, free or allocate failure");
  }

  // "HH:MM:SS.ffffff" / "HH:MM:SS:ffffff" (clock time, rolled over at midnight) or
  // "SECONDS.ffffff" (since the epoch).
  std::int64_t time(const Field& f) {
    const std::string_view t = f.text;
    std::int64_t us = 0;
    if (t.find(':') == std::string_view::npos) {
      if (!epoch_time(t, us)) fail(f, 1, "a time such as 18:19:50.427419");
      return us;
    }
    if (!clock_time(t, us)) fail(f, 1, "a time such as 18:19:50.427419");
    // A jump back by more than half a day is the clock passing midnight, not thread jitter.
    if (last_clock_ >= 0 && us + kDayUs / 2 < last_clock_) day_offset_ += kDayUs;
    last_clock_ = us;
    return us + day_offset_;
  }

  // Up to 9 fraction digits, kept to microseconds.
  static bool fraction_us(std::string_view digits, std::int64_t& us) {
    if (digits.empty()) return true;
    if (!all_digits(digits) || digits.size() > 9) return false;
    std::string padded(digits.substr(0, std::min<std::size_t>(digits.size(), 6)));
    padded.resize(6, '0');
    std::uint64_t v = 0;
    parse_unsigned(padded, 10, v);
    us = static_cast<std::int64_t>(v);
    return true;
  }

  static bool clock_time(std::string_view t, std::int64_t& out) {
    std::array<std::uint64_t, 3> hms{};
    for (std::size_t i = 0; i < 3; ++i) {
      std::size_t len = 0;
      while (len < t.size() && len < 3 && t[len] >= '0' && t[len] <= '9') ++len;
      if (len == 0 || len > 2 || !parse_unsigned(t.substr(0, len), 10, hms[i])) return false;
      t.remove_prefix(len);
      if (i < 2) {
        if (t.empty() || t.front() != ':') return false;
        t.remove_prefix(1);
      }
    }
    if (hms[0] > 23 || hms[1] > 59 || hms[2] > 60) return false;
    std::int64_t frac = 0;
    if (!t.empty()) {
      if (t.front() != '.' && t.front() != ':') return false;
      if (!fraction_us(t.substr(1), frac) || t.size() == 1) return false;
    }
    const auto seconds = static_cast<std::int64_t>(hms[0] * 3600 + hms[1] * 60 + hms[2]);
    out = seconds * kSecondUs + frac;
    return true;
  }

  static bool epoch_time(std::string_view t, std::int64_t& out) {
    const std::size_t dot = t.find('.');
    const std::string_view whole = t.substr(0, dot);
    std::uint64_t seconds = 0;
    // 10^12 seconds (~31700 years) keeps the microseconds within int64.
    if (!all_digits(whole) || !parse_unsigned(whole, 10, seconds) || seconds > 1'000'000'000'000ULL)
      return false;
    std::int64_t frac = 0;
    if (dot != std::string_view::npos &&
        (dot + 1 == t.size() || !fraction_us(t.substr(dot + 1), frac)))
      return false;
    out = static_cast<std::int64_t>(seconds) * kSecondUs + frac;
    return true;
  }

  std::string_view source_;
  std::size_t line_ = 0;
  std::int64_t last_clock_ = -1;
  std::int64_t day_offset_ = 0;
};

TraceEvent make_event(Op op, const LogEntry& e, std::uint16_t device, std::int64_t time) {
  return {.op = op, .device = device, .stream = e.stream, .addr = op == Op::oom ? 0 : e.pointer, .size = e.size, .time_us = time};
}

// Pointers the log frees before allocating were live when it began.
std::vector<TraceEvent> seed_events(const std::vector<LogEntry>& entries, std::uint16_t device) {
  std::map<std::uint64_t, TraceEvent> seeds;
  std::unordered_set<std::uint64_t> touched;
  const std::int64_t start = entries.empty() ? 0 : entries.front().time_us;
  for (const LogEntry& e : entries) {
    if (e.action == Action::allocate_failure) continue;
    if (touched.insert(e.pointer).second && e.action == Action::free) {
      seeds.emplace(e.pointer, make_event(Op::seed_alloc, e, device, start));
    }
  }
  std::vector<TraceEvent> out;
  out.reserve(seeds.size());
  for (const auto& [ptr, ev] : seeds) out.push_back(ev);
  return out;
}

}  // namespace

std::vector<LogEntry> parse_log(std::string_view text, std::string_view source) {
  return LogParser(source).run(text);
}

std::vector<LogEntry> load_log(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open: {}", file.string(), std::strerror(errno)));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("{}: read failed", file.string()));
  return parse_log(text, file.string());
}

Trace to_trace(const std::vector<LogEntry>& entries, std::string_view name,
               const ConvertOptions& options) {
  Trace trace;
  trace.info.source = fmt::format("rmm-log:{}", name);
  std::unordered_set<std::uint64_t> threads;
  for (const LogEntry& e : entries) threads.insert(e.thread);
  trace.info.metadata.push_back(fmt::format("threads={}", threads.size()));
  trace.events = seed_events(entries, options.device);
  std::int64_t time = trace.events.empty() ? 0 : trace.events.front().time_us;
  for (const LogEntry& e : entries) {
    time = std::max(time, e.time_us);  // non-decreasing despite thread interleaving
    switch (e.action) {
      case Action::allocate:
        trace.events.push_back(make_event(Op::alloc, e, options.device, time));
        break;
      case Action::free:
        trace.events.push_back(make_event(Op::free_requested, e, options.device, time));
        trace.events.push_back(make_event(Op::free_completed, e, options.device, time));
        break;
      case Action::allocate_failure:
        trace.events.push_back(make_event(Op::oom, e, options.device, time));
        break;
    }
  }
  return trace;
}

Trace import_log(const std::filesystem::path& file, const ConvertOptions& options) {
  return to_trace(load_log(file), file.filename().string(), options);
}

}  // namespace tensorpool::trace::rmm

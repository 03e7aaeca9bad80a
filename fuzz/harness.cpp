// fuzz/harness.cpp: the bodies of the fuzz targets (see harness.hpp). Each catches exactly the
// error type its reader documents for bad input; every other exception escapes on purpose.
#include "harness.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/config.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/pickle.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"
#include "tensorpool/trace/rmm_log.hpp"

namespace tensorpool::fuzz {

namespace {

[[noreturn]] void violated(const std::string& what) { throw PropertyViolation(what); }

std::string bytes_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// --- pickle -----------------------------------------------------------------------------------

namespace pk = trace::pickle;

// Every accessor that applies to v's kind must work and agree with size(); the others must throw
// ParseError (which the caller lets through as "refused").
void check_scalar(const pk::Value& v) {
  switch (v.kind()) {
    case pk::Kind::boolean: (void)v.as_bool(); break;
    case pk::Kind::integer: {
      bool fits = false;
      try {
        (void)v.as_int();
        fits = true;
      } catch (const pk::ParseError&) {
      }
      try {
        (void)v.as_uint();
        fits = true;
      } catch (const pk::ParseError&) {
      }
      if (!fits) violated("an int that is neither int64 nor uint64 at " + v.path());
      (void)v.as_float();
      break;
    }
    case pk::Kind::floating: (void)v.as_float(); break;
    case pk::Kind::string:
      if (v.as_string().size() != v.size()) violated("str size disagrees at " + v.path());
      break;
    case pk::Kind::bytes:
      if (v.as_bytes().size() != v.size()) violated("bytes size disagrees at " + v.path());
      break;
    default: break;
  }
}

// Pushes v's children; a DAG of shared memo references can be exponentially large as a tree,
// so the caller bounds the number of visits.
void expand(const pk::Value& v, std::vector<pk::Value>& todo) {
  if (v.is(pk::Kind::list) || v.is(pk::Kind::tuple)) {
    const auto range = v.elements();
    if (range.size() != v.size()) violated("element count disagrees at " + v.path());
    for (const pk::Value& e : range) todo.push_back(e);
  } else if (v.is(pk::Kind::dict)) {
    const auto range = v.items();
    if (range.size() != v.size()) violated("item count disagrees at " + v.path());
    for (const auto& [k, value] : range) {
      if (k.is(pk::Kind::string) && !v.find(k.as_string()).has_value())
        violated("dict key not found by find() at " + v.path());
      todo.push_back(k);
      todo.push_back(value);
    }
  }
}

void walk(const pk::Value& root) {
  std::vector<pk::Value> todo{root};
  for (int visits = 0; !todo.empty() && visits < (1 << 14); ++visits) {
    const pk::Value v = todo.back();
    todo.pop_back();
    (void)v.type_name();
    if ((visits & 63) == 0) (void)v.path();
    check_scalar(v);
    expand(v, todo);
  }
}

// --- native traces ------------------------------------------------------------------------------

// The fuzz input as a file the reader can open by path: a memfd, rewritten for each input.
std::string memfd_path(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("tensorpool-fuzz", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  return "/proc/self/fd/" + std::to_string(fd);
}

struct ReadTrace {
  trace::TraceInfo info;
  std::vector<trace::TraceEvent> events;  // label ids replaced by 0
  std::vector<std::string> labels;   // the label text of each event
};

constexpr std::size_t kMaxEvents = 1 << 14;

// Reads a whole trace (at most kMaxEvents events, enough for any fuzz input).
ReadTrace read_all(const std::string& path) {
  auto reader = trace::TraceReader::open(path);
  ReadTrace out;
  trace::TraceEvent e;
  while (out.events.size() < kMaxEvents && reader->next(e)) {
    out.labels.push_back(reader->label(e.label));
    e.label = 0;
    out.events.push_back(e);
  }
  out.info = reader->info();
  return out;
}

std::string temp_path(trace::Format format) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/tensorpool-fuzz-" + std::to_string(getpid()) +
         (format == trace::Format::binary ? ".tptrace" : ".jsonl");
}

/// Reads `path` in `options`' mode, keeping the events read before an error (rethrown).
struct PartialRead {
  ReadTrace trace;
  std::optional<trace::Truncation> truncation;
  bool failed = false;  // the reader threw TraceFormatError (after trace.events)
};

PartialRead read_until_error(const std::string& path, const trace::ReadOptions& options) {
  PartialRead out;
  auto reader = trace::TraceReader::open(path, options);
  out.trace.info = reader->info();
  trace::TraceEvent e;
  try {
    while (out.trace.events.size() < kMaxEvents && reader->next(e)) {
      out.trace.labels.push_back(reader->label(e.label));
      e.label = 0;
      out.trace.events.push_back(e);
    }
  } catch (const trace::TraceFormatError&) {
    out.failed = true;
  }
  out.truncation = reader->truncation();
  return out;
}

// Writes `t` in `format` and reads it back: the same info, events and label texts. A writer may
// refuse what a reader accepted (tensorpool::Error: a limit of that format): not a violation.
void round_trip(const ReadTrace& t, trace::Format format) {
  const std::string path = temp_path(format);
  try {
    auto writer = trace::TraceWriter::open(path, format, t.info);
    for (std::size_t i = 0; i < t.events.size(); ++i) writer->write(t.events[i], t.labels[i]);
    writer->finish();
  } catch (const Error&) {
    return;
  }
  const ReadTrace back = read_all(path);
  std::remove(path.c_str());
  if (back.info.source != t.info.source || back.info.metadata != t.info.metadata)
    violated(std::string("trace info changed in a ") + trace::to_string(format) + " round trip");
  if (back.events != t.events || back.labels != t.labels)
    violated(std::string("events changed in a ") + trace::to_string(format) + " round trip");
}

}  // namespace

int pickle_one(const std::uint8_t* data, std::size_t size) {
  try {
    const auto doc = pk::Document::parse(bytes_of(data, size), "fuzz");
    walk(doc.root());
  } catch (const pk::ParseError&) {
  }
  return 0;
}

int pytorch_snapshot_one(const std::uint8_t* data, std::size_t size) {
  try {
    const auto doc = pk::Document::parse(bytes_of(data, size), "fuzz");
    for (const auto frame : {trace::pytorch::FrameChoice::first_python, trace::pytorch::FrameChoice::none}) {
      const auto snapshot = trace::pytorch::read_snapshot(doc.root(), {frame});
      (void)trace::pytorch::to_trace(snapshot, "fuzz");
    }
  } catch (const pk::ParseError&) {
  }
  return 0;
}

int trace_one(const std::uint8_t* data, std::size_t size) {
  ReadTrace t;
  try {
    t = read_all(memfd_path(data, size));
  } catch (const Error&) {  // TraceFormatError, or an I/O Error
    return 0;
  }
  round_trip(t, trace::Format::binary);
  round_trip(t, trace::Format::jsonl);
  return 0;
}

int recording_one(const std::uint8_t* data, std::size_t size) {
  const std::string path = memfd_path(data, size);
  PartialRead tolerant;
  try {
    tolerant = read_until_error(path, trace::ReadOptions{.allow_truncated = true});
  } catch (const Error&) {  // refused at open (the header): the strict reader refuses it too
    try {
      (void)read_all(path);
    } catch (const Error&) {
      return 0;
    }
    violated("the tolerant reader refused a header the strict reader accepts");
  }
  const PartialRead strict = read_until_error(path, trace::ReadOptions{});
  if (tolerant.trace.events.size() == kMaxEvents) return 0;  // not read to the end
  if (strict.trace.events != tolerant.trace.events || strict.trace.labels != tolerant.trace.labels)
    violated("the tolerant and the strict reader disagree on the events before the end");
  if (tolerant.failed) {
    if (!strict.failed) violated("the tolerant reader refused a file the strict reader accepts");
    return 0;  // an error that is not a cut: refused in both modes
  }
  if (tolerant.truncation.has_value() != strict.failed)
    violated("a cut is reported exactly where the strict reader fails");
  if (const auto& cut = tolerant.truncation) {
    if (cut->events != tolerant.trace.events.size() || cut->file_bytes != size ||
        cut->verified_events > cut->events || cut->verified_bytes > size || cut->problem.empty())
      violated("inconsistent Truncation report");
  }
  round_trip(tolerant.trace, trace::Format::binary);  // the salvaged events
  return 0;
}

int rmm_log_one(const std::uint8_t* data, std::size_t size) {
  std::vector<trace::rmm::LogEntry> entries;
  try {
    entries = trace::rmm::parse_log(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const trace::rmm::LogError&) {
    return 0;
  }
  (void)trace::rmm::to_trace(entries, "fuzz");
  return 0;
}

int config_one(const std::uint8_t* data, std::size_t size) {
  Config c;
  try {
    c = Config::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string text = c.to_string();
  try {
    if (Config::parse(text, "round trip").to_string() != text) violated("config changed in a round trip: " + text);
  } catch (const ConfigError& e) {
    violated(std::string("to_string() of an accepted config does not parse: ") + e.what());
  }
  return 0;
}

Harness harness(const std::string& name) {
  if (name == "pickle") return pickle_one;
  if (name == "pytorch_snapshot") return pytorch_snapshot_one;
  if (name == "trace") return trace_one;
  if (name == "recording") return recording_one;
  if (name == "rmm_log") return rmm_log_one;
  if (name == "config") return config_one;
  return nullptr;
}

}  // namespace tensorpool::fuzz

// fuzz/harness.cpp: the bodies of the fuzz targets (see harness.hpp). Each catches exactly the
// error type its reader documents for bad input; every other exception escapes on purpose.
#include "harness.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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
  if (name == "rmm_log") return rmm_log_one;
  if (name == "config") return config_one;
  return nullptr;
}

}  // namespace tensorpool::fuzz

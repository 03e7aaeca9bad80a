// load.cpp: choose the reader of a trace file from its first bytes, on the one open of the file
// that the reader then consumes.
#include "tensorpool/trace/load.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "tensorpool/errors.hpp"
#include "tensorpool/trace/pickle.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"
#include "tensorpool/trace/rmm_log.hpp"
#include "trace/format_io.hpp"

namespace tensorpool::trace {

namespace {

// The kind of the file whose first chunk `source` holds (nothing consumed).
SourceKind detect(const std::string& path, detail::FileSource& source) {
  source.refill();
  const std::size_t n = std::min<std::size_t>(source.available(), 16);
  const std::string start(reinterpret_cast<const char*>(source.data()), n);
  if (n == 0) throw Error(path + ": the file is empty; expected a trace");
  if (static_cast<unsigned char>(start[0]) == 0x80) return SourceKind::pytorch_snapshot;
  if (start[0] == '{') return SourceKind::native_jsonl;
  if (start.rfind("Thread", 0) == 0 || start.rfind("\xEF\xBB\xBFThread", 0) == 0) return SourceKind::rmm_log;
  // Four bytes of the magic are enough to hand the file to the binary reader, whose errors say
  // exactly where a damaged file goes wrong.
  if (n >= 4 && std::memcmp(start.data(), detail::kBinaryMagic, 4) == 0) return SourceKind::native_binary;
  throw Error(path + ": offset 0: not a trace: expected a PyTorch snapshot pickle (byte 0x80), an "
                     "RMM log (a 'Thread,Time,Action,...' header), or a tensorpool trace");
}

// Every byte `source` has left, refusing more than `limit` (a pickle's input limit: a hostile
// file is not read whole before it is refused).
std::string rest_of(detail::FileSource& source, std::uint64_t limit) {
  std::string out;
  while (source.has_more()) {
    if (out.size() + source.available() > limit)
      throw pickle::ParseError::at_offset(source.path(), 0,
                                          fmt::format("file of more than {} bytes exceeds the limit", limit));
    out.append(reinterpret_cast<const char*>(source.data()), source.available());
    source.advance(source.available());
  }
  return out;
}

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

struct OpenTrace {
  std::unique_ptr<detail::FileSource> source;
  SourceKind kind;
};

OpenTrace open(const std::string& path) {
  auto source = std::make_unique<detail::FileSource>(path);
  const SourceKind kind = detect(path, *source);
  return {std::move(source), kind};
}

// The whole of a foreign (not native) trace, converted.
Trace import(OpenTrace& t, const std::string& path) {
  if (t.kind == SourceKind::pytorch_snapshot) {
    const std::uint64_t limit = pickle::Limits{}.max_input_bytes;
    const pickle::Document doc = pickle::Document::parse(rest_of(*t.source, limit), path);
    return pytorch::to_trace(pytorch::read_snapshot(doc.root()), file_name(path));
  }
  const std::string text = rest_of(*t.source, std::numeric_limits<std::uint64_t>::max());
  return rmm::to_trace(rmm::parse_log(text, path), file_name(path));
}

bool is_native(SourceKind kind) {
  return kind == SourceKind::native_binary || kind == SourceKind::native_jsonl;
}

}  // namespace

const char* to_string(SourceKind kind) noexcept {
  switch (kind) {
    case SourceKind::native_binary: return "tensorpool trace (binary)";
    case SourceKind::native_jsonl: return "tensorpool trace (JSON lines)";
    case SourceKind::pytorch_snapshot: return "PyTorch memory snapshot";
    case SourceKind::rmm_log: return "RMM log";
  }
  return "unknown";
}

SourceKind detect_source(const std::string& path) { return open(path).kind; }

LoadedTrace load(const std::string& path) {
  OpenTrace t = open(path);
  if (is_native(t.kind)) return {t.kind, detail::read_all(*detail::open_reader(std::move(t.source)))};
  return {t.kind, import(t, path)};
}

Trace load_trace(const std::string& path) { return load(path).trace; }

SourceKind convert_to_native(const std::string& in, const std::string& out, Format format) {
  return convert_to_native(in, out, format, ReadOptions{}).kind;
}

Conversion convert_to_native(const std::string& in, const std::string& out, Format format,
                             const ReadOptions& options) {
  OpenTrace t = open(in);
  Conversion result{.kind = t.kind, .truncation = std::nullopt};
  if (is_native(t.kind)) {
    result.truncation = detail::copy_trace(*detail::open_reader(std::move(t.source), options), out, format);
  } else if (options.allow_truncated) {
    throw UsageError(fmt::format("{}: allow_truncated (--allow-truncated) applies to tensorpool traces "
                                 "(.tptrace or .jsonl), not to a {}", in, to_string(t.kind)));
  } else {
    write_trace(out, import(t, in), format);
  }
  return result;
}

}  // namespace tensorpool::trace

// load.cpp: choose the reader of a trace file from its first bytes.
#include "tensorpool/trace/load.hpp"

#include <cstring>
#include <fstream>

#include "tensorpool/errors.hpp"
#include "trace/format_io.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"
#include "tensorpool/trace/rmm_log.hpp"

namespace tensorpool::trace {

const char* to_string(SourceKind kind) noexcept {
  switch (kind) {
    case SourceKind::native_binary: return "tensorpool trace (binary)";
    case SourceKind::native_jsonl: return "tensorpool trace (JSON lines)";
    case SourceKind::pytorch_snapshot: return "PyTorch memory snapshot";
    case SourceKind::rmm_log: return "RMM log";
  }
  return "unknown";
}

SourceKind detect_source(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the file");
  char head[16] = {};
  in.read(head, sizeof head);
  const auto n = static_cast<std::size_t>(in.gcount());
  const std::string start(head, n);
  if (n == 0) throw Error(path + ": the file is empty; expected a trace");
  if (static_cast<unsigned char>(head[0]) == 0x80) return SourceKind::pytorch_snapshot;
  if (start[0] == '{') return SourceKind::native_jsonl;
  if (start.rfind("Thread", 0) == 0 || start.rfind("\xEF\xBB\xBFThread", 0) == 0) return SourceKind::rmm_log;
  // Four bytes of the magic are enough to hand the file to the binary reader, whose errors say
  // exactly where a damaged file goes wrong.
  if (n >= 4 && std::memcmp(head, detail::kBinaryMagic, 4) == 0) return SourceKind::native_binary;
  throw Error(path + ": offset 0: not a trace: expected a PyTorch snapshot pickle (byte 0x80), an "
                     "RMM log (a 'Thread,Time,Action,...' header), or a tensorpool trace");
}

Trace load_trace(const std::string& path) {
  switch (detect_source(path)) {
    case SourceKind::pytorch_snapshot: return pytorch::import_snapshot(path);
    case SourceKind::rmm_log: return rmm::import_log(path);
    case SourceKind::native_binary:
    case SourceKind::native_jsonl: return read_trace(path);
  }
  throw Error(path + ": unknown trace kind");
}

}  // namespace tensorpool::trace

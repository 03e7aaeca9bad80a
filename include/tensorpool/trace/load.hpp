// tensorpool/trace/load.hpp: open any trace the tools understand, whatever its format. Each
// function opens its file once: the kind is read from the first bytes of the same open file the
// reader then consumes.
#pragma once

#include <optional>
#include <string>

#include "tensorpool/trace/event.hpp"
#include "tensorpool/trace/format.hpp"

namespace tensorpool::trace {

enum class SourceKind : std::uint8_t { native_binary, native_jsonl, pytorch_snapshot, rmm_log };
const char* to_string(SourceKind kind) noexcept;

/// Tells the kind of trace file from its first bytes (not its name). Throws tensorpool::Error if
/// the file cannot be read or is of no known kind (the message names the file and what it found).
SourceKind detect_source(const std::string& path);

struct LoadedTrace {
  SourceKind kind = SourceKind::native_binary;
  Trace trace;
};

/// Reads a whole trace: a native trace (.tptrace/.jsonl), a PyTorch memory snapshot pickle or an
/// RMM log CSV, and says which it was. Errors are detect_source()'s and the readers' (they name
/// the file and the offset or line).
LoadedTrace load(const std::string& path);
/// load(path).trace.
Trace load_trace(const std::string& path);

/// Writes the trace in `in`, of any kind, to `out` in `format` (atomically, see TraceWriter):
/// native inputs are streamed (memory independent of their length), the others imported whole.
/// Returns the kind of `in`.
SourceKind convert_to_native(const std::string& in, const std::string& out, Format format);

struct Conversion {
  SourceKind kind = SourceKind::native_binary;
  std::optional<Truncation> truncation;  // where a native input was cut (allow_truncated only)
};
/// The same with `options`: with allow_truncated, a native trace that ends early (a killed live
/// recording) is converted up to its cut into a complete file. Throws UsageError for
/// allow_truncated on a PyTorch snapshot or an RMM log (the option is the native readers').
Conversion convert_to_native(const std::string& in, const std::string& out, Format format,
                             const ReadOptions& options);

}  // namespace tensorpool::trace

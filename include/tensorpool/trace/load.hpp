// tensorpool/trace/load.hpp: open any trace the tools understand, whatever its format.
#pragma once

#include <string>

#include "tensorpool/trace/event.hpp"

namespace tensorpool::trace {

enum class SourceKind : std::uint8_t { native_binary, native_jsonl, pytorch_snapshot, rmm_log };
const char* to_string(SourceKind kind) noexcept;

/// Tells the kind of trace file from its first bytes (not its name). Throws tensorpool::Error if
/// the file cannot be read or is of no known kind (the message names the file and what it found).
SourceKind detect_source(const std::string& path);

/// Reads a whole trace: a native trace (.tptrace/.jsonl), a PyTorch memory snapshot pickle or an
/// RMM log CSV. Errors name the file and the offset or line.
Trace load_trace(const std::string& path);

}  // namespace tensorpool::trace

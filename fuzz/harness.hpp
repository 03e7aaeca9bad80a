// fuzz/harness.hpp: the bodies of the libFuzzer targets, one per reader of untrusted input.
//
// Each takes arbitrary bytes and must return normally: the reader either accepts them or throws
// its documented error type, which the harness catches. Anything else escapes: another exception
// type, or a PropertyViolation when an accepted input breaks a property the harness checks (a
// round trip that changes the data, an accessor that contradicts the value's kind). libFuzzer
// reports an escaping exception as a crash (std::terminate), and ASan/UBSan report memory and
// undefined-behaviour errors. The same functions replay the checked-in corpora and every crash
// regression in the normal test suite (tests/reliability/test_fuzz_corpus.cpp), with gcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tensorpool::fuzz {

/// An accepted input broke a property the harness checks.
class PropertyViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// pickle::Document::parse, then a bounded walk through every value with every accessor.
int pickle_one(const std::uint8_t* data, std::size_t size);
/// pickle::Document::parse, then pytorch::read_snapshot and pytorch::to_trace.
int pytorch_snapshot_one(const std::uint8_t* data, std::size_t size);
/// TraceReader::open (binary or JSON lines, by the first bytes) and every event; an accepted
/// trace must write (both formats) and read back unchanged.
int trace_one(const std::uint8_t* data, std::size_t size);
/// A recorded trace, maybe cut or corrupted, read with ReadOptions::allow_truncated: it must
/// agree with the strict reader (the same events; a cut exactly where the strict reader fails),
/// report a consistent Truncation, and the salvaged events must write and read back unchanged.
int recording_one(const std::uint8_t* data, std::size_t size);
/// rmm::parse_log, then rmm::to_trace.
int rmm_log_one(const std::uint8_t* data, std::size_t size);
/// Config::parse; an accepted config must survive to_string() and parse again unchanged.
int config_one(const std::uint8_t* data, std::size_t size);

/// The targets by name ("pickle", "pytorch_snapshot", "trace", "recording", "rmm_log",
/// "config"); nullptr
/// for an unknown name.
using Harness = int (*)(const std::uint8_t*, std::size_t);
Harness harness(const std::string& name);

}  // namespace tensorpool::fuzz

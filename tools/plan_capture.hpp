// plan_capture.hpp: `tensorpool plan --capture`: the traces plan searches, captured from the
// user's own training script at each candidate micro-batch (python -m tensorpool.capture,
// python/tensorpool/capture.py) instead of generated from a model preset.
#pragma once

#include <cstdint>
#include <string>

#include "tensorpool/replay/fit.hpp"

namespace tensorpool::cli {

/// The script and how to run it: `script` is the script and its arguments as a shell would take
/// them, with {micro_batch} where the micro-batch goes ("train.py --batch-size {micro_batch}").
struct CaptureCommand {
  std::string script;
  std::string python = "python3";  // an interpreter with torch and the tensorpool package
  unsigned steps = 2;              // optimizer steps captured (the first makes the optimizer's states)

  bool empty() const noexcept { return script.empty(); }
  /// The shell command that captures micro-batch `mb` into `out`.
  std::string command_for(std::uint64_t mb, const std::string& out) const;
};

/// Refuses a script without {micro_batch} (ConfigError).
void check_capture(const CaptureCommand& c);

/// The captured trace of each micro-batch, captured once (later calls share it) and one at a time
/// (a capture takes a core and the job's host memory); a capture that fails throws ConfigError with
/// the command, its exit status and the end of what it printed.
replay::TraceFamily capture_family(const CaptureCommand& c);

}  // namespace tensorpool::cli

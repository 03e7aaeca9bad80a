// workload_args.hpp: the options that describe a training or inference run (a model preset, the
// workload's key:value options and flags for the common ones), shared by `generate` and `plan`,
// and `generate` itself.
#pragma once

#include <string>

#include "tensorpool/workload/setup.hpp"

namespace tensorpool::cli {

struct WorkloadArgs {
  std::string model;    // a preset or "custom"
  std::string options;  // key:value,... of WorkloadSetup::keys()
  // Flags for common keys (empty: not given); each is applied after `options`.
  std::string micro_batch, global_batch, seq, precision, checkpointing, zero, dp, tp, pp, mode;

};

/// The setup the arguments describe, validated. Throws UsageError (unknown model, listing the
/// known ones) and ConfigError (a bad option, naming the flag or "--options", or an impossible
/// setup, naming the option).
workload::WorkloadSetup workload_setup(const WorkloadArgs& args);

/// Writes the trace of `setup` to `out` (.tptrace or .jsonl).
int cmd_generate_workload(const std::string& out, const workload::WorkloadSetup& setup);

}  // namespace tensorpool::cli

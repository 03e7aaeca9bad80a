// workload_args.cpp: turning --model, --options and the workload flags into a checked setup, and
// `generate --model`.
#include "workload_args.hpp"

#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/workload/model.hpp"

namespace tensorpool::cli {

namespace {

// Each flag, the key it sets and where its value is kept.
std::vector<std::tuple<const char*, const char*, std::string WorkloadArgs::*>> flags() {
  return {{"--mode", "mode", &WorkloadArgs::mode},
          {"--micro-batch", "micro_batch", &WorkloadArgs::micro_batch},
          {"--global-batch", "global_batch", &WorkloadArgs::global_batch},
          {"--seq", "seq", &WorkloadArgs::seq},
          {"--precision", "precision", &WorkloadArgs::precision},
          {"--checkpointing", "checkpointing", &WorkloadArgs::checkpointing},
          {"--zero", "zero", &WorkloadArgs::zero},
          {"--dp", "dp", &WorkloadArgs::dp},
          {"--tp", "tp", &WorkloadArgs::tp},
          {"--pp", "pp", &WorkloadArgs::pp}};
}

}  // namespace

workload::WorkloadSetup workload_setup(const WorkloadArgs& a) {
  workload::WorkloadSetup s = workload::WorkloadSetup::for_model(a.model.empty() ? "custom" : a.model);
  s.apply(a.options, "--options");
  for (const auto& [flag, key, field] : flags()) {
    const std::string& value = a.*field;
    if (value.empty()) continue;
    if (value.find(',') != std::string::npos)  // one value, not a list that would set other keys
      throw ConfigError(std::string(flag) + ": bad value '" + value + "': expected one value, no ','");
    s.apply(std::string(key) + ":" + value, flag);
  }
  s.validate();
  return s;
}

int cmd_generate_workload(const std::string& out, const workload::WorkloadSetup& setup) {
  const trace::Trace t = workload::generate_workload(setup);
  trace::write_trace(out, t, trace::format_from_extension(out));
  fmt::print(stderr, "wrote {}: {} events ({})\n", out, t.events.size(), setup.describe());
  return 0;
}

}  // namespace tensorpool::cli

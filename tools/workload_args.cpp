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

bool WorkloadArgs::given() const {
  if (!model.empty()) return true;
  for (const auto& [flag, key, field] : flags())
    if (!(this->*field).empty()) return true;
  return false;
}

void add_workload_flags(CLI::App* cmd, WorkloadArgs& a, bool for_generate) {
  cmd->add_option("--model", a.model,
                  "Model preset: " + join(workload::model_preset_names()) + ", or custom (shape by --options)");
  if (for_generate) {
    cmd->add_option("--mode", a.mode, "training or inference (option mode)");
    cmd->add_option("--micro-batch", a.micro_batch, "Sequences per micro-batch (option micro_batch)");
  }
  cmd->add_option("--global-batch", a.global_batch, "Sequences per optimizer step over all data-parallel ranks (option global_batch)");
  cmd->add_option("--seq", a.seq, "Sequence length (option seq; default: the model's context)");
  cmd->add_option("--precision", a.precision, "fp32, bf16 or fp16 (bf16/fp16: mixed precision with fp32 master weights)");
  cmd->add_option("--checkpointing", a.checkpointing, "Activation checkpointing: none, selective or full");
  cmd->add_option("--zero", a.zero, "ZeRO stage 0-3 over --dp ranks");
  cmd->add_option("--dp", a.dp, "Data-parallel degree");
  cmd->add_option("--tp", a.tp, "Tensor-parallel degree (divides heads, kv_heads, ffn)");
  cmd->add_option("--pp", a.pp, "Pipeline-parallel degree (divides layers; each stage a device of the trace)");
}

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
